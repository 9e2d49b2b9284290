//! The outer optimizer of an [`OuterAverager`](super::OuterAverager) and how its
//! pseudo-gradient is reduced.

use super::sgd::OuterSgdConfig;
use crate::error::AveragerError;
use serde::{Deserialize, Serialize};

/// How the pseudo-gradient is reduced over the group (semantics §8.2). Equal in exact arithmetic,
/// they round differently (bitwise equal on dyadic data, vector V9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum PseudoGradient {
    /// Variant A (torchft, OpenDiLoCo, hivemind): every rank computes `θ − x_r`; the ranks
    /// average those (`diloco`'s default).
    MeanOfDeltas,
    /// Variant B (fairscale): the ranks average their parameters; every rank computes
    /// `θ − mean(x_r)` (the only one `slowmo` accepts).
    DeltaOfMean,
}

/// The outer optimizer of an [`OuterAverager`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OuterOptimizer {
    /// `torch.optim.SGD` on `θ` with the pseudo-gradient as gradient (DiLoCo).
    Sgd(OuterSgdConfig),
    /// fairscale's SlowMo slow step: slow learning rate `lr` (α, fairscale's `slowmo_lr`) and
    /// slow momentum `momentum` (β, `slowmo_momentum`). fairscale's defaults are `(1.0, 0.5)`.
    SlowMo {
        /// α (`slowmo_lr`), `> 0`.
        lr: f64,
        /// β (`slowmo_momentum`), `>= 0`.
        momentum: f64,
    },
}

impl From<OuterSgdConfig> for OuterOptimizer {
    fn from(config: OuterSgdConfig) -> Self {
        OuterOptimizer::Sgd(config)
    }
}

impl OuterOptimizer {
    /// Check the settings: torch's rules for [`Sgd`](Self::Sgd) (see
    /// [`OuterSgdConfig::validate`]), `lr > 0` and `momentum >= 0`, both finite, for
    /// [`SlowMo`](Self::SlowMo). The error names the value and what would be valid.
    pub fn validate(&self) -> Result<(), AveragerError> {
        match *self {
            OuterOptimizer::Sgd(c) => c.validate(),
            OuterOptimizer::SlowMo { lr, momentum } => {
                if !(lr.is_finite() && lr > 0.0) {
                    return Err(AveragerError::Outer(format!(
                        "SlowMo's slow learning rate must be a finite number > 0 (got {lr}); \
                         fairscale's default is 1"
                    )));
                }
                if !(momentum.is_finite() && momentum >= 0.0) {
                    return Err(AveragerError::Outer(format!(
                        "SlowMo's slow momentum must be a finite number >= 0 (got {momentum}); \
                         fairscale's default is 0.5"
                    )));
                }
                Ok(())
            }
        }
    }

    /// The pseudo-gradient reduction an [`OuterAverager`] uses unless told otherwise: mean of
    /// deltas for SGD (torchft, OpenDiLoCo), delta of mean for SlowMo (fairscale).
    pub fn default_reduce(&self) -> PseudoGradient {
        match self {
            OuterOptimizer::Sgd(_) => PseudoGradient::MeanOfDeltas,
            OuterOptimizer::SlowMo { .. } => PseudoGradient::DeltaOfMean,
        }
    }
}
