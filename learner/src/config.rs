//! What the strategy runs: the pipeline's algorithm settings ([`AlgorithmSpec`], the same type
//! and rules as the `localsgd` binary's) and the few settings of the strategy itself, checked
//! before training starts.

use std::time::Duration;

pub use localsgd_averagers::AverageCompression;
pub use localsgd_pipeline::algorithm::AlgorithmSpec;
pub use localsgd_pipeline::pipeline::BufferPolicy;
pub use localsgd_pipeline::recovery::OnRankFailure;
pub use localsgd_pipeline::settings::{
    AlgorithmKind, AverageCompressionKind, Levels, OuterSettings,
};

pub use crate::error::StrategyError;

/// The algorithm of a [`LocalSgdStrategy`](crate::LocalSgdStrategy) and the strategy's own
/// settings; the names and meanings are the `localsgd` binary's settings of the same names
/// (book: Configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct StrategyConfig {
    /// The algorithm and its settings, e.g. `AlgorithmSpec::diloco(50)` or
    /// `AlgorithmSpec::post_local_sgd(100, 4)`: every algorithm, overlap, compression,
    /// pipelined buckets and outer optimizer of the binary.
    pub algorithm: AlgorithmSpec,
    /// Ranks run as threads of this process when no process group is handed to the strategy.
    pub workers: usize,
    /// Give every rank rank 0's parameters and buffers before the first step of a fresh run.
    pub broadcast_start: bool,
    /// What happens to buffers (BatchNorm running statistics).
    pub buffers: BufferPolicy,
    /// Clip the gradients' global L2 norm to this value after gradient sync (PyTorch's
    /// `clip_grad_norm_`); `None`: no clipping.
    pub clip_grad_norm: Option<f64>,
    /// Skip the optimizer step when a gradient is NaN or infinite (counted, reported in
    /// [`StrategyReport`](crate::StrategyReport)).
    pub skip_non_finite: bool,
    /// How long a collective waits for its peers before failing (threads).
    pub timeout: Duration,
    /// Epochs of per-rank checkpoints kept beside burn-train's (ranks other than 0); resuming
    /// from an older epoch fails naming the missing file.
    pub keep_rank_checkpoints: usize,
    /// What the surviving ranks do when a rank fails (a panic, a killed process): `Abort`
    /// ends `fit` with the failure; `Continue` shrinks the world to the survivors, which go
    /// back to the last epoch every rank saved and train on, the data dealt again over them;
    /// `Replace` also starts a rank in the failed one's place (a thread, or under MPI with
    /// ULFM a spawned process) that takes its saved state. Both need the strategy's directory
    /// ([`LocalSgdStrategy::with_directory`](crate::LocalSgdStrategy::with_directory)), where
    /// every rank then saves its whole state after each epoch (book: With burn-train's
    /// Learner).
    pub on_rank_failure: OnRankFailure,
}

impl Default for StrategyConfig {
    /// DDP on 2 thread ranks.
    fn default() -> Self {
        Self::new(AlgorithmSpec::ddp())
    }
}

impl StrategyConfig {
    /// `algorithm` on 2 thread ranks, with DDP's buffer broadcast, no clipping.
    pub fn new(algorithm: AlgorithmSpec) -> Self {
        Self {
            algorithm,
            workers: 2,
            broadcast_start: true,
            buffers: BufferPolicy::Broadcast,
            clip_grad_norm: None,
            skip_non_finite: false,
            timeout: Duration::from_secs(300),
            keep_rank_checkpoints: 2,
            on_rank_failure: OnRankFailure::Abort,
        }
    }

    /// These settings with `on_rank_failure` (what the survivors of a failed rank do).
    pub fn with_on_rank_failure(mut self, on_rank_failure: OnRankFailure) -> Self {
        self.on_rank_failure = on_rank_failure;
        self
    }

    /// These settings with `workers` thread ranks.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// The refusal of `on_rank_failure = Continue | Replace` without the strategy's directory,
    /// where the ranks' saved states live.
    pub(crate) fn without_directory(&self) -> StrategyError {
        StrategyError::Config(format!(
            "invalid setting `on_rank_failure` = {:?}: the survivors continue from the state \
             every rank saves after each epoch in the strategy's directory; give it one \
             (`LocalSgdStrategy::with_directory`), or use `OnRankFailure::Abort`",
            self.on_rank_failure
        ))
    }

    /// Check every rule that does not need the ranks to exist, for a run on `world` ranks
    /// (the algorithm's rules are [`AlgorithmSpec::validate`], the binary's).
    pub fn validate(&self, world: usize) -> Result<(), StrategyError> {
        if self.keep_rank_checkpoints == 0 {
            return Err(StrategyError::Config(
                "invalid setting `keep_rank_checkpoints` = 0: keep at least 1 epoch of per-rank \
                 checkpoints, or resuming cannot find the ranks' models"
                    .into(),
            ));
        }
        if world == 0 {
            return Err(StrategyError::Config(
                "invalid setting `workers` = 0: at least 1 worker".into(),
            ));
        }
        if let Some(c) = self.clip_grad_norm
            && !(c.is_finite() && c > 0.0)
        {
            return Err(StrategyError::Config(format!(
                "invalid setting `clip_grad_norm` = {c}: a finite number above 0, or None for \
                 no clipping"
            )));
        }
        self.algorithm
            .validate(world)
            .map_err(|e| StrategyError::Config(e.to_string()))
    }
}
