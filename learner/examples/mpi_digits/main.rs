//! One rank per process: `LocalSgdStrategy::with_group` on an MPI world, under `mpirun`. Every
//! process initialises MPI, runs the same burn-train `SupervisedTraining` (the bundled digits, a
//! 64-64-10 MLP, SGD with momentum) with the strategy as one rank of the world, and writes what
//! it ended with.
//!
//! ```text
//! cargo build --workspace --example mpi_digits --features localsgd-learner/mpi  # needs Open MPI, libclang
//! mpirun -np 2 target/debug/examples/mpi_digits --algorithm diloco --out runs/mpi-digits
//! ```
//!
//! Flags: `--algorithm ddp|local-sgd|post-local-sgd|hierarchical|diloco|streaming-diloco|slowmo`
//! (post-local-sgd; hierarchical averages pairs every period and the world every two, slowmo
//! takes its slow momentum step every two, streaming-diloco syncs 2 fragments), `--warmup N`
//! (10 optimizer steps of gradient all-reduce first; not for ddp and local-sgd), `--period N`
//! (4; DiLoCo's H), `--epochs N` (2), `--out DIR` (runs/mpi-digits).
//!
//! Rank `r` writes into `--out`: `rank-r.own.f32` (its own final parameters) and
//! `rank-r.averaged.f32` (the world average `launch` returned), each little-endian f32 in burn's
//! visiting order, and `rank-r.report.json` (every rank's optimizer steps and traffic).
//! `learner/tests/it/mpi.rs` checks them against the same run on two thread ranks.

mod digits;

use std::path::PathBuf;
use std::sync::Arc;

use localsgd_comm::mpi::{MpiConfig, MpiWorld};
use localsgd_learner::{LocalSgdStrategy, StrategyConfig};

struct Args {
    algorithm: String,
    warmup: u64,
    period: u64,
    epochs: usize,
    out: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        algorithm: "post-local-sgd".into(),
        warmup: 10,
        period: 4,
        epochs: 2,
        out: PathBuf::from("runs/mpi-digits"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} {v:?}: expected a non-negative integer"))
        };
        match flag.as_str() {
            "--algorithm" => args.algorithm = value,
            "--warmup" => args.warmup = number(&value)?,
            "--period" => args.period = number(&value)?,
            "--epochs" => args.epochs = number(&value)? as usize,
            "--out" => args.out = PathBuf::from(value),
            other => return Err(format!("unknown flag {other}; see the example's docs")),
        }
    }
    Ok(args)
}

fn main() {
    // MPI first, before burn or anything else starts threads.
    let (world, group) = match MpiWorld::init_with(MpiConfig::default()) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: starting MPI: {e}");
            std::process::exit(1);
        }
    };
    let (rank, size) = (group.rank(), group.size());
    // Errors every rank meets alike before training (flags, settings, the output directory):
    // rank 0 prints them and every rank leaves MPI normally.
    let prepared = parse_args().and_then(|args| {
        let spec = digits::spec(&args.algorithm, size, args.warmup, args.period)?;
        let strategy =
            LocalSgdStrategy::with_group(StrategyConfig::new(spec), group, digits::device())
                .map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&args.out)
            .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
        Ok((args, Arc::new(strategy)))
    });
    let (args, strategy) = match prepared {
        Ok(p) => p,
        Err(e) => {
            if rank == 0 {
                eprintln!("error: {e}");
            }
            drop(world);
            std::process::exit(2);
        }
    };
    // From here on a rank that fails alone would leave its peers waiting in a collective:
    // MPI_Abort ends the whole job.
    if let Err(e) = run(&args, strategy.clone(), rank, size) {
        eprintln!(
            "error on rank {rank} of {size} ({}): {e}",
            world.processor_name()
        );
        world.abort(1);
    }
    // MPI_Finalize, then the strategy's group (its communicator is gone with MPI).
    drop(world);
    drop(strategy);
}

fn run(
    args: &Args,
    strategy: Arc<LocalSgdStrategy>,
    rank: usize,
    size: usize,
) -> Result<(), String> {
    let dir = args.out.join(format!("rank-{rank}"));
    let result = digits::train(&dir, strategy.clone(), args.epochs)?;
    if let Some(e) = result.error {
        return Err(format!("training failed: {e}"));
    }
    let own = strategy
        .rank_models::<digits::Net>()
        .and_then(|m| m.into_iter().next())
        .ok_or("the strategy kept no model of this rank")?;
    let report = strategy.report().ok_or("the strategy has no report")?;
    let write = |path: PathBuf, values: &[f32]| {
        digits::write_f32(&path, values)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write(digits::own_file(&args.out, rank), &digits::params(&own))?;
    write(
        digits::averaged_file(&args.out, rank),
        &digits::params(&result.model),
    )?;
    let path = digits::report_file(&args.out, rank);
    let json =
        serde_json::to_string_pretty(&digits::report_json(&report)).map_err(|e| e.to_string())?;
    std::fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let accuracy = digits::accuracy(&result.model)?;
    let steps = report.ranks.get(rank).map_or(0, |r| r.iterations);
    let mine = report
        .ranks
        .get(rank)
        .map(|r| r.traffic)
        .unwrap_or_default();
    println!(
        "rank {rank} of {size}: {} for {} epochs, {steps} optimizer steps, sent {} bytes in {} \
         collectives; the world average classifies {:.2}% of the test digits",
        args.algorithm,
        args.epochs,
        mine.bytes,
        mine.collectives,
        100.0 * accuracy
    );
    Ok(())
}
