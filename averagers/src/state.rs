//! The averager's saved state: its step counter plus the configuration it was saved from, so a
//! checkpoint restores the schedule exactly and a checkpoint from a different configuration is
//! refused instead of silently shifting the schedule.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One level of a hierarchical averager: every `period` steps, average within contiguous blocks
/// of `group_size` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Level {
    /// Average every `period` steps (absolute step count).
    pub period: u64,
    /// Number of ranks per block.
    pub group_size: usize,
}

impl From<(u64, usize)> for Level {
    /// `(period, group_size)`, the tuple form PyTorch's `period_group_size_dict` items take.
    fn from((period, group_size): (u64, usize)) -> Self {
        Self { period, group_size }
    }
}

/// Which averager a state belongs to, with the settings that determine its schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AveragerConfig {
    /// A [`PeriodicModelAverager`](crate::PeriodicModelAverager).
    Periodic {
        /// Averaging period.
        period: u64,
        /// Steps before the first averaging.
        warmup_steps: u64,
        /// Overlap delay (0: blocking averaging; see [`overlap`](crate::overlap)).
        #[serde(default)]
        overlap: u64,
    },
    /// A [`HierarchicalModelAverager`](crate::HierarchicalModelAverager).
    Hierarchical {
        /// Levels in order of increasing period.
        levels: Vec<Level>,
        /// Steps before the first averaging.
        warmup_steps: u64,
    },
    /// Streaming DiLoCo's schedule (see [`StreamingConfig`](crate::outer::StreamingConfig)).
    Streaming {
        /// Local steps in which every fragment syncs once.
        sync_every: u64,
        /// Number of fragments.
        fragments: usize,
        /// Steps between measuring a fragment's pseudo-gradient and applying it.
        delay: u64,
        /// Steps of synchronous warm-up before the first local step.
        warmup_steps: u64,
    },
    /// SlowMo's schedule with fairscale's two frequencies (see
    /// [`SlowMoConfig`](crate::outer::SlowMoConfig)).
    #[serde(rename = "slowmo")]
    SlowMo {
        /// Local steps between plain averages over the world.
        localsgd_frequency: u64,
        /// Local steps between slow momentum steps.
        slowmo_frequency: u64,
        /// Steps of synchronous warm-up before the first local step.
        warmup_steps: u64,
    },
    /// An [`OuterAverager`](crate::OuterAverager) on a schedule.
    Outer {
        /// The schedule's configuration.
        schedule: Box<AveragerConfig>,
        /// The outer optimizer's settings, as text.
        outer: String,
    },
}

impl fmt::Display for AveragerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AveragerConfig::Periodic {
                period,
                warmup_steps,
                overlap: 0,
            } => write!(f, "periodic(period {period}, warmup_steps {warmup_steps})"),
            AveragerConfig::Periodic {
                period,
                warmup_steps,
                overlap,
            } => write!(
                f,
                "periodic(period {period}, warmup_steps {warmup_steps}, overlap {overlap})"
            ),
            AveragerConfig::Hierarchical {
                levels,
                warmup_steps,
            } => {
                let levels: Vec<String> = levels
                    .iter()
                    .map(|l| format!("({}, {})", l.period, l.group_size))
                    .collect();
                write!(
                    f,
                    "hierarchical(levels (period, group size) [{}], warmup_steps {warmup_steps})",
                    levels.join(", ")
                )
            }
            AveragerConfig::Streaming {
                sync_every,
                fragments,
                delay,
                warmup_steps,
            } => write!(
                f,
                "streaming(sync_every {sync_every}, fragments {fragments}, delay {delay}, warmup_steps {warmup_steps})"
            ),
            AveragerConfig::SlowMo {
                localsgd_frequency,
                slowmo_frequency,
                warmup_steps,
            } => write!(
                f,
                "slowmo(localsgd_frequency {localsgd_frequency}, slowmo_frequency {slowmo_frequency}, warmup_steps {warmup_steps})"
            ),
            AveragerConfig::Outer { schedule, outer } => write!(f, "{outer} on {schedule}"),
        }
    }
}

/// Serializable state of a [`ModelAverager`](crate::ModelAverager): the number of iterations
/// counted so far and the configuration, checked on
/// [`load_state`](crate::ModelAverager::load_state).
///
/// ```
/// use localsgd_averagers::{AveragerConfig, AveragerState};
///
/// let state = AveragerState {
///     step: 20,
///     config: AveragerConfig::Periodic { period: 4, warmup_steps: 0, overlap: 0 },
/// };
/// let json = serde_json::to_string(&state)?;
/// assert_eq!(serde_json::from_str::<AveragerState>(&json)?, state);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AveragerState {
    /// Training iterations counted so far (the next call to `average_parameters` handles this
    /// step).
    pub step: u64,
    /// The configuration the state was saved from.
    pub config: AveragerConfig,
}
