//! `localsgd bench-comm` (part of the binary): all-reduce throughput of a backend against this
//! machine's single-thread memcpy bandwidth, measured in the same run, with the definitions of
//! `localsgd_comm::throughput` (the criterion benches use the same ones).
//!
//! Threads (default): every worker count of `--workers` in this process. MPI (`--backend mpi`,
//! binary built with the `mpi` feature, under `mpirun -np N`) or NCCL (`--backend nccl`, feature
//! `nccl`, one process per GPU started with `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`):
//! the N ranks; rank 0 prints.

use anyhow::{Context, Result, bail};
use localsgd_comm::ThreadWorld;
use localsgd_comm::throughput::{allreduce_gbps_between, default_iters, memcpy_gbps};
use localsgd_trainer::config::Backend;
use std::path::PathBuf;
use std::time::Duration;

/// Largest `--gap-us`: one second.
const MAX_GAP_US: u64 = 1_000_000;

/// The `--gap-us` rule of `bench-comm` and `bench-step`: 0 (none) up to [`MAX_GAP_US`].
pub(crate) fn check_gap_us(gap_us: u64) -> Result<()> {
    if gap_us > MAX_GAP_US {
        bail!("invalid --gap-us {gap_us}: give 0 (none) up to {MAX_GAP_US} microseconds");
    }
    Ok(())
}

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
}

impl BenchCommFlags {
    fn gap(&self) -> Duration {
        Duration::from_micros(self.gap_us)
    }

    /// All-reduces per repetition: [`default_iters`], fewer with a gap so that a repetition
    /// spins for about a second at most (at least 10).
    fn iters(&self, floats: usize) -> u64 {
        let iters = default_iters(floats);
        if self.gap_us == 0 {
            return iters;
        }
        iters.min((MAX_GAP_US / self.gap_us).max(10))
    }

    fn allreduce_gbps(
        &self,
        group: &dyn localsgd_comm::ProcessGroup,
        floats: usize,
    ) -> Result<f64, localsgd_comm::CommError> {
        allreduce_gbps_between(group, floats, self.iters(floats), self.reps, self.gap())
    }
}

struct Row {
    backend: &'static str,
    workers: usize,
    floats: usize,
    gbps: f64,
    memcpy_gbps: f64,
}

impl Row {
    /// Microseconds per all-reduce (the slowest rank's, best repetition). For a 1-float buffer
    /// between `--gap-us` spins, close to `localsgd plan --latency-us` with a core per rank;
    /// with more ranks than cores `bench-step`'s cycle measures that instead (it sees the wait
    /// for descheduled ranks).
    fn micros(&self) -> f64 {
        if self.gbps > 0.0 {
            self.floats as f64 * 4.0 / (self.gbps * 1e9) * 1e6
        } else {
            f64::INFINITY
        }
    }
}

pub(crate) fn run(flags: &BenchCommFlags) -> Result<()> {
    if flags.floats.is_empty() || flags.floats.contains(&0) {
        bail!(
            "invalid --floats {:?}: give one or more positive buffer lengths",
            flags.floats
        );
    }
    if flags.reps == 0 {
        bail!("invalid --reps 0: at least 1 repetition");
    }
    check_gap_us(flags.gap_us)?;
    crate::launch::check_backend_built(flags.backend)?;
    let rows = match flags.backend {
        Backend::Threads => threads(flags)?,
        Backend::Mpi | Backend::Nccl => process(flags, flags.backend)?,
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
            r.gbps,
            r.memcpy_gbps,
            r.gbps / r.memcpy_gbps,
            r.micros()
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
        let json: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "backend": r.backend,
                    "workers": r.workers,
                    "floats": r.floats,
                    "allreduce_gbps": r.gbps,
                    "memcpy_gbps": r.memcpy_gbps,
                    "ratio": r.gbps / r.memcpy_gbps,
                    "allreduce_us": r.micros(),
                    "gap_us": flags.gap_us,
                })
            })
            .collect();
        localsgd_trainer::atomic::write_atomic(
            path,
            format!("{:#}\n", serde_json::Value::from(json)),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn threads(flags: &BenchCommFlags) -> Result<Option<Vec<Row>>> {
    if flags.workers.is_empty() || flags.workers.contains(&0) {
        bail!(
            "invalid --workers {:?}: give one or more positive worker counts",
            flags.workers
        );
    }
    let mut rows = Vec::new();
    for &floats in &flags.floats {
        let memcpy = memcpy_gbps(floats, default_iters(floats), flags.reps);
        for &workers in &flags.workers {
            let results =
                ThreadWorld::new(workers)?.run(|g| flags.allreduce_gbps(g.as_ref(), floats));
            let gbps = results
                .map_err(|p| anyhow::anyhow!("worker {} panicked: {}", p.rank, p.message))?
                .into_iter()
                .next()
                .context("no worker results")??;
            rows.push(Row {
                backend: "threads",
                workers,
                floats,
                gbps,
                memcpy_gbps: memcpy,
            });
        }
    }
    Ok(Some(rows))
}

#[cfg(any(feature = "mpi", feature = "nccl"))]
fn process(flags: &BenchCommFlags, backend: Backend) -> Result<Option<Vec<Row>>> {
    let world =
        crate::process_world::ProcessWorld::start(backend, localsgd_comm::thread::DEFAULT_TIMEOUT)?;
    let group = world.group.clone();
    // Rank 0 measures memcpy first, while the other ranks wait in the first collective.
    let memcpy: Vec<f64> = if group.rank() == 0 {
        flags
            .floats
            .iter()
            .map(|&f| memcpy_gbps(f, default_iters(f), flags.reps))
            .collect()
    } else {
        Vec::new()
    };
    let mut rows = Vec::new();
    for (i, &floats) in flags.floats.iter().enumerate() {
        let gbps = match flags.allreduce_gbps(group.as_ref(), floats) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("error on rank {}: {e}", group.rank());
                world.abort(2);
            }
        };
        if group.rank() == 0 {
            rows.push(Row {
                backend: group.backend(),
                workers: group.size(),
                floats,
                gbps,
                memcpy_gbps: memcpy[i],
            });
        }
    }
    let rank = group.rank();
    drop(group);
    world.finish();
    Ok((rank == 0).then_some(rows))
}

#[cfg(not(any(feature = "mpi", feature = "nccl")))]
fn process(_flags: &BenchCommFlags, backend: Backend) -> Result<Option<Vec<Row>>> {
    // Unreachable in practice: `run` refused the backend already.
    bail!(
        "invalid --backend {}: not available in this binary",
        backend.name()
    )
}
