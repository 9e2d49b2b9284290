//! Why a run failed.

use localsgd_comm::CommError;
use localsgd_models::data::DataError;
use localsgd_models::mlp::ModelError;
use localsgd_models::pytorch::WeightsError;
use localsgd_pipeline::checkpoint::CheckpointError;
use localsgd_pipeline::optim::OptimError;
use localsgd_pipeline::pipeline::PipelineError;
use localsgd_pipeline::recovery::{MEMBERSHIP_FILE, RecoveryError};

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A setting is invalid (the message names it).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Loading data failed.
    #[error("data: {0}")]
    Data(#[from] DataError),
    /// The model configuration is invalid.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// `init-weights` could not be loaded.
    #[error("init-weights: {0}")]
    InitWeights(#[from] WeightsError),
    /// The pipeline failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// A checkpoint could not be saved or loaded.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A collective outside the pipeline failed (setup, evaluation).
    #[error("communication: {0}")]
    Comm(#[from] CommError),
    /// `flush-denormals` on a CPU this build cannot set it on.
    #[error(transparent)]
    Denormals(#[from] crate::denormals::UnsupportedArch),
    /// The optimizer's settings are outside what PyTorch accepts.
    #[error("optimizer: {0}")]
    Optimizer(#[from] OptimError),
    /// The configured compute device is not available in this build.
    #[error("device: {0}")]
    Device(String),
    /// The models would not fit in this machine's memory.
    #[error(transparent)]
    TooLarge(#[from] localsgd_models::limits::TooLarge),
    /// `LOCALSGD_FAULT` is set to something that is not a fault ([`crate::fault`]).
    #[error("fault injection: {0}")]
    Fault(String),
    /// A thread worker panicked (its peers then fail with "rank R failed").
    #[error("rank {rank} panicked: {message}")]
    WorkerPanicked {
        /// The world rank of the worker.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// Writing metrics or plots failed.
    #[error("writing {what}: {message}")]
    Output {
        /// The file.
        what: String,
        /// The error.
        message: String,
    },
}

/// An I/O error writing the run file `what`, as a run error.
pub(crate) fn output_error(what: &'static str) -> impl Fn(std::io::Error) -> RunError {
    move |e| RunError::Output {
        what: what.into(),
        message: e.to_string(),
    }
}

/// A recovery's failure as the run reports it (`membership.csv` as an output file).
impl From<RecoveryError> for RunError {
    fn from(e: RecoveryError) -> Self {
        match e {
            RecoveryError::Comm(e) => RunError::Comm(e),
            RecoveryError::Checkpoint(e) => RunError::Checkpoint(e),
            RecoveryError::Setting(e) => RunError::Config(e),
            e => RunError::Output {
                what: MEMBERSHIP_FILE.into(),
                message: e.to_string(),
            },
        }
    }
}
