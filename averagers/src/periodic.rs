//! Semantics §2 (the book): average over one group every `period` steps after a warmup.

use crate::averager::{ModelAverager, check_state_config};
use crate::error::AveragerError;
use crate::overlap::Overlap;
use crate::state::{AveragerConfig, AveragerState};
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
#[derive(Debug)]
pub struct PeriodicModelAverager {
    period: u64,
    warmup_steps: u64,
    group: Group,
    step: u64,
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
        Ok(Self {
            period,
            warmup_steps,
            group,
            step: 0,
            overlap: None,
        })
    }

    /// Overlap every average with the next `delay` iterations (see
    /// [`overlap`](crate::overlap)): start it at the averaging step, apply
    /// `x <- avg(x_t) + (x_{t+delay} - x_t)` `delay` steps later. `delay == 0` keeps blocking
    /// averaging; otherwise `1 <= delay <= period` ([`AveragerError::Overlap`] names the
    /// bounds). Not collective (the helper communicator is created at the first average).
    pub fn with_overlap(mut self, delay: u64) -> Result<Self, AveragerError> {
        if delay > self.period {
            return Err(AveragerError::Overlap(format!(
                "delay {delay} exceeds the averaging period {}: each average must be applied \
                 before the next starts (valid: 0 = blocking, or 1..={})",
                self.period, self.period
            )));
        }
        self.overlap = (delay > 0).then(|| Overlap::new(delay));
        Ok(self)
    }

    /// The averaging period.
    pub fn period(&self) -> u64 {
        self.period
    }

    /// Steps before the first averaging.
    pub fn warmup_steps(&self) -> u64 {
        self.warmup_steps
    }

    /// The group parameters are averaged in.
    pub fn group(&self) -> &Group {
        &self.group
    }

    fn config(&self) -> AveragerConfig {
        AveragerConfig::Periodic {
            period: self.period,
            warmup_steps: self.warmup_steps,
            overlap: self.overlap.as_ref().map_or(0, Overlap::delay),
        }
    }
}

impl ModelAverager for PeriodicModelAverager {
    fn step(&self) -> u64 {
        self.step
    }

    fn scheduled_group(&self) -> Option<Group> {
        (self.step >= self.warmup_steps
            && (self.step - self.warmup_steps).is_multiple_of(self.period))
        .then(|| self.group.clone())
    }

    fn advance(&mut self) {
        self.step += 1;
    }

    fn state(&self) -> AveragerState {
        AveragerState {
            step: self.step,
            config: self.config(),
        }
    }

    fn load_state(&mut self, state: &AveragerState) -> Result<(), AveragerError> {
        check_state_config(&self.config(), state)?;
        self.step = state.step;
        Ok(())
    }

    fn overlap(&self) -> Option<&Overlap> {
        self.overlap.as_ref()
    }

    fn overlap_mut(&mut self) -> Option<&mut Overlap> {
        self.overlap.as_mut()
    }
}
