//! Streaming DiLoCo's settings and schedule (torchft's `DiLoCo` with several fragments,
//! `fragment_sync_delay` and `fragment_update_alpha`; semantics §8.4 in the book).

use crate::error::AveragerError;
use crate::schedule::Schedule;
use crate::state::AveragerConfig;
use localsgd_comm::Group;
use serde::{Deserialize, Serialize};

/// The settings of Streaming DiLoCo (see [`OuterAverager::streaming`](super::OuterAverager::streaming)).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StreamingConfig {
    /// Local steps in which every fragment syncs once (torchft's `sync_every`, S).
    pub sync_every: u64,
    /// Number of fragments F; fragment `f` syncs every `S` steps, `P = S / F` steps after
    /// fragment `f − 1`.
    pub fragments: usize,
    /// τ (torchft's `fragment_sync_delay`): a fragment's pseudo-gradient is measured and its
    /// average started `τ` local steps before it is applied, so the all-reduce runs behind
    /// those steps' compute. `0 <= τ < P`.
    pub delay: u64,
    /// α (torchft's `fragment_update_alpha`): after the outer step a replica's fragment becomes
    /// `θ_f + α·(X_f − θ_f)`, `X_f` its own local values. `0`: adopt `θ_f`.
    pub alpha: f64,
}

impl StreamingConfig {
    /// `sync_every` S, one fragment, no delay, no mixing: plain DiLoCo (E8).
    pub fn new(sync_every: u64, fragments: usize) -> Self {
        Self {
            sync_every,
            fragments,
            delay: 0,
            alpha: 0.0,
        }
    }

    /// With the fragment sync delay τ.
    pub fn with_delay(mut self, delay: u64) -> Self {
        self.delay = delay;
        self
    }

    /// With the mixing factor α.
    pub fn with_alpha(mut self, alpha: f64) -> Self {
        self.alpha = alpha;
        self
    }

    /// torchft's checks, in its order, with its messages (typos included) followed by the
    /// values and what is valid. Returns the per-fragment period `P = S / F`.
    pub fn validate(&self) -> Result<u64, AveragerError> {
        let (s, f, tau, alpha) = (self.sync_every, self.fragments, self.delay, self.alpha);
        let err = |torchft: &str, detail: String| {
            Err(AveragerError::Outer(format!("{torchft} ({detail})")))
        };
        if f == 0 {
            return err(
                "At least one fragment is needed",
                "fragments 0; valid: 1 or more".into(),
            );
        }
        let f64s = f as u64;
        if s < f64s {
            return err(
                "Only 1 fragment can be syncrhonized at a time",
                format!(
                    "sync_every {s} is below the {f} fragments; valid: sync_every >= fragments"
                ),
            );
        }
        if !s.is_multiple_of(f64s) {
            return err(
                "sync_every must divide the number of fragments",
                format!(
                    "torchft's wording: the number of fragments, {f}, must divide sync_every {s}"
                ),
            );
        }
        let p = s / f64s;
        if tau >= p {
            return err(
                "Fragment must be synced before it is reduced another time",
                format!(
                    "fragment_sync_delay {tau} is not below sync_every / fragments = {p}; valid: 0 to {}",
                    p - 1
                ),
            );
        }
        if !(0.0..=1.0).contains(&alpha) {
            return err(
                "fragment_update_alpha must be between 0 and 1",
                format!("got {alpha}"),
            );
        }
        Ok(p)
    }
}

/// What a step of the streaming schedule does (after its optimizer step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct StreamingEvent {
    /// Measure this fragment's pseudo-gradient and start its average.
    pub prepare: Option<usize>,
    /// Apply this fragment's averaged pseudo-gradient (the outer step and the mixing).
    pub perform: Option<usize>,
}

/// Streaming DiLoCo's cadence: after a warm-up of `W` steps, local step
/// `L = (step − W) mod P + 1` prepares fragment `f = ((step − W) / P) mod F` when `L = P − τ`
/// and performs it when `L = P`. Every commit succeeds (a failed collective is an error, not a
/// retry), so the committed outer-step count `M` is the number of performs so far, and the
/// step alone says what happens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cadence {
    config: StreamingConfig,
    period: u64,
    warmup: u64,
}

impl Cadence {
    pub(crate) fn new(config: StreamingConfig, warmup: u64) -> Result<Self, AveragerError> {
        let period = config.validate()?;
        Ok(Self {
            config,
            period,
            warmup,
        })
    }

    pub(crate) fn config(&self) -> &StreamingConfig {
        &self.config
    }

    /// What step `step` does.
    pub(crate) fn event(&self, step: u64) -> StreamingEvent {
        let Some(local) = step.checked_sub(self.warmup) else {
            return StreamingEvent::default();
        };
        let within = local % self.period + 1;
        let fragment = ((local / self.period) % self.config.fragments as u64) as usize;
        StreamingEvent {
            prepare: (within == self.period - self.config.delay).then_some(fragment),
            perform: (within == self.period).then_some(fragment),
        }
    }
}

/// Streaming DiLoCo's step counter on its [`Cadence`] (the schedule an
/// [`OuterAverager`](super::OuterAverager) holds).
#[derive(Debug, Clone)]
pub(crate) struct StreamingSchedule {
    world: Group,
    cadence: Cadence,
}

impl StreamingSchedule {
    pub(crate) fn new(cadence: Cadence, world: Group) -> Self {
        Self { world, cadence }
    }
}

impl Schedule for StreamingSchedule {
    fn group_at(&self, step: u64) -> Option<Group> {
        let e = self.cadence.event(step);
        (e.prepare.is_some() || e.perform.is_some()).then(|| self.world.clone())
    }

    fn config(&self) -> AveragerConfig {
        AveragerConfig::Streaming {
            sync_every: self.cadence.config.sync_every,
            fragments: self.cadence.config.fragments,
            delay: self.cadence.config.delay,
            warmup_steps: self.cadence.warmup,
        }
    }
}
