//! Why the strategy could not start, or stopped.

use std::path::PathBuf;

use localsgd_comm::CommError;
use localsgd_pipeline::checkpoint::CheckpointError;
use localsgd_pipeline::pipeline::PipelineError;
use localsgd_pipeline::recovery::RecoveryError;

/// Why a [`LocalSgdStrategy`](crate::LocalSgdStrategy) run could not start or continue. The
/// strategy reports it through burn-train's `Interrupter` (as a `TrainingError::Workers` entry
/// naming the rank).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StrategyError {
    /// A setting is invalid: the message names it, the value and what would be valid.
    #[error("{0}")]
    Config(String),
    /// An iteration failed (a collective, the data, the algorithm).
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// A collective outside the iteration failed (agreeing to stop, the final average).
    #[error("communication: {0}")]
    Comm(#[from] CommError),
    /// The run cannot resume from the checkpoint it was given (the message says why).
    #[error("cannot resume: {0}")]
    Resume(String),
    /// Reading or writing a rank's state file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A rank's state file is not one the strategy wrote.
    #[error("{path} is not a state file of this strategy: {reason}")]
    State {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint file of the pipeline's state could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A thread rank panicked (its peers then fail at their next collective).
    #[error("panicked: {0}")]
    Panicked(String),
    /// The survivors of a failed rank could not go on (`on_rank_failure`).
    #[error("recovering from a failed rank: {0}")]
    Recovery(#[from] RecoveryError),
}

impl StrategyError {
    /// Whether this is a peer's failure as this rank met it (a collective found a rank gone),
    /// the failure `on_rank_failure = Continue | Replace` survives.
    pub fn is_peer_lost(&self) -> bool {
        match self {
            Self::Pipeline(e) => e.is_peer_lost(),
            Self::Comm(e) => e.is_peer_lost(),
            Self::Checkpoint(e) => e.is_peer_lost(),
            _ => false,
        }
    }
}
