//! The algorithm settings the pipeline's parts are built from ([`crate::algorithm`]): which
//! algorithm, the outer optimizer, bucket pipelining and gradient compression. Plain types
//! (serde; `clap::ValueEnum` only with this crate's `clap` feature, for command lines).

use localsgd_averagers::{OuterOptimizer, PseudoGradient, StreamingConfig};
use localsgd_comm::Precision;
use serde::{Deserialize, Serialize};

/// The training algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum AlgorithmKind {
    /// All-reduce every gradient every step (the all-reduce hook, no averager).
    Ddp,
    /// No gradient communication; periodic model averaging from step `warmup` on.
    LocalSgd,
    /// Gradient all-reduce for `warmup` steps (post-local SGD hook), then periodic averaging.
    PostLocalSgd,
    /// Post-local SGD hook with hierarchical averaging (`levels`).
    Hierarchical,
    /// DiLoCo: the post-local SGD hook's warmup, then every `period` local steps an outer
    /// `torch.optim.SGD` step (default Nesterov, lr 0.7, momentum 0.9) on the global model with
    /// the replicas' mean displacement as gradient; with `levels`, the lower levels average
    /// plainly and the outer step runs at the whole-world level.
    Diloco,
    /// Streaming DiLoCo (torchft's `DiLoCo` with fragments): like `diloco`, but the parameters
    /// sync in `fragments` fragments (default 2) taking turns every `period / fragments` local
    /// steps, each fragment's all-reduce started `fragment-sync-delay` steps early and its
    /// local values mixed back in with `fragment-alpha`.
    StreamingDiloco,
    /// SlowMo (fairscale's arithmetic): like `diloco`, with the slow-momentum step
    /// `u = βu + Δ/γ; θ = θ − αγu` (γ the step's inner learning rate; defaults α 1, β 0.5).
    Slowmo,
}

impl AlgorithmKind {
    /// The value as written in a config file or a flag (`ddp`, `local-sgd`, ...).
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmKind::Ddp => "ddp",
            AlgorithmKind::LocalSgd => "local-sgd",
            AlgorithmKind::PostLocalSgd => "post-local-sgd",
            AlgorithmKind::Hierarchical => "hierarchical",
            AlgorithmKind::Diloco => "diloco",
            AlgorithmKind::StreamingDiloco => "streaming-diloco",
            AlgorithmKind::Slowmo => "slowmo",
        }
    }

    /// Whether this algorithm takes outer-optimizer steps (`diloco`, `streaming-diloco`,
    /// `slowmo`).
    pub fn is_outer(self) -> bool {
        matches!(
            self,
            AlgorithmKind::Diloco | AlgorithmKind::StreamingDiloco | AlgorithmKind::Slowmo
        )
    }
}

/// The outer optimizer settings of `diloco`/`slowmo`, resolved and checked
/// (the binary resolves them from its settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OuterSettings {
    /// The outer optimizer.
    pub optimizer: OuterOptimizer,
    /// How the pseudo-gradient is reduced.
    pub reduce: PseudoGradient,
    /// The pseudo-gradients' wire precision (`None`: full precision).
    pub compression: Option<Precision>,
    /// Streaming DiLoCo's fragments, delay and mixing (`None`: every parameter syncs at once).
    pub streaming: Option<StreamingConfig>,
}

/// Whether gradient buckets are pipelined (see `TrainConfig::pipeline_buckets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum PipelineBuckets {
    /// On when the ranks span more than one host, off on one host (threads, or mpi/nccl ranks
    /// sharing a machine), where a collective is a memory copy with no wire time to hide and
    /// the helper thread's hand-offs cost more than they hide.
    Auto,
    /// Always pipelined.
    On,
    /// Never: every bucket blocks, then one optimizer step.
    Off,
}

/// Gradient compression applied around the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    /// Full precision.
    None,
    /// IEEE half precision.
    Fp16,
    /// bfloat16.
    Bf16,
}
