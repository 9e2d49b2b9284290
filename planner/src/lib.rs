//! # localsgd-planner
//!
//! The cost model of `localsgd plan` and the measurements that feed it. The model predicts time
//! and bytes per iteration of each algorithm from the model size, a measured compute time, the
//! layout (hosts x ranks per host) and the links ([`predict()`], [`run_seconds`]), and recommends
//! an averaging period for a target communication share ([`recommend_period`]), or two
//! hierarchical levels for it ([`recommend_levels`]); [`PlanInputs`] takes the inputs in the
//! units of `localsgd plan`'s flags and checks them. [`measure`] holds the measurements:
//! all-reduce throughput and latency ([`measure::CommBench`], `localsgd bench-comm`) and a bare
//! burn step ([`measure::measure_step`], `localsgd bench-step`), with the one definition of
//! throughput they share ([`measure::throughput`]).
//!
//! Where things are: `link.rs` ([`Link`]), `cluster.rs` ([`Layout`], [`Cluster`]: what a
//! collective costs on the machines), `workload.rs` ([`Workload`]), `algorithm.rs`
//! ([`Algorithm`]), `schedule.rs` ([`Schedule`]: the collectives of each iteration),
//! `token_bucket.rs` and `cost_model.rs` (an iteration's cost, a shaper's burst carried
//! between iterations), `predict.rs`, `recommend.rs`, `inputs.rs` ([`PlanInputs`], [`Plan`]),
//! `error.rs` ([`PlanError`]) and `measure/`.
//!
//! The model, term by term (the book's Performance chapter has the same with its validation):
//!
//! * **Schedule.** Which collectives rank 0 issues in iteration `i` (0-based) follows the
//!   pipeline exactly: one has-data all-gather of one `u64` per iteration; the gradient
//!   all-reduce (`4P` bytes for `P` f32 parameters, `2P` with fp16/bf16 compression) in every DDP
//!   iteration and in the warmup iterations `i < warmup` of post-local SGD and hierarchical
//!   averaging; a model average (a 4-word parameter-set check, then `4P` bytes; with
//!   `average-compression`, over the world, the delta from the last average as DiLoCo sends its
//!   pseudo-gradient: `2P` all-reduced, or a lossy codec's message all-gathered) at
//!   `i >= warmup` with `(i - warmup) % period == 0` (periodic, as PyTorch's
//!   `PeriodicModelAverager`) or, for hierarchical levels, in the group of the largest level
//!   period dividing `i` (PyTorch's `HierarchicalModelAverager`), nothing where that group
//!   has one rank (averaging alone is the identity); the loss all-reduce (one
//!   `f64`) every `log_every` iterations. [`Schedule::payload`] gives rank 0's payload bytes,
//!   which are exactly what `metrics.csv` counts.
//! * **Collective time.** A group of `m` ranks that stays inside one host all-reduces `n` bytes
//!   in `latency + 2(m-1)/m * n / intra_bandwidth`. A group that spans `h` hosts puts
//!   `2(h-1)/h * n` bytes on every host link in each direction, as if the ranks of a host had
//!   reduced among themselves first: time `latency + 2(h-1)/h * n / goodput`, where the goodput
//!   is the link rate less TCP/IP and Ethernet headers (`(mtu - 52) / (mtu + 14)` of it). That
//!   is what Open MPI's all-reduce over TCP sent in the benchmark matrix (recursive halving:
//!   the halves exchanged inside a host never touch its link): 1.02-1.07 `n` per host link on
//!   2 hosts x 2 ranks, where a flat ring of the 4 ranks would send 1.5 `n`, and 1.5 `n` on
//!   4 hosts x 1 rank and 4 hosts x 2 ranks. With one rank per host it is the ring's
//!   `2(m-1)/m * n`. Measured only for consecutive ranks per host (`mpirun --map-by slot`, the
//!   default), equal ranks on every host, and 2 or 4 hosts; uneven splits and other host counts
//!   get the same formula unchecked. (NCCL's ring over `m` GPUs sends `2(m-1)/m * n` through
//!   every node's NIC; not modelled apart.) Control
//!   collectives (a few words) cost their latency only. Groups of one rank cost nothing.
//!   The MPI backend runs every all-reduce as pieces of at most 256 KiB one after the other,
//!   each a collective of its own: every piece after the first adds one small collective with
//!   every rank already inside (`piece_latency_s`, measured by `bench-comm --gap-us`). It
//!   matters most where ranks share cores, where a small collective waits for a rank the
//!   scheduler took off its core.
//!   A token-bucket shaper (`tc ... tbf`, how the benchmarks emulate links) lets up to its
//!   burst through without waiting once the link has been idle long enough to refill it; a real
//!   NIC has no such credit (`burst_bytes = 0`). Without waiting is not at once: the burst
//!   moves at the rate of the hosts' path itself ([`Link::burst_bytes_per_second`]), each of
//!   its bytes saving `1/goodput - 1/path`. The model refills the bucket whenever the link
//!   carries no data: compute, overhead, copies, control collectives, collectives inside a host,
//!   and the latency at the start of every collective (the wait for the slowest rank, the
//!   handshakes), since the last collective that crossed the link; that collective empties it.
//!   The latency counts because with more ranks than cores it is mostly waiting for a rank the
//!   scheduler took off its core, time in which the link is idle; the latencies themselves
//!   are charged in full. The bucket keeps what a collective leaves of it (tokens, up to the
//!   burst). The steady state starts from an empty bucket; a run starts from a full one (the
//!   shaper is set up before the ranks start), and [`run_seconds`] lists each of its
//!   iterations in order: a short run can end before the burst is spent. How well these
//!   predictions hold is measured by `bench/bench-matrix` (the book's Performance chapter).
//! * **The pipeline's own costs.** A fixed overhead per iteration (batch fetch, bookkeeping) and
//!   a per-byte cost of every data collective (flatten into one buffer, write back), both
//!   measured on one rank: the non-compute phases of a one-rank local-SGD run that never
//!   averages (`metrics.csv`: every phase but forward/backward and the optimizer step), and the
//!   gradient bytes over `localsgd bench-step`'s `copy_ms`.
//! * **Iteration time.** Compute (forward, backward, optimizer step: measured, e.g. with
//!   `localsgd bench-step`) plus the overhead plus every collective of the iteration, in
//!   sequence: today every collective blocks compute. The steady state is the mean over one
//!   whole cycle of the schedule after the warmup.
//! * **Lower bound.** `max(compute, wire)`, where `wire` is the busiest host link's bytes per
//!   iteration over its goodput: what a step would cost if all communication were hidden
//!   behind compute.
//!
//! ```
//! use localsgd_planner::{Algorithm, Cluster, Layout, Link, Workload, predict};
//! // 600k parameters, 5 ms of compute, 2 hosts x 1 rank over 1 Gbit/s.
//! let cluster = Cluster::new(Layout { hosts: 2, ranks_per_host: 1 }, Link::gbit(1.0, 50e-6));
//! let work = Workload {
//!     params: 600_000,
//!     compute_s: 5e-3,
//!     overhead_s: 0.0,
//!     copy_bytes_per_second: f64::INFINITY,
//!     warmup: 0,
//!     log_every: 0,
//!     compressed: false,
//!     pipelined: true,
//! };
//! let ddp = predict(&Algorithm::Ddp, &work, &cluster).unwrap();
//! let post_local = Algorithm::Periodic {
//!     period: 4,
//!     gradient_warmup: true,
//!     overlap: 0,
//!     compression: None,
//! };
//! let pl = predict(&post_local, &work, &cluster).unwrap();
//! assert!(ddp.steady_s > 4.0 * pl.comm_s.max(1e-9));
//! assert_eq!(ddp.payload_data_bytes, 2_400_000.0);
//! ```

#![deny(missing_docs)]

mod algorithm;
mod cluster;
mod cost_model;
mod error;
mod inputs;
mod link;
pub mod measure;
mod predict;
mod recommend;
mod schedule;
#[cfg(test)]
mod test_util;
mod token_bucket;
mod workload;

pub use algorithm::Algorithm;
pub use cluster::{Cluster, Layout};
pub use error::PlanError;
pub use inputs::{MAX_LISTED_STEPS, Plan, PlanInputs, RunListing, default_levels};
pub use link::Link;
pub use predict::{Prediction, predict, run_seconds};
pub use recommend::{recommend_levels, recommend_period};
pub use schedule::{Collective, Schedule};
pub use workload::Workload;
