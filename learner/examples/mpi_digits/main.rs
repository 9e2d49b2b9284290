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
//! (4; DiLoCo's H), `--epochs N` (2), `--out DIR` (runs/mpi-digits),
//! `--on-rank-failure abort|continue|replace` (abort; the others need Open MPI 5 with ULFM,
//! `mpirun --with-ft ulfm`, and keep the strategy's state in `DIR/strategy`), `--kill-at R:S`
//! (rehearse a failure: the process that starts as rank R kills itself, `SIGKILL`, in its S-th
//! optimizer step; a replacement does not).
//!
//! Rank `r` (the process that started as rank `r`; a replacement takes its rank) writes into
//! `--out`: `rank-r.own.f32` (its own final parameters) and
//! `rank-r.averaged.f32` (the world average `launch` returned), each little-endian f32 in burn's
//! visiting order, and `rank-r.report.json` (every rank's optimizer steps and traffic).
//! `learner/tests/it/mpi.rs` checks them against the same run on two thread ranks.

mod digits;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::lr_scheduler::{LrScheduler, LrSchedulerRecord};
use localsgd_comm::mpi::{MpiConfig, MpiWorld};
use localsgd_learner::{LocalSgdStrategy, OnRankFailure, StrategyConfig};

struct Args {
    algorithm: String,
    warmup: u64,
    period: u64,
    epochs: usize,
    out: PathBuf,
    on_rank_failure: OnRankFailure,
    /// The rank whose process kills itself, and in which of its optimizer steps.
    kill_at: Option<(usize, usize)>,
}

/// The constant rate `digits::LR`; with `kill_at`, this process kills itself in that step.
#[derive(Clone)]
struct KillAt {
    step: Option<usize>,
    steps: Arc<AtomicUsize>,
}

impl LrScheduler for KillAt {
    fn step(&mut self) -> f64 {
        let n = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        if self.step == Some(n) {
            kill_this_process();
        }
        digits::LR
    }

    fn to_record(&self) -> LrSchedulerRecord {
        LrSchedulerRecord::new()
    }

    fn load_record(&mut self, _: LrSchedulerRecord) {}
}

/// `kill -9` of this process (`raise(SIGKILL)`).
fn kill_this_process() -> ! {
    unsafe extern "C" {
        fn raise(signal: std::ffi::c_int) -> std::ffi::c_int;
    }
    const SIGKILL: std::ffi::c_int = 9;
    // SAFETY: raising a signal has no preconditions; SIGKILL cannot be caught.
    unsafe { raise(SIGKILL) };
    std::process::abort()
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        algorithm: "post-local-sgd".into(),
        warmup: 10,
        period: 4,
        epochs: 2,
        out: PathBuf::from("runs/mpi-digits"),
        on_rank_failure: OnRankFailure::Abort,
        kill_at: None,
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
            "--on-rank-failure" => {
                args.on_rank_failure = value.parse::<OnRankFailure>().map_err(|e| e.to_string())?
            }
            "--kill-at" => {
                let parsed = value
                    .split_once(':')
                    .and_then(|(r, s)| Some((r.parse().ok()?, s.parse().ok()?)));
                args.kill_at = Some(parsed.ok_or_else(|| {
                    format!("--kill-at {value:?}: expected RANK:STEP, e.g. 1:20")
                })?);
            }
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
        if args.on_rank_failure.survives()
            && let Some(missing) = world.fault_tolerance_missing()
        {
            return Err(format!("--on-rank-failure needs ULFM: {missing}"));
        }
        let config = StrategyConfig::new(spec).with_on_rank_failure(args.on_rank_failure);
        let mut strategy = LocalSgdStrategy::with_group(config, group.clone(), digits::device())
            .map_err(|e| e.to_string())?;
        if args.on_rank_failure.survives() {
            strategy = strategy.with_directory(args.out.join("strategy"));
        }
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
    // The rehearsed failure: not a replacement's (it took the failed rank's place).
    let kill = KillAt {
        step: args
            .kill_at
            .filter(|&(r, _)| r == rank && !group.joined())
            .map(|(_, step)| step),
        steps: Arc::default(),
    };
    if let Err(e) = run(&args, strategy.clone(), rank, size, kill) {
        eprintln!(
            "error on rank {rank} of {size} ({}): {e}",
            world.processor_name()
        );
        world.abort(1);
    }
    // After a failure the world's communicator is revoked: meet the survivors and leave
    // without MPI_Finalize (returns when nothing failed).
    world.exit_after_failure(0);
    // MPI_Finalize, then the strategy's group (its communicator is gone with MPI).
    drop(world);
    drop(strategy);
}

fn run(
    args: &Args,
    strategy: Arc<LocalSgdStrategy>,
    rank: usize,
    size: usize,
    lr: KillAt,
) -> Result<(), String> {
    let dir = args.out.join(format!("rank-{rank}"));
    let started = std::time::Instant::now();
    let result = digits::train_scheduled(&dir, strategy.clone(), args.epochs, lr)?;
    let took = started.elapsed().as_secs_f64();
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
         collectives; the world average classifies {:.2}% of the test digits; training took \
         {took:.3} s",
        args.algorithm,
        args.epochs,
        mine.bytes,
        mine.collectives,
        100.0 * accuracy
    );
    Ok(())
}
