//! Throughput: one definition of "all-reduce throughput" and of the memcpy bandwidth it is
//! compared against, shared by the criterion benches, the `mpi_bench` driver, [`CommBench`]
//! (`localsgd bench-comm`) and [`measure_step`]'s spinning (`localsgd bench-step`).
//!
//! - memcpy bandwidth: bytes copied / time, one thread, `len` `f32` values, pages faulted in
//!   before timing.
//! - all-reduce throughput: buffer bytes / time per all-reduce (sum, in place), where the time
//!   of a repetition is the **slowest** rank's, and the result is the best of the repetitions.
//!   Back to back by default; [`allreduce_gbps_between`] first spins every rank for a gap
//!   before each all-reduce, as an iteration's compute would, and times only the all-reduces:
//!   a small collective after compute costs more than back to back, and the gapped figure is
//!   the one a training iteration's collectives see.
//!
//! [`CommBench`]: super::CommBench
//! [`measure_step`]: super::measure_step
//!
//! ```
//! use localsgd_comm::ThreadWorld;
//! use localsgd_planner::measure::throughput::{allreduce_gbps, memcpy_gbps};
//!
//! let memcpy = memcpy_gbps(1 << 16, 20, 3);
//! let allreduce = ThreadWorld::new(2)?.run(|g| allreduce_gbps(g.as_ref(), 1 << 16, 20, 3))?;
//! assert!(memcpy > 0.0);
//! assert_eq!(allreduce[0], allreduce[1]); // every rank reports the slowest rank's figure
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use localsgd_comm::{CommError, GroupExt, ProcessGroup, ReduceOp};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Time `iters` single-thread copies of `len` `f32` values (one warm-up copy first).
pub fn memcpy_time(len: usize, iters: u64) -> Duration {
    let src = vec![1.0f32; len];
    let mut dst = vec![0.0f32; len];
    dst.copy_from_slice(&src);
    let start = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
    }
    start.elapsed()
}

/// Single-thread memcpy bandwidth in GB/s (10^9 bytes): best of `reps` runs of `iters` copies.
pub fn memcpy_gbps(len: usize, iters: u64, reps: usize) -> f64 {
    let best = (0..reps.max(1))
        .map(|_| memcpy_time(len, iters))
        .min()
        .unwrap_or_default();
    gbps(len * 4, iters, best)
}

/// Collective: time `iters` in-place sum all-reduces of `buf` on every rank, after a barrier.
/// Returns the slowest rank's time (the same value on every rank).
pub fn allreduce_time(
    group: &dyn ProcessGroup,
    buf: &mut [f32],
    iters: u64,
) -> Result<Duration, CommError> {
    allreduce_time_between(group, buf, iters, Duration::ZERO)
}

/// Keep this thread's core busy for `gap` (a stand-in for compute, or for a rank polling in a
/// collective), then return.
pub fn spin(gap: Duration) {
    let start = Instant::now();
    while start.elapsed() < gap {
        std::hint::spin_loop();
    }
}

/// Collective: like [`allreduce_time`], but before each all-reduce every rank spins for `gap`
/// (a stand-in for an iteration's compute: the core stays busy, as it would computing), and
/// only the all-reduces are timed.
pub fn allreduce_time_between(
    group: &dyn ProcessGroup,
    buf: &mut [f32],
    iters: u64,
    gap: Duration,
) -> Result<Duration, CommError> {
    group.barrier()?;
    let mut inside = Duration::ZERO;
    for _ in 0..iters {
        spin(gap);
        let start = Instant::now();
        group.all_reduce_slice(buf, ReduceOp::Sum)?;
        inside += start.elapsed();
    }
    let mine = inside.as_nanos() as u64;
    let all = group.all_gather_u64(&[mine])?;
    Ok(Duration::from_nanos(all.into_iter().max().unwrap_or(mine)))
}

/// Collective: all-reduce throughput in GB/s of a `len`-float buffer: one warm-up all-reduce,
/// then the best of `reps` repetitions of `iters` all-reduces, each timed on the slowest rank.
pub fn allreduce_gbps(
    group: &dyn ProcessGroup,
    len: usize,
    iters: u64,
    reps: usize,
) -> Result<f64, CommError> {
    allreduce_gbps_between(group, len, iters, reps, Duration::ZERO)
}

/// Collective: [`allreduce_gbps`] with every all-reduce after a `gap` of spinning (see
/// [`allreduce_time_between`]): the throughput, or for a tiny buffer the latency
/// (`4 * len / gbps` nanoseconds), of a collective issued between iterations of compute.
pub fn allreduce_gbps_between(
    group: &dyn ProcessGroup,
    len: usize,
    iters: u64,
    reps: usize,
    gap: Duration,
) -> Result<f64, CommError> {
    let mut buf = vec![group.rank() as f32; len];
    group.all_reduce_slice(&mut buf, ReduceOp::Sum)?;
    let mut best = Duration::MAX;
    for _ in 0..reps.max(1) {
        best = best.min(allreduce_time_between(group, &mut buf, iters, gap)?);
    }
    Ok(gbps(len * 4, iters, best))
}

/// A number of operations per repetition that takes tens of milliseconds for `len` floats.
pub fn default_iters(len: usize) -> u64 {
    match len {
        0..=4096 => 2000,
        4097..=1_048_576 => 50,
        _ => 10,
    }
}

/// `bytes * iters / time` in GB/s (10^9 bytes per second); 0 for a zero time.
pub fn gbps(bytes: usize, iters: u64, time: Duration) -> f64 {
    let secs = time.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    bytes as f64 * iters as f64 / secs / 1e9
}
