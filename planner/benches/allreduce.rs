//! All-reduce throughput of the thread backend against this machine's single-thread memcpy
//! bandwidth, measured in the same run.
//!
//! Target (issue 2): at 16M floats and 2 workers, all-reduce throughput (buffer bytes / time) at
//! least half the memcpy bandwidth (bytes copied / time). Run with
//! `cargo bench -p localsgd-planner --bench allreduce`.

use criterion::{Criterion, Throughput};
use localsgd_comm::ThreadWorld;
use localsgd_planner::measure::throughput::{
    allreduce_time as group_allreduce_time, gbps, memcpy_time,
};
use std::time::Duration;

const N: usize = 16 << 20;

/// `iters` all-reduces of `len` floats on `workers` threads; the slowest worker's time.
fn allreduce_time(workers: usize, len: usize, iters: u64) -> Duration {
    let times = ThreadWorld::new(workers)
        .expect("workers > 0")
        .run(|g| {
            let mut buf = vec![g.rank() as f32; len];
            group_allreduce_time(g.as_ref(), &mut buf, 1).expect("warm-up all-reduce");
            group_allreduce_time(g.as_ref(), &mut buf, iters).expect("all-reduce")
        })
        .expect("no worker panics");
    times.into_iter().max().unwrap_or_default()
}

fn best_of(reps: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..reps).map(|_| f()).min().unwrap_or_default()
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    let bytes = N * 4;
    {
        let mut g = c.benchmark_group("memcpy");
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function("16M f32", |b| b.iter_custom(|iters| memcpy_time(N, iters)));
        g.finish();
    }
    {
        let mut g = c.benchmark_group("thread_allreduce");
        g.throughput(Throughput::Bytes(bytes as u64));
        for workers in [2, 4] {
            g.bench_function(format!("16M f32, {workers} workers"), |b| {
                b.iter_custom(|iters| allreduce_time(workers, N, iters))
            });
        }
        g.throughput(Throughput::Bytes(4 << 20));
        g.bench_function("1M f32, 2 workers", |b| {
            b.iter_custom(|iters| allreduce_time(2, 1 << 20, iters))
        });
        g.finish();
    }
    c.final_summary();

    // The ratio the issue asks for, from one run: best of 5 repetitions of 10 operations each.
    let memcpy = gbps(bytes, 10, best_of(5, || memcpy_time(N, 10)));
    let allreduce = gbps(bytes, 10, best_of(5, || allreduce_time(2, N, 10)));
    println!(
        "16M f32: memcpy {memcpy:.2} GB/s, thread all-reduce (2 workers) {allreduce:.2} GB/s, ratio {:.2} (target >= 0.5)",
        allreduce / memcpy
    );
}
