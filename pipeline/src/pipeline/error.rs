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
    /// Whether the iteration failed because a peer is gone, in whichever phase met it (a
    /// collective, the gradient hook, the averager, the checkpoint phase, or an observer's
    /// own collective): what a run that survives a failed rank recovers from, and what it
    /// must not mistake for its own error.
    pub fn is_peer_lost(&self) -> bool {
        match self {
            PipelineError::Comm { source, .. } => source.is_peer_lost(),
            PipelineError::Hook(h) => h.is_peer_lost(),
            PipelineError::Averager(a) => a.is_peer_lost(),
            PipelineError::Checkpoint(e) | PipelineError::Observer(e) => is_peer_lost(&**e),
            PipelineError::Config(_) | PipelineError::Data(_) => false,
        }
    }

    pub(crate) fn comm(phase: super::phase::Phase) -> impl FnOnce(CommError) -> PipelineError {
        move |source| PipelineError::Comm {
            phase: phase.name(),
            source,
        }
    }
}

/// Whether `e`, or an error it was caused by, says a peer is gone: one of this workspace's
/// error types that can say so (`PipelineError`, `CheckpointError`, `CommError`, `HookError`,
/// `AveragerError`), wherever it sits in the chain of sources. What
/// [`Recovery::run`](crate::recovery::Recovery::run) takes for an error type of your own that
/// wraps them (a boxed error, say), and what the boxed errors of a checkpointer or an observer
/// are asked with.
pub fn is_peer_lost(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        let lost = if let Some(p) = err.downcast_ref::<PipelineError>() {
            Some(p.is_peer_lost())
        } else if let Some(c) = err.downcast_ref::<crate::checkpoint::CheckpointError>() {
            Some(c.is_peer_lost())
        } else if let Some(c) = err.downcast_ref::<CommError>() {
            Some(c.is_peer_lost())
        } else if let Some(h) = err.downcast_ref::<HookError>() {
            Some(h.is_peer_lost())
        } else {
            err.downcast_ref::<AveragerError>()
                .map(|a| a.is_peer_lost())
        };
        if let Some(lost) = lost {
            return lost;
        }
        next = err.source();
    }
    false
}
