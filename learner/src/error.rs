//! Why the strategy could not start, or stopped.

use std::path::PathBuf;

use localsgd_comm::CommError;
use localsgd_pipeline::checkpoint::CheckpointError;
use localsgd_pipeline::pipeline::PipelineError;

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
}
