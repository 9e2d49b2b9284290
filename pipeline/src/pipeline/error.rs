//! Errors of the training pipeline.

use localsgd_averagers::AveragerError;
use localsgd_comm::CommError;
use localsgd_hooks::HookError;

/// Everything that can stop a training iteration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// A collective failed (peer died, timeout, mismatch).
    #[error("communication failed in phase {phase}: {source}")]
    Comm {
        /// The phase that was communicating.
        phase: &'static str,
        /// The comm layer's error.
        source: CommError,
    },
    /// The gradient hook failed.
    #[error("gradient sync failed: {0}")]
    Hook(#[from] HookError),
    /// Model averaging failed.
    #[error("model averaging failed: {0}")]
    Averager(#[from] AveragerError),
    /// An invalid combination of pipeline parts.
    #[error("invalid pipeline configuration: {0}")]
    Config(String),
    /// The batch source could not deliver the next batch.
    #[error("reading the next batch: {0}")]
    Data(#[source] super::source::SourceError),
    /// An [`IterationObserver`](super::IterationObserver) failed.
    #[error("observing the iteration: {0}")]
    Observer(#[source] super::observer::ObserverError),
    /// Saving a checkpoint failed.
    #[error("checkpoint failed: {0}")]
    Checkpoint(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl PipelineError {
    pub(crate) fn comm(phase: super::phase::Phase) -> impl FnOnce(CommError) -> PipelineError {
        move |source| PipelineError::Comm {
            phase: phase.name(),
            source,
        }
    }
}
