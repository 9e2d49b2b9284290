//! `mpi_bench [--signature-check]`: the MPI all-reduce throughput benchmark's driver, launched
//! under `mpirun` by `benches/mpi_allreduce.rs` (MPI initialises once per process, so MPI runs
//! as separate processes). Every rank all-reduces 1 f32 (latency), 1M and 16M f32, by the
//! definitions of `localsgd_planner::measure::throughput`; rank 0 prints one line per size:
//!
//! ```text
//! BENCH mpi ranks=2 signature_check=false floats=1048576 time_per_allreduce_us=812.3 throughput_gbps=5.16
//! ```
//!
//! On an error a rank prints `FAIL <message>` and exits with code 1.

use localsgd_comm::mpi::{MpiConfig, MpiWorld};
use localsgd_planner::measure::throughput::{allreduce_gbps, default_iters};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut signature_check = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--signature-check" => signature_check = true,
            other => {
                println!("FAIL unknown argument {other:?}; valid: --signature-check");
                return ExitCode::FAILURE;
            }
        }
    }
    match bench(signature_check) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            println!("FAIL {message}");
            ExitCode::FAILURE
        }
    }
}

fn bench(signature_check: bool) -> Result<(), String> {
    let (_world, g) =
        MpiWorld::init_with(MpiConfig::default().with_signature_check(signature_check))
            .map_err(|e| format!("MpiWorld::init: {e}"))?;
    for len in [1usize, 1 << 20, 16 << 20] {
        let iters = default_iters(len);
        let gbps = allreduce_gbps(g.as_ref(), len, iters, 5).map_err(|e| e.to_string())?;
        if g.rank() == 0 {
            println!(
                "BENCH mpi ranks={} signature_check={signature_check} floats={len} \
                 time_per_allreduce_us={:.1} throughput_gbps={gbps:.2}",
                g.size(),
                (len * 4) as f64 / (gbps * 1e9) * 1e6,
            );
        }
    }
    Ok(())
}
