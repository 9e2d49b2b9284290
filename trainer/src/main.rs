//! `localsgd`: train with post-local SGD (and friends) on W workers.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use localsgd_trainer::checkpoint::CheckpointDir;
use localsgd_trainer::cli::ConfigFlags;
use localsgd_trainer::config::{AlgorithmKind, Backend, TrainConfig};
use localsgd_trainer::export::{ExportChoice, export_run};
use localsgd_trainer::plot::write_loss_svg;
use localsgd_trainer::run::{self, Progress, RunTotals, WorkerResult};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "localsgd",
    version,
    about = "Communication-efficient data-parallel training: DDP, local SGD, post-local SGD, hierarchical averaging."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train the MLP (defaults: 2 thread workers, post-local SGD, bundled digits data).
    Train(ConfigFlags),
    /// Run ddp, post-local-sgd, hierarchical, diloco, streaming-diloco and slowmo on the same data and seed; print one table.
    Compare(ConfigFlags),
    /// Measure all-reduce throughput against this machine's memcpy bandwidth.
    BenchComm(bench_comm::BenchCommFlags),
    /// Time a bare burn training step (no pipeline, no communication) on a run's model and data.
    BenchStep(bench_step::BenchStepFlags),
    /// Predict time and bytes per iteration of each algorithm on a layout and link (cost model).
    Plan(plan_cmd::PlanFlags),
    /// Write a run's trained model (world-averaged, or one rank's) as PyTorch safetensors.
    Export(ExportFlags),
}

/// `localsgd export RUN_DIR FILE [--rank R]`.
#[derive(clap::Args)]
struct ExportFlags {
    /// A run directory written by `localsgd train` (config.toml and checkpoints/).
    run_dir: PathBuf,
    /// The safetensors file to write (PyTorch `state_dict` names and layout).
    file: PathBuf,
    /// Export this rank's own model instead of the world average.
    #[arg(long, allow_negative_numbers = true)]
    rank: Option<usize>,
}

mod bench_comm;
mod bench_step;
mod plan_cmd;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod process_train;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod process_world;

fn main() {
    // Library warnings (e.g. "period 1: plain DDP is the better choice") go through `tracing`.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    if let Err(e) = run_cli() {
        eprintln!("error: {}", describe(&e));
        std::process::exit(2);
    }
}

/// An error and its causes on one line, each cause once: our error messages already quote
/// their sources (`init-weights: FILE: invalid safetensors data: header too large`), so a
/// cause whose text the line already holds is not repeated.
pub(crate) fn describe(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn run_cli() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Train(flags) => train(&flags),
        Command::Compare(flags) => compare(&flags),
        Command::BenchComm(flags) => bench_comm::run(&flags),
        Command::BenchStep(flags) => bench_step::run(&flags),
        Command::Plan(flags) => plan_cmd::run(&flags),
        Command::Export(flags) => export(&flags),
    }
}

fn export(flags: &ExportFlags) -> Result<()> {
    let choice = match flags.rank {
        Some(r) => ExportChoice::Rank(r),
        None => ExportChoice::WorldAverage,
    };
    let done = export_run(&flags.run_dir, &flags.file, choice)?;
    println!(
        "exported {} of {} ranks after {} iterations (checkpoint {}) to {}",
        done.choice,
        done.world_size,
        done.iterations,
        done.checkpoint.display(),
        flags.file.display()
    );
    Ok(())
}

/// The validated settings, with a backend this binary has.
fn resolve(flags: &ConfigFlags) -> Result<TrainConfig> {
    let cfg = resolve_settings(flags)?;
    check_backend_built(cfg.backend)?;
    Ok(cfg)
}

/// The settings (file, then flags), validated.
fn resolve_settings(flags: &ConfigFlags) -> Result<TrainConfig> {
    let cfg = flags.resolve().map_err(anyhow::Error::msg)?;
    cfg.validate()?;
    Ok(cfg)
}

/// Refuse a backend this binary was built without, naming the feature that brings it.
fn check_backend_built(backend: Backend) -> Result<()> {
    match backend {
        Backend::Mpi if !cfg!(feature = "mpi") => bail!(
            "invalid setting `backend` = mpi: this binary was built without MPI support; rebuild with `cargo build -p localsgd-trainer --features mpi` and launch under mpirun, or use `backend = \"threads\"`"
        ),
        Backend::Nccl if !cfg!(feature = "nccl") => bail!(
            "invalid setting `backend` = nccl: this binary was built without NCCL support; rebuild with `cargo build -p localsgd-trainer --features nccl` and start one process per GPU with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (e.g. by `torchrun --no-python`), or use `backend = \"threads\"`"
        ),
        _ => Ok(()),
    }
}

fn progress_bar(cfg: &TrainConfig) -> Option<Progress> {
    if !cfg.progress {
        return None;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} iterations {msg} [{elapsed}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(Box::new(move |done, total, loss| {
        bar.set_length(total);
        bar.set_position(done);
        if let Some(l) = loss {
            bar.set_message(format!("loss {l:.4}"));
        }
        if done == total {
            bar.finish_and_clear();
        }
    }))
}

fn train(flags: &ConfigFlags) -> Result<()> {
    let cfg = resolve(flags)?;
    if cfg.backend != Backend::Threads {
        // `resolve` refused a backend this binary was built without.
        #[cfg(any(feature = "mpi", feature = "nccl"))]
        return process_train::train(flags, cfg);
    }
    let data = run::load_data(&cfg).context("loading the data set")?;
    // A model the data cannot feed (a CNN on non-square inputs), or an `init-weights` file
    // that does not fit it, is refused before the run directory is touched.
    run::preflight(&cfg, &data.train)?;
    let dir = prepare_run_dir(&cfg)?;
    let started = Instant::now();
    let results = run::train_threads(&cfg, &data, Some(&dir), progress_bar(&cfg))?;
    let wall = started.elapsed();
    let r0 = results.first().context("no worker results")?;
    report(&cfg, r0, RunTotals::of(&results), wall.as_secs_f64(), &dir)
}

/// Create the run directory and save the effective configuration. Called only once everything
/// is validated (and, under MPI, only by rank 0).
fn prepare_run_dir(cfg: &TrainConfig) -> Result<PathBuf> {
    let dir = cfg.run_dir.clone();
    if cfg.resume {
        // Refuse a checkpoint of another run before anything in its directory is rewritten
        // (config.toml would otherwise describe the refused settings).
        let spec = localsgd_trainer::algorithm::AlgorithmSpec::from_config(cfg)?;
        let identity = run::run_identity(&spec, cfg.workers);
        CheckpointDir::new(&dir).check_latest(&identity)?;
    }
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating run directory {}", dir.display()))?;
    let effective = cfg.to_toml();
    println!(
        "# effective configuration (saved to {})\n{effective}",
        dir.join("config.toml").display()
    );
    localsgd_trainer::atomic::write_atomic(&dir.join("config.toml"), &effective)
        .with_context(|| format!("writing {}", dir.join("config.toml").display()))?;
    Ok(dir)
}

fn report(
    cfg: &TrainConfig,
    r0: &WorkerResult,
    totals: RunTotals,
    wall: f64,
    dir: &Path,
) -> Result<()> {
    let RunTotals {
        bytes,
        data_bytes,
        collectives,
        samples,
        ranks,
    } = totals;
    println!(
        "trained {} iterations on {} workers ({:?}, {:?} backend) in {:.2}s: {:.0} samples/s",
        r0.iterations,
        cfg.workers,
        cfg.algorithm,
        cfg.backend,
        wall,
        samples as f64 / wall
    );
    println!(
        "communication: {collectives} collectives, {:.2} MB (all ranks; {:.2} MB of it gradients/parameters/losses, the rest control flags); skipped optimizer steps: {}",
        bytes as f64 / 1e6,
        data_bytes as f64 / 1e6,
        r0.skipped_steps
    );
    let total = r0.phase_times.total().as_secs_f64().max(1e-9);
    let phases: Vec<String> = r0
        .phase_times
        .iter()
        .map(|(p, d)| format!("{} {:.0}%", p.name(), 100.0 * d.as_secs_f64() / total))
        .collect();
    println!("rank 0 phase times: {}", phases.join(", "));
    if let Some(l) = r0.last_global_loss {
        println!("final mean training loss: {l:.4}");
    }
    println!(
        "test accuracy: {:.2}% (world-averaged model; rank 0's own model: {:.2}%)",
        100.0 * r0.test_accuracy,
        100.0 * r0.local_test_accuracy
    );
    println!("{}", rank_results(r0, &ranks));
    let svg = dir.join("loss.svg");
    write_loss_svg(
        &svg,
        &[("rank 0 loss".to_string(), r0.loss_curve.clone())],
        "training loss",
    )?;
    let summary = serde_json::json!({
        "test_accuracy": r0.test_accuracy,
        "test_loss": r0.test_loss,
        "rank0_test_accuracy": r0.local_test_accuracy,
        "ranks": ranks.iter().enumerate().map(|(rank, e)| serde_json::json!({
            "rank": rank,
            "test_accuracy": e.accuracy,
            "test_loss": e.loss,
        })).collect::<Vec<_>>(),
        "iterations": r0.iterations,
        "workers": cfg.workers,
        "backend": cfg.backend,
        "algorithm": cfg.algorithm,
        "bytes": bytes,
        "data_bytes": data_bytes,
        "collectives": collectives,
        "wall_seconds": wall,
        "samples_per_second": samples as f64 / wall,
        "skipped_steps": r0.skipped_steps,
        "phase_seconds": r0.phase_times.iter().map(|(p, d)| (p.name().to_string(), serde_json::json!(d.as_secs_f64()))).collect::<serde_json::Map<_, _>>(),
    });
    localsgd_trainer::atomic::write_atomic(&dir.join("summary.json"), format!("{summary:#}\n"))?;
    if let Some(path) = &cfg.export {
        let choice = match cfg.export_rank {
            Some(r) => ExportChoice::Rank(r),
            None => ExportChoice::WorldAverage,
        };
        println!(
            "exported {choice} to {} (PyTorch state_dict layout)",
            path.display()
        );
    }
    println!(
        "run directory: {} (config.toml, metrics, loss.svg, summary.json, model.safetensors, checkpoints/)",
        dir.display()
    );
    Ok(())
}

/// The test loss of the averaged model and each rank's own model's accuracy and loss, on one
/// line (the first 8 ranks; `summary.json` has all of them).
fn rank_results(r0: &WorkerResult, ranks: &[run::Evaluation]) -> String {
    const SHOWN: usize = 8;
    let mut parts: Vec<String> = ranks
        .iter()
        .take(SHOWN)
        .enumerate()
        .map(|(rank, e)| format!("rank {rank} {:.2}% / {:.4}", 100.0 * e.accuracy, e.loss))
        .collect();
    if ranks.len() > SHOWN {
        parts.push(format!("… {} more in summary.json", ranks.len() - SHOWN));
    }
    format!(
        "test loss: {:.4} (world-averaged model); each rank's own model, accuracy / loss: {}",
        r0.test_loss,
        parts.join(", ")
    )
}

fn compare(flags: &ConfigFlags) -> Result<()> {
    let base = resolve_settings(flags)?;
    if base.backend != Backend::Threads {
        bail!(
            "invalid setting `backend` = {} for `compare`: it runs the algorithms one after another with thread workers in this process; drop the setting (or set `backend = \"threads\"`)",
            base.backend.name()
        );
    }
    if let Some(path) = &base.export {
        bail!(
            "invalid setting `export` = {} for `compare`: it trains six models, one per algorithm; export one run's with `localsgd train --export FILE` or `localsgd export RUN_DIR FILE`",
            path.display()
        );
    }
    let data = run::load_data(&base).context("loading the data set")?;
    println!(
        "comparing on {:?} with {} workers, seed {}, batch {} per worker",
        base.dataset, base.workers, base.seed, base.batch_size
    );
    let mut rows = Vec::new();
    for algorithm in [
        AlgorithmKind::Ddp,
        AlgorithmKind::PostLocalSgd,
        AlgorithmKind::Hierarchical,
        AlgorithmKind::Diloco,
        AlgorithmKind::StreamingDiloco,
        AlgorithmKind::Slowmo,
    ] {
        let mut cfg = base.clone();
        cfg.algorithm = algorithm;
        cfg.progress = false;
        cfg.resume = false;
        if algorithm.is_outer() {
            // The outer algorithms on the same period as post-local SGD (no levels).
            cfg.levels = Default::default();
        } else {
            // Outer settings given for the outer algorithms do not apply to the others.
            cfg.outer_lr = None;
            cfg.outer_momentum = None;
            cfg.outer_nesterov = None;
            cfg.outer_reduce = None;
            cfg.outer_compression = None;
        }
        if algorithm != AlgorithmKind::StreamingDiloco {
            // Fragment settings are Streaming DiLoCo's alone.
            cfg.fragments = None;
            cfg.fragment_sync_delay = None;
            cfg.fragment_alpha = None;
        }
        if algorithm == AlgorithmKind::Hierarchical && cfg.levels.is_empty() {
            cfg.levels =
                localsgd_trainer::algorithm::default_levels(cfg.workers, cfg.period).into();
        }
        cfg.validate()?;
        let started = Instant::now();
        let results = run::train_threads(&cfg, &data, None, None)?;
        let wall = started.elapsed().as_secs_f64();
        let r0 = results.first().context("no worker results")?;
        let bytes: u64 = results.iter().map(|r| r.traffic.bytes).sum();
        let collectives: u64 = results.iter().map(|r| r.traffic.collectives).sum();
        rows.push((
            algorithm,
            cfg.levels.clone(),
            r0.test_accuracy,
            bytes,
            collectives,
            wall,
        ));
    }
    println!(
        "{:<16} {:>10} {:>14} {:>12} {:>9}",
        "algorithm", "test acc", "bytes", "collectives", "wall s"
    );
    for (a, levels, acc, bytes, coll, wall) in rows {
        let name = match a {
            AlgorithmKind::Ddp => "ddp".to_string(),
            AlgorithmKind::PostLocalSgd => "post-local-sgd".to_string(),
            AlgorithmKind::Hierarchical => format!("hierarchical {levels}"),
            other => other.name().to_string(),
        };
        println!(
            "{:<16} {:>9.2}% {:>14} {:>12} {:>9.2}",
            name,
            100.0 * acc,
            bytes,
            coll,
            wall
        );
    }
    Ok(())
}
