//! `localsgd bench-comm` (part of the binary): all-reduce throughput of a backend against this
//! machine's single-thread memcpy bandwidth, measured in the same run by
//! `localsgd_planner::measure::CommBench` (the criterion benches use the same definitions).
//!
//! Threads (default): every worker count of `--workers` in this process. MPI (`--backend mpi`,
//! binary built with the `mpi` feature, under `mpirun -np N`) or NCCL (`--backend nccl`, feature
//! `nccl`, one process per GPU started with `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`):
//! the N ranks; rank 0 prints.
//!
//! `--wire f32,fp16,int8,int8-gather,...` times one average in each wire format instead
//! (`bench_wire.rs`): the f32 all-reduce, half precision, and the lossy codecs through the
//! quantized all-reduce or (`-gather`) the all-gather of whole messages.

use anyhow::{Context, Result};
use localsgd_planner::measure::{CommBench, CommRow};
use localsgd_trainer::config::Backend;
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `localsgd bench-comm`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchCommFlags {
    /// Backend to measure.
    #[arg(long, value_enum, default_value = "threads")]
    backend: Backend,
    /// Worker counts for the thread backend, comma-separated (MPI and NCCL use the world size).
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    workers: Vec<usize>,
    /// Buffer lengths in f32 values, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1048576,16777216")]
    floats: Vec<usize>,
    /// Repetitions per measurement (the best one counts).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Spin this many microseconds on every rank before each all-reduce, as an iteration's
    /// compute would, and time only the all-reduces: what a collective costs between
    /// iterations rather than back to back (0: back to back; at most 1,000,000).
    #[arg(long, default_value_t = 0)]
    gap_us: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Time one average in each of these wire formats instead of the f32 all-reduce's
    /// throughput: f32, fp16, bf16, or a lossy codec (int8, int4, topk:F[+int8|+int4]; chunk
    /// 1024) through the quantized all-reduce, or with `-gather` its messages all-gathered.
    #[arg(long, value_delimiter = ',')]
    wire: Vec<crate::bench_wire::Wire>,
}

impl BenchCommFlags {
    /// The measurement the flags ask for, each checked.
    fn bench(&self) -> Result<CommBench> {
        Ok(CommBench::new(
            self.floats.clone(),
            self.reps,
            Duration::from_micros(self.gap_us),
        )?)
    }
}

pub(crate) fn run(flags: &BenchCommFlags) -> Result<()> {
    let bench = flags.bench()?;
    crate::launch::check_backend_built(flags.backend)?;
    if !flags.wire.is_empty() {
        return wire(flags);
    }
    let rows = match flags.backend {
        Backend::Threads => Some(bench.threads(&flags.workers)?),
        Backend::Mpi | Backend::Nccl => process(&bench, flags.backend)?,
    };
    let Some(rows) = rows else {
        return Ok(()); // a rank other than 0 of a one-process-per-rank backend
    };
    println!(
        "{:<8} {:>7} {:>10} {:>14} {:>14} {:>8} {:>14}",
        "backend", "workers", "floats", "all-reduce GB/s", "memcpy GB/s", "ratio", "µs/all-reduce"
    );
    for r in &rows {
        println!(
            "{:<8} {:>7} {:>10} {:>14.2} {:>14.2} {:>8.2} {:>14.1}",
            r.backend,
            r.workers,
            r.floats,
            r.allreduce_gbps,
            r.memcpy_gbps,
            r.ratio(),
            r.allreduce_us()
        );
    }
    println!(
        "(all-reduce: buffer bytes / time per in-place sum, slowest rank, best of {}, {}; memcpy: one thread)",
        flags.reps,
        if flags.gap_us == 0 {
            "back to back".to_string()
        } else {
            format!("each after {} µs of spinning", flags.gap_us)
        }
    );
    if let Some(path) = &flags.json {
        let json: Vec<_> = rows.iter().map(|r| row_json(r, flags.gap_us)).collect();
        localsgd_pipeline::atomic::write_atomic(
            path,
            format!("{:#}\n", serde_json::Value::from(json)),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `--wire`: every format on each thread world, or on this process's world (rank 0 prints).
fn wire(flags: &BenchCommFlags) -> Result<()> {
    use crate::bench_wire::{measure, print};
    let rows = match flags.backend {
        Backend::Threads => {
            let mut rows = Vec::new();
            for &w in &flags.workers {
                let world = localsgd_comm::ThreadWorld::new(w)?;
                let mut per_rank = world
                    .run(|group| measure(&group, &flags.wire, &flags.floats, flags.reps))
                    .map_err(|p| anyhow::anyhow!("rank {} panicked: {}", p.rank, p.message))?;
                rows.extend(per_rank.swap_remove(0)?);
            }
            Some(rows)
        }
        Backend::Mpi | Backend::Nccl => wire_process(flags)?,
    };
    let Some(rows) = rows else {
        return Ok(());
    };
    print(&rows)?;
    if let Some(path) = &flags.json {
        let json: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "wire": r.wire,
                    "workers": r.workers,
                    "floats": r.floats,
                    "seconds": r.seconds,
                    "wire_bytes": r.wire_bytes,
                })
            })
            .collect();
        localsgd_pipeline::atomic::write_atomic(
            path,
            format!("{:#}\n", serde_json::Value::from(json)),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(any(feature = "mpi", feature = "nccl"))]
fn wire_process(flags: &BenchCommFlags) -> Result<Option<Vec<crate::bench_wire::WireRow>>> {
    let world = crate::process_world::ProcessWorld::start(
        flags.backend,
        localsgd_comm::thread::DEFAULT_TIMEOUT,
    )?;
    let group = world.group.clone();
    let rows = match crate::bench_wire::measure(&group, &flags.wire, &flags.floats, flags.reps) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("error on rank {}: {e}", group.rank());
            world.abort(2);
        }
    };
    let rank = group.rank();
    drop(group);
    world.finish();
    Ok((rank == 0).then_some(rows))
}

#[cfg(not(any(feature = "mpi", feature = "nccl")))]
fn wire_process(flags: &BenchCommFlags) -> Result<Option<Vec<crate::bench_wire::WireRow>>> {
    anyhow::bail!(
        "invalid --backend {}: not available in this binary",
        flags.backend.name()
    )
}

fn row_json(r: &CommRow, gap_us: u64) -> serde_json::Value {
    serde_json::json!({
        "backend": r.backend,
        "workers": r.workers,
        "floats": r.floats,
        "allreduce_gbps": r.allreduce_gbps,
        "memcpy_gbps": r.memcpy_gbps,
        "ratio": r.ratio(),
        "allreduce_us": r.allreduce_us(),
        "gap_us": gap_us,
    })
}

/// One rank of a process backend's world: every rank measures; rank 0 gets the rows.
#[cfg(any(feature = "mpi", feature = "nccl"))]
fn process(bench: &CommBench, backend: Backend) -> Result<Option<Vec<CommRow>>> {
    let world =
        crate::process_world::ProcessWorld::start(backend, localsgd_comm::thread::DEFAULT_TIMEOUT)?;
    let group = world.group.clone();
    let rows = match bench.group(group.as_ref()) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("error on rank {}: {e}", group.rank());
            world.abort(2);
        }
    };
    drop(group);
    world.finish();
    Ok(rows)
}

#[cfg(not(any(feature = "mpi", feature = "nccl")))]
fn process(_bench: &CommBench, backend: Backend) -> Result<Option<Vec<CommRow>>> {
    // Unreachable in practice: `run` refused the backend already.
    anyhow::bail!(
        "invalid --backend {}: not available in this binary",
        backend.name()
    )
}
