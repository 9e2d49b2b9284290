//! What the strategy runs: the algorithm and its settings, checked before training starts with
//! the rules of the semantics (Lightning's and PyTorch's errors, in the binary's words).

use std::time::Duration;

use localsgd_pipeline::algorithm::AlgorithmSpec;
pub use localsgd_pipeline::pipeline::BufferPolicy;
use localsgd_pipeline::settings::PipelineBuckets;
pub use localsgd_pipeline::settings::{AlgorithmKind, Levels};

/// Why a [`StrategyConfig`] cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StrategyError {
    /// A setting is invalid: the message names it, the value and what would be valid.
    #[error("{0}")]
    Config(String),
}

/// The algorithm of a [`LocalSgdStrategy`](crate::LocalSgdStrategy) and its settings; the
/// names and meanings are the `localsgd` binary's settings of the same names (book:
/// Configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct StrategyConfig {
    /// `ddp`, `local-sgd`, `post-local-sgd` or `hierarchical`.
    pub algorithm: AlgorithmKind,
    /// Ranks run as threads of this process when no process group is handed to the strategy.
    pub workers: usize,
    /// Optimizer steps of gradient all-reduce before local SGD starts (PyTorch's
    /// `start_localSGD_iter` and the averager's `warmup_steps`).
    pub warmup: u64,
    /// Model averaging period in optimizer steps (Lightning's `model_averaging_period`);
    /// required by `local-sgd` and `post-local-sgd`.
    pub period: Option<u64>,
    /// Hierarchical levels, e.g. `"2:2,4:4".parse()?` (`period:group-size` pairs).
    pub levels: Levels,
    /// Post-warmup gradient all-reduce subgroup size (`post_local_allreduce`); `None`: the ranks
    /// of one host.
    pub subgroup_size: Option<usize>,
    /// PyTorch's `post_local_gradient_allreduce`.
    pub post_local_allreduce: bool,
    /// Give every rank rank 0's parameters and buffers before the first step of a fresh run.
    pub broadcast_start: bool,
    /// What happens to buffers (BatchNorm running statistics).
    pub buffers: BufferPolicy,
    /// How long a collective waits for its peers before failing (threads).
    pub timeout: Duration,
    /// Epochs of per-rank checkpoints kept beside burn-train's (ranks other than 0); resuming
    /// from an older epoch fails naming the missing file.
    pub keep_rank_checkpoints: usize,
}

impl Default for StrategyConfig {
    /// DDP on 2 thread ranks.
    fn default() -> Self {
        Self {
            algorithm: AlgorithmKind::Ddp,
            workers: 2,
            warmup: 0,
            period: None,
            levels: Levels::default(),
            subgroup_size: None,
            post_local_allreduce: false,
            broadcast_start: true,
            buffers: BufferPolicy::Broadcast,
            timeout: Duration::from_secs(300),
            keep_rank_checkpoints: 2,
        }
    }
}

impl StrategyConfig {
    /// Post-local SGD: gradient all-reduce for `warmup` steps, then local steps with the models
    /// averaged every `period` steps (Lightning's `DDPStrategy(ddp_comm_state=PostLocalSGDState(
    /// start_localSGD_iter=warmup, ...), model_averaging_period=period)`).
    pub fn post_local_sgd(warmup: u64, period: u64) -> Self {
        Self {
            algorithm: AlgorithmKind::PostLocalSgd,
            warmup,
            period: Some(period),
            ..Self::default()
        }
    }

    /// Local SGD: no gradient communication, the models averaged every `period` steps from
    /// step `warmup` on.
    pub fn local_sgd(period: u64) -> Self {
        Self {
            algorithm: AlgorithmKind::LocalSgd,
            period: Some(period),
            ..Self::default()
        }
    }

    /// Hierarchical averaging after a post-local SGD warmup, e.g. with
    /// `"2:2,4:4".parse::<Levels>()?`.
    pub fn hierarchical(warmup: u64, levels: Levels) -> Self {
        Self {
            algorithm: AlgorithmKind::Hierarchical,
            warmup,
            levels,
            ..Self::default()
        }
    }

    /// These settings with `workers` thread ranks.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Check every rule that does not need the ranks to exist, for a run on `world` ranks.
    pub fn validate(&self, world: usize) -> Result<(), StrategyError> {
        if self.algorithm.is_outer() {
            return Err(StrategyError::Config(format!(
                "invalid setting `algorithm` = {}: the burn-train strategy does not take outer \
                 optimizer steps yet (valid here: ddp, local-sgd, post-local-sgd, hierarchical); \
                 train DiLoCo or SlowMo with localsgd_pipeline's Pipeline or `localsgd train`",
                self.algorithm.name()
            )));
        }
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
        self.algorithm_spec()
            .validate(world)
            .map_err(|e| StrategyError::Config(e.to_string()))
    }

    /// These settings as the pipeline's algorithm settings (whose rules
    /// [`AlgorithmSpec::validate`] checks: the same as the `localsgd` binary's). The strategy
    /// syncs bucket by bucket, blocking: no helper communicator for pipelined buckets.
    fn algorithm_spec(&self) -> AlgorithmSpec {
        AlgorithmSpec {
            kind: self.algorithm,
            warmup: self.warmup,
            period: self.period,
            levels: self.levels.as_slice().to_vec(),
            subgroup_size: self.subgroup_size,
            post_local_allreduce: self.post_local_allreduce,
            pipeline_buckets: PipelineBuckets::Off,
            ..AlgorithmSpec::default()
        }
    }

    /// The algorithm parts' description, validated, for a run on `world` ranks.
    pub(crate) fn spec(&self, world: usize) -> Result<AlgorithmSpec, StrategyError> {
        self.validate(world)?;
        Ok(self.algorithm_spec())
    }
}
