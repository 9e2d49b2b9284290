//! `localsgd`: train with post-local SGD (and friends) on W workers.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use localsgd_trainer::config::ConfigFlags;
use localsgd_trainer::config::{AlgorithmKind, Backend};
use localsgd_trainer::export::{ExportChoice, export_run};
use localsgd_trainer::run;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "localsgd",
    version,
    about = "Communication-efficient data-parallel training: DDP, local SGD, post-local SGD, hierarchical averaging, DiLoCo, Streaming DiLoCo, SlowMo."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model (defaults: 2 thread workers, post-local SGD, the MLP on the bundled digits data; `--model gpt --dataset text` trains a language model).
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
mod bench_wire;
mod launch;
mod outcome;
mod plan_cmd;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod process_train;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod process_world;

/// mimalloc instead of glibc's malloc: a training step allocates and frees the same large
/// buffers every step, which glibc returns to the kernel and faults in again
/// (bench/results/2026-12-05-amd-epyc-allocators/).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Library warnings (e.g. "period 1: plain DDP is the better choice") go through `tracing`.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    if let Err(e) = run_cli() {
        eprintln!("error: {}", outcome::describe(&e));
        std::process::exit(2);
    }
}

fn run_cli() -> Result<()> {
    let cli = Cli::parse();
    // Renamed settings given by their old flag (clap takes them as aliases).
    let args: Vec<String> = std::env::args().collect();
    localsgd_trainer::config::warn_renamed(args.iter().filter_map(|a| {
        a.strip_prefix("--")
            .map(|f| f.split('=').next().unwrap_or(f))
    }));
    match cli.command {
        Command::Train(flags) => launch::train(&flags),
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

fn compare(flags: &ConfigFlags) -> Result<()> {
    // Not validated as a whole: each algorithm's run below is, with the settings that apply
    // to it (levels given for hierarchical averaging would be refused for post-local SGD).
    let base = flags.resolve_fresh().map_err(anyhow::Error::msg)?;
    if base.resume {
        bail!(
            "invalid setting `resume` = true for `compare`: it trains every algorithm from the start, one after another; resume a run with `localsgd train --resume`"
        );
    }
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
        // Each algorithm with the settings it takes (`AlgorithmSetting::applies_to`): a given
        // `period` for every algorithm that has one (else each its own default), outer
        // settings for the outer algorithms, fragments for Streaming DiLoCo, and so on.
        let mut cfg = base.for_algorithm(algorithm);
        cfg.progress = false;
        // Given levels are hierarchical averaging's here (DiLoCo and SlowMo would take them as
        // their lower levels); without any, `default_levels` from the given period.
        if algorithm == AlgorithmKind::Hierarchical {
            if cfg.levels.is_empty() {
                let period = base.period.or(AlgorithmKind::PostLocalSgd.default_period());
                cfg.levels =
                    localsgd_pipeline::algorithm::default_levels(cfg.workers, period.unwrap_or(4))
                        .into();
            }
        } else {
            cfg.levels = Default::default();
        }
        cfg.validate()?;
        let started = Instant::now();
        let results = run::train_threads(&cfg, &data, None, None)?;
        let wall = started.elapsed().as_secs_f64();
        let r0 = results.first().context("no worker results")?;
        let (bytes, collectives) = (r0.totals.bytes, r0.totals.collectives);
        rows.push((
            algorithm,
            cfg.levels.clone(),
            r0.result.test_accuracy,
            bytes,
            collectives,
            wall,
        ));
    }
    // The widest name (hierarchical's, with its levels) sets the first column.
    let names: Vec<String> = rows
        .iter()
        .map(|(a, levels, ..)| match a {
            AlgorithmKind::Ddp => "ddp".to_string(),
            AlgorithmKind::PostLocalSgd => "post-local-sgd".to_string(),
            AlgorithmKind::Hierarchical => format!("hierarchical {levels}"),
            other => other.name().to_string(),
        })
        .collect();
    let width = names.iter().map(String::len).max().unwrap_or(0).max(16);
    println!(
        "{:<width$} {:>10} {:>14} {:>12} {:>9}",
        "algorithm", "test acc", "bytes", "collectives", "wall s"
    );
    for (name, (_, _, acc, bytes, coll, wall)) in names.into_iter().zip(rows) {
        println!(
            "{:<width$} {:>9.2}% {:>14} {:>12} {:>9.2}",
            name,
            100.0 * acc,
            bytes,
            coll,
            wall
        );
    }
    Ok(())
}
