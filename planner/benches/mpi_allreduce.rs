//! All-reduce throughput: MPI (2 ranks under `mpirun`, shared memory) against the thread
//! backend (2 workers in one process), at 1M and 16M f32.
//!
//! Run with `cargo bench -p localsgd-planner --features mpi --bench mpi_allreduce` (needs Open
//! MPI's `mpirun`). Throughput is buffer bytes / time per all-reduce, best of 5 repetitions,
//! slowest rank. MPI initialises once per process, so the MPI side runs the `mpi_bench` driver.

use localsgd_comm::ThreadWorld;
use localsgd_planner::measure::throughput::{allreduce_gbps, default_iters};
use std::process::Command;

const SIZES: [usize; 2] = [1 << 20, 16 << 20];

/// Thread backend, 2 workers: GB/s by the same definition as `mpi_bench`.
fn thread_gbps(len: usize) -> f64 {
    ThreadWorld::new(2)
        .expect("2 workers")
        .run(|g| allreduce_gbps(g.as_ref(), len, default_iters(len), 5).expect("all-reduce"))
        .expect("no worker panics")[0]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "mpi_allreduce: benchmark only; run `cargo bench -p localsgd-planner --features mpi --bench mpi_allreduce`"
        );
        return;
    }
    let out = Command::new("mpirun")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--oversubscribe",
            "-np",
            "2",
            env!("CARGO_BIN_EXE_mpi_bench"),
        ])
        .output()
        .expect("run mpirun (is OpenMPI installed?)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mpi_bench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "{:>10} {:>12} {:>12} {:>12} {:>12}",
        "floats", "mpi us", "mpi GB/s", "threads us", "threads GB/s"
    );
    for len in SIZES {
        let mpi_gbps = text
            .lines()
            .find(|l| l.contains(&format!("floats={len} ")))
            .and_then(|l| l.rsplit("throughput_gbps=").next())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("a BENCH line for every size");
        let threads = thread_gbps(len);
        println!(
            "{len:>10} {:>12.1} {mpi_gbps:>12.2} {:>12.1} {threads:>12.2}",
            (len * 4) as f64 / mpi_gbps / 1e3,
            (len * 4) as f64 / threads / 1e3,
        );
    }
}
