//! SlowMo's two frequencies (fairscale's `SlowMoDistributedDataParallel`: `localsgd_frequency`
//! and `slowmo_frequency`) and the schedule they make (see
//! [`OuterAverager::slowmo`](super::OuterAverager::slowmo)).

use super::optimizer::OuterOptimizer;
use crate::error::AveragerError;
use crate::schedule::Schedule;
use crate::state::AveragerConfig;
use localsgd_comm::Group;
use serde::{Deserialize, Serialize};

/// The settings of SlowMo with fairscale's two frequencies (see
/// [`OuterAverager::slowmo`](super::OuterAverager::slowmo)): a plain average over the world every
/// `localsgd_frequency` local steps, a slow momentum step every `slowmo_frequency` local steps.
///
/// [`Default`] is fairscale's: `localsgd_frequency` 3, `slowmo_frequency` 48, `slowmo_lr` α = 1,
/// `slowmo_momentum` β = 0.5.
///
/// ```
/// use localsgd_averagers::{OuterOptimizer, SlowMoConfig};
///
/// let fairscale = SlowMoConfig::default();
/// assert_eq!((fairscale.localsgd_frequency, fairscale.slowmo_frequency), (3, 48));
/// assert_eq!(fairscale.optimizer(), OuterOptimizer::SlowMo { lr: 1.0, momentum: 0.5 });
/// // Any positive pair is accepted: fairscale only recommends a multiple.
/// assert!(SlowMoConfig::new(3, 4).with_lr(0.7).with_momentum(0.9).validate().is_ok());
/// let err = SlowMoConfig::new(0, 48).validate().unwrap_err().to_string();
/// assert!(err.contains("localsgd_frequency") && err.contains("got 0"), "{err}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SlowMoConfig {
    /// Average the parameters over the world after every `localsgd_frequency` local steps
    /// (fairscale's `localsgd_frequency`, default 3), `>= 1`.
    pub localsgd_frequency: u64,
    /// Take the slow momentum step after every `slowmo_frequency` local steps (fairscale's
    /// `slowmo_frequency`, default 48), `>= 1`. fairscale recommends a multiple of
    /// `localsgd_frequency`; any value works, since the slow step averages over the world first.
    pub slowmo_frequency: u64,
    /// α, the slow learning rate (fairscale's `slowmo_lr`, default 1), finite and `> 0`.
    pub lr: f64,
    /// β, the slow momentum (fairscale's `slowmo_momentum`, default 0.5), finite and `>= 0`.
    pub momentum: f64,
}

impl Default for SlowMoConfig {
    /// fairscale's defaults: frequencies 3 and 48, α = 1, β = 0.5.
    fn default() -> Self {
        Self::new(3, 48)
    }
}

impl SlowMoConfig {
    /// The two frequencies with fairscale's default slow optimizer (α = 1, β = 0.5).
    pub fn new(localsgd_frequency: u64, slowmo_frequency: u64) -> Self {
        Self {
            localsgd_frequency,
            slowmo_frequency,
            lr: 1.0,
            momentum: 0.5,
        }
    }

    /// The same settings with slow learning rate α = `lr`.
    pub fn with_lr(mut self, lr: f64) -> Self {
        self.lr = lr;
        self
    }

    /// The same settings with slow momentum β = `momentum`.
    pub fn with_momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }

    /// The slow step's optimizer, `OuterOptimizer::SlowMo { lr, momentum }`.
    pub fn optimizer(&self) -> OuterOptimizer {
        OuterOptimizer::SlowMo {
            lr: self.lr,
            momentum: self.momentum,
        }
    }

    /// Whether a slow step ever runs: fairscale's `slowmo_lr != 1 or slowmo_momentum != 0`.
    /// With `(α, β) = (1, 0)` it never does and the averager is plain averaging every
    /// `localsgd_frequency` steps.
    pub fn slow_steps_enabled(&self) -> bool {
        self.lr != 1.0 || self.momentum != 0.0
    }

    /// Check the settings: both frequencies `>= 1`, then the slow optimizer's rules
    /// ([`OuterOptimizer::validate`]). The error names the value and what is valid.
    pub fn validate(&self) -> Result<(), AveragerError> {
        for (name, value, default) in [
            ("localsgd_frequency", self.localsgd_frequency, 3),
            ("slowmo_frequency", self.slowmo_frequency, 48),
        ] {
            if value == 0 {
                return Err(AveragerError::Outer(format!(
                    "SlowMo's {name} must be at least 1 (got {value}); valid: any step count \
                     >= 1, fairscale's default is {default}"
                )));
            }
        }
        self.optimizer().validate()
    }
}

/// What a step of SlowMo's schedule does after its optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlowMoEvent {
    /// Nothing.
    Local,
    /// A plain average over the world (`θ` and the slow momentum untouched).
    Average,
    /// The slow step on the world's average (or, with the slow step disabled, the average
    /// alone, `θ` following it).
    Sync,
}

/// fairscale's `perform_slowmo` order after a warm-up of `W` steps: with `n = step − W + 1`
/// (fairscale's `num_updates + 1`), `do_slow = enabled and n mod sf = 0`,
/// `do_local = n mod lf = 0`. Memory-efficient mode: a slow step skips the plain average (its
/// gather averages). With the slow step disabled the world averages every `lf` steps are the
/// syncs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlowMoCadence {
    config: SlowMoConfig,
    warmup: u64,
}

impl SlowMoCadence {
    pub(crate) fn new(config: SlowMoConfig, warmup: u64) -> Result<Self, AveragerError> {
        config.validate()?;
        Ok(Self { config, warmup })
    }

    pub(crate) fn config(&self) -> &SlowMoConfig {
        &self.config
    }

    /// What step `step` (0-based, counting the warm-up) does.
    pub(crate) fn event(&self, step: u64) -> SlowMoEvent {
        let Some(local) = step.checked_sub(self.warmup) else {
            return SlowMoEvent::Local;
        };
        let n = local.saturating_add(1);
        let (lf, sf) = (self.config.localsgd_frequency, self.config.slowmo_frequency);
        let enabled = self.config.slow_steps_enabled();
        if enabled && n.is_multiple_of(sf) {
            SlowMoEvent::Sync
        } else if n.is_multiple_of(lf) {
            if enabled {
                SlowMoEvent::Average
            } else {
                SlowMoEvent::Sync
            }
        } else {
            SlowMoEvent::Local
        }
    }
}

/// SlowMo's step counter on its [`SlowMoCadence`] (the schedule an
/// [`OuterAverager`](super::OuterAverager) built by `slowmo` holds).
#[derive(Debug, Clone)]
pub(crate) struct SlowMoSchedule {
    world: Group,
    cadence: SlowMoCadence,
}

impl SlowMoSchedule {
    pub(crate) fn new(cadence: SlowMoCadence, world: Group) -> Self {
        Self { world, cadence }
    }
}

impl Schedule for SlowMoSchedule {
    fn group_at(&self, step: u64) -> Option<Group> {
        (self.cadence.event(step) != SlowMoEvent::Local).then(|| self.world.clone())
    }

    fn config(&self) -> AveragerConfig {
        AveragerConfig::SlowMo {
            localsgd_frequency: self.cadence.config.localsgd_frequency,
            slowmo_frequency: self.cadence.config.slowmo_frequency,
            warmup_steps: self.cadence.warmup,
        }
    }
}
