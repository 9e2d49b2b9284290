//! What is trained: the model's size, the measured compute, and the pipeline's own costs.

use serde::Serialize;

/// What is trained.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Workload {
    /// Number of f32 parameters.
    pub params: u64,
    /// Compute per iteration (forward, backward, optimizer step), seconds.
    pub compute_s: f64,
    /// The pipeline's own fixed cost per iteration beyond `compute_s` (batch fetch, bookkeeping),
    /// seconds: the non-compute phases of a one-rank local-SGD run that never averages.
    pub overhead_s: f64,
    /// The pipeline's own handling of a gradient all-reduce or model average (flatten, the
    /// mean's pass, write back) in bytes per second: the buffer's bytes over `localsgd
    /// bench-step`'s `copy_ms`. `f64::INFINITY`: free.
    pub copy_bytes_per_second: f64,
    /// Iterations of gradient all-reduce before local steps (post-local SGD, hierarchical); also
    /// the averagers' warmup.
    pub warmup: u64,
    /// Loss all-reduce every this many iterations (0: never).
    pub log_every: u64,
    /// Gradients travel as fp16/bf16 (half the bytes).
    pub compressed: bool,
    /// Gradients are averaged by the pipelined reducer (`pipeline-buckets`, the binary's
    /// default; not with compression): the first iteration that averages gradients also
    /// creates its non-blocking communicator (one 8-byte control collective).
    pub pipelined: bool,
}
