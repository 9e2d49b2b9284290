//! Semantics §2 (the book): average over one group every `period` steps after a warmup.

use crate::error::AveragerError;
use crate::overlap::Overlap;
use crate::schedule::{Schedule, Scheduled};
use crate::state::AveragerConfig;
use localsgd_comm::Group;

/// Averages the parameters over `group` at steps `warmup_steps`, `warmup_steps + period`,
/// `warmup_steps + 2·period`, ... (PyTorch's `PeriodicModelAverager`).
///
/// The schedule is **relative to the warmup**: `Periodic(4, 13)` averages at steps 13, 17, 21, ...
/// (unlike [`HierarchicalModelAverager`](crate::HierarchicalModelAverager), whose levels count
/// absolute steps).
///
/// ```
/// use localsgd_averagers::{ModelAverager, PeriodicModelAverager};
/// use localsgd_comm::ThreadWorld;
///
/// let schedules = ThreadWorld::new(2)?.run(|world| {
///     let mut avg = PeriodicModelAverager::new(4, 13, world).unwrap();
///     let mut steps = Vec::new();
///     for _ in 0..20 {
///         if avg.scheduled_group().is_some() {
///             steps.push(avg.step());
///         }
///         avg.advance();
///     }
///     steps
/// })?;
/// assert_eq!(schedules[0], vec![13, 17]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type PeriodicModelAverager = Scheduled<Periodic>;

/// The schedule of a [`PeriodicModelAverager`]: one group, every `period` steps after
/// `warmup_steps`, optionally overlapped.
#[derive(Debug)]
pub struct Periodic {
    period: u64,
    warmup_steps: u64,
    group: Group,
    overlap: Option<Overlap>,
}

impl PeriodicModelAverager {
    /// An averager over `group` (usually the world) with step counter 0. Not collective.
    ///
    /// Checked in this order: `warmup_steps < 0` → [`AveragerError::NegativeWarmup`];
    /// `period == 0` → [`AveragerError::NonPositivePeriod`]. `period == 1` is allowed but logs a
    /// warning: averaging parameters every step costs at least as much as all-reducing gradients,
    /// so plain data parallelism is the better choice.
    pub fn new(period: u64, warmup_steps: i64, group: Group) -> Result<Self, AveragerError> {
        let warmup_steps =
            u64::try_from(warmup_steps).map_err(|_| AveragerError::NegativeWarmup(warmup_steps))?;
        if period == 0 {
            return Err(AveragerError::NonPositivePeriod(period));
        }
        if period == 1 {
            tracing::warn!(
                period,
                "a model averaging period of 1 averages the parameters after every step, which \
                 costs at least as much as all-reducing gradients: plain data parallelism (DDP) \
                 is the better choice"
            );
        }
        Ok(Scheduled::from_schedule(Periodic {
            period,
            warmup_steps,
            group,
            overlap: None,
        }))
    }

    /// Overlap every average with the next `delay` iterations (see
    /// [`overlap`](crate::overlap)): start it at the averaging step, apply
    /// `x <- avg(x_t) + (x_{t+delay} - x_t)` `delay` steps later. `delay == 0` keeps blocking
    /// averaging; otherwise `1 <= delay <= period` ([`AveragerError::Overlap`] names the
    /// bounds). Not collective (the helper communicator is created at the first average).
    pub fn with_overlap(mut self, delay: u64) -> Result<Self, AveragerError> {
        let period = self.schedule().period;
        if delay > period {
            return Err(AveragerError::Overlap(format!(
                "delay {delay} exceeds the averaging period {period}: each average must be \
                 applied before the next starts (valid: 0 = blocking, or 1..={period})"
            )));
        }
        self.schedule_mut().overlap = (delay > 0).then(|| Overlap::new(delay));
        Ok(self)
    }

    /// The averaging period.
    pub fn period(&self) -> u64 {
        self.schedule().period
    }

    /// Steps before the first averaging.
    pub fn warmup_steps(&self) -> u64 {
        self.schedule().warmup_steps
    }

    /// The group parameters are averaged in.
    pub fn group(&self) -> &Group {
        &self.schedule().group
    }
}

impl Schedule for Periodic {
    fn config(&self) -> AveragerConfig {
        AveragerConfig::Periodic {
            period: self.period,
            warmup_steps: self.warmup_steps,
            overlap: self.overlap.as_ref().map_or(0, Overlap::delay),
        }
    }

    fn group_at(&self, step: u64) -> Option<Group> {
        (step >= self.warmup_steps && (step - self.warmup_steps).is_multiple_of(self.period))
            .then(|| self.group.clone())
    }

    fn overlap(&self) -> Option<&Overlap> {
        self.overlap.as_ref()
    }

    fn overlap_mut(&mut self) -> Option<&mut Overlap> {
        self.overlap.as_mut()
    }
}
