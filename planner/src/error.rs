//! What the planner refuses, named with what would be valid.

/// A setting the model cannot use, named with what would be valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A value out of range.
    #[error("invalid plan setting `{setting}` = {value}: {valid}")]
    Invalid {
        /// The setting.
        setting: &'static str,
        /// The value given.
        value: String,
        /// What would be valid.
        valid: String,
    },
    /// An input of [`PlanInputs`](crate::PlanInputs) out of range, named as the flag of
    /// `localsgd plan` that gives it.
    #[error("invalid --{flag} {value}: {valid}")]
    Input {
        /// The flag, without its dashes (`link-gbit`).
        flag: &'static str,
        /// The value given.
        value: String,
        /// What would be valid.
        valid: String,
    },
    /// A layout without hosts or without ranks on them.
    #[error(
        "invalid layout --hosts {hosts} --ranks-per-host {ranks_per_host}: both must be at least 1"
    )]
    Layout {
        /// Number of hosts given.
        hosts: usize,
        /// Ranks on each host given.
        ranks_per_host: usize,
    },
    /// An algorithm name the cost model does not know.
    #[error(
        "invalid --algorithms entry {name:?}: valid: ddp, local-sgd, post-local-sgd, hierarchical, diloco, slowmo"
    )]
    UnknownAlgorithm {
        /// The name given.
        name: String,
    },
    /// Streaming DiLoCo, whose fragments the cost model does not know.
    #[error(
        "--algorithms streaming-diloco: the cost model does not know the fragments yet (their \
         sizes follow the model's tensors); plan `diloco` for the traffic of the whole model \
         every period"
    )]
    StreamingDiloco,
}

pub(crate) fn invalid(setting: &'static str, value: impl ToString, valid: &str) -> PlanError {
    PlanError::Invalid {
        setting,
        value: value.to_string(),
        valid: valid.to_string(),
    }
}

/// An input of `localsgd plan` out of range: [`PlanError::Input`].
pub(crate) fn invalid_input(flag: &'static str, value: impl ToString, valid: &str) -> PlanError {
    PlanError::Input {
        flag,
        value: value.to_string(),
        valid: valid.to_string(),
    }
}
