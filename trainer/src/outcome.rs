//! What `localsgd train` shows and writes around the training, for every backend: the run
//! directory and its `config.toml`, the progress bar, rank 0's report (`summary.json`, the
//! loss plot, the printed lines) and one-line error messages. `launch` (threads) and
//! `process_train` (MPI, NCCL) both use it.

use anyhow::{Context, Result};
use localsgd_pipeline::checkpoint::CheckpointDir;
use localsgd_trainer::config::{ModelKind, TrainConfig};
use localsgd_trainer::export::ExportChoice;
use localsgd_trainer::plot::write_loss_svg;
use localsgd_trainer::resume::ResumePlan;
use localsgd_trainer::run::{self, Progress, RankOutcome, RunTotals, WorkerResult};
use std::path::{Path, PathBuf};

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

/// Rank 0's progress bar (`progress = true`): iterations done, the loss, the time.
pub(crate) fn progress_bar(cfg: &TrainConfig) -> Option<Progress> {
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

/// Create the run directory and save the effective configuration (on a resume, with the
/// history of the settings it changed). Called only once everything is validated (and, under
/// MPI, only by rank 0, once the number of workers is the world's).
pub(crate) fn prepare_run_dir(cfg: &TrainConfig) -> Result<PathBuf> {
    let dir = cfg.run_dir.clone();
    let effective = if cfg.resume {
        // Every check before anything in the run directory is rewritten (config.toml would
        // otherwise describe refused settings): the settings against the run's, then the
        // checkpoint against the world that continues it.
        let plan = ResumePlan::check(cfg)?;
        let spec = cfg.algorithm_spec()?;
        let checkpoints = CheckpointDir::new(&dir);
        if cfg.resume_ranks.is_empty() {
            checkpoints.check_latest(&run::run_identity(&spec, cfg.workers))?;
        } else {
            checkpoints.check_latest_resized(&spec, &cfg.resume_ranks)?;
        }
        plan.config_toml(cfg)
    } else {
        cfg.with_defaults_filled().to_toml()
    };
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating run directory {}", dir.display()))?;
    if cfg.print_config {
        println!(
            "# effective configuration (saved to {})\n{effective}",
            dir.join("config.toml").display()
        );
    }
    localsgd_pipeline::atomic::write_atomic(&dir.join("config.toml"), &effective)
        .with_context(|| format!("writing {}", dir.join("config.toml").display()))?;
    Ok(dir)
}

/// Rank 0's report of the run: printed, and written as `summary.json` and the loss plot.
pub(crate) fn report(cfg: &TrainConfig, outcome: &RankOutcome, dir: &Path) -> Result<()> {
    let RankOutcome {
        result: r0,
        totals,
        wall_seconds: wall,
        workers,
        membership,
    } = outcome;
    let wall = *wall;
    let RunTotals {
        bytes,
        data_bytes,
        wire_bytes,
        collectives,
        start_bytes,
        samples,
        ranks,
    } = totals.clone();
    // A language model's sample is a window predicting `context` bytes.
    let language_model = cfg.model == ModelKind::Gpt;
    let throughput = if language_model {
        format!(
            "{:.0} tokens/s",
            (samples * cfg.context as u64) as f64 / wall
        )
    } else {
        format!("{:.0} samples/s", samples as f64 / wall)
    };
    println!(
        "trained {} iterations on {} workers ({:?}, {:?} backend) in {:.2}s: {throughput}",
        r0.iterations, workers, cfg.algorithm, cfg.backend, wall,
    );
    for change in membership {
        let replaced = if change.joined.is_empty() {
            String::new()
        } else {
            format!(", replaced by new workers {:?}", change.joined)
        };
        println!(
            "rank(s) {:?} left at iteration {}{replaced}: {} workers continued from iteration {}{}",
            change.left,
            change.detected_at,
            change.members.len(),
            change.iteration,
            change
                .recovery_seconds
                .map_or_else(String::new, |s| format!(
                    " ({s:.2}s to their first iteration)"
                ))
        );
    }
    println!(
        "communication: {collectives} collectives, {:.2} MB (all ranks; {:.2} MB of it gradients/parameters/losses, the rest control flags), {:.2} MB on the wire (sent by all ranks under each collective's bandwidth-optimal algorithm); skipped optimizer steps: {}",
        bytes as f64 / 1e6,
        data_bytes as f64 / 1e6,
        wire_bytes as f64 / 1e6,
        r0.skipped_steps
    );
    println!(
        "wire format: {}; the start broadcast (rank 0's model to every rank) is {:.2} MB of the bytes above",
        wire_format(cfg),
        start_bytes as f64 / 1e6
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
    if language_model {
        println!(
            "validation loss: {:.4} nats/byte, {:.4} bits/byte; next-byte accuracy {:.2}% (world-averaged model; rank 0's own model: {:.2}%)",
            r0.test_loss,
            r0.test_loss / std::f64::consts::LN_2,
            100.0 * r0.test_accuracy,
            100.0 * r0.local_test_accuracy
        );
    } else {
        println!(
            "test accuracy: {:.2}% (world-averaged model; rank 0's own model: {:.2}%)",
            100.0 * r0.test_accuracy,
            100.0 * r0.local_test_accuracy
        );
    }
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
        "workers": workers,
        "world_size": ranks.len(),
        "membership": membership,
        "backend": cfg.backend,
        "algorithm": cfg.algorithm,
        "bytes": bytes,
        "data_bytes": data_bytes,
        "wire_bytes": wire_bytes,
        "collectives": collectives,
        "start_bytes": start_bytes,
        "wire_format": wire_format(cfg),
        "wall_seconds": wall,
        "samples_per_second": samples as f64 / wall,
        "tokens_per_second": language_model.then(|| (samples * cfg.context as u64) as f64 / wall),
        "test_bits_per_byte": language_model.then(|| r0.test_loss / std::f64::consts::LN_2),
        "skipped_steps": r0.skipped_steps,
        "phase_seconds": r0.phase_times.iter().map(|(p, d)| (p.name().to_string(), serde_json::json!(d.as_secs_f64()))).collect::<serde_json::Map<_, _>>(),
    });
    localsgd_pipeline::atomic::write_atomic(&dir.join("summary.json"), format!("{summary:#}\n"))?;
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

/// What the run's collectives carry, and in which format: gradients (DDP's every step, the
/// warmup of the algorithms that have one, and with `post-local-allreduce` within subgroups
/// after it) in `compression`'s, model averages or pseudo-gradients in `average-compression`'s
/// (hierarchical averaging compresses its whole-world level only).
pub(crate) fn wire_format(cfg: &TrainConfig) -> String {
    use localsgd_trainer::config::{AlgorithmKind, GradientCompression};
    let format = match cfg.compression {
        GradientCompression::None => "f32",
        GradientCompression::Fp16 => "fp16",
        GradientCompression::Bf16 => "bf16",
    };
    let outer = match cfg.average_compression.map(|c| c.to_string()) {
        Some(c) if c != "none" => c,
        _ => "f32".to_string(),
    };
    let warmup = cfg.warmup > 0 || cfg.warmup_epochs.is_some_and(|e| e > 0);
    let gradients = match (warmup, cfg.post_local_allreduce) {
        (true, true) => Some(format!(
            "gradients {format} (warmup, then within subgroups)"
        )),
        (true, false) => Some(format!("gradients {format} (warmup)")),
        (false, true) => Some(format!("gradients {format} (within subgroups)")),
        (false, false) => None,
    };
    let averages = match cfg.algorithm {
        AlgorithmKind::Ddp => return format!("gradients {format}"),
        AlgorithmKind::LocalSgd => return format!("model averages {outer}"),
        AlgorithmKind::Diloco | AlgorithmKind::StreamingDiloco => {
            format!("pseudo-gradients {outer}")
        }
        AlgorithmKind::Hierarchical if outer != "f32" => {
            format!("model averages {outer} (whole world), f32 (lower levels)")
        }
        AlgorithmKind::PostLocalSgd | AlgorithmKind::Hierarchical | AlgorithmKind::Slowmo => {
            format!("model averages {outer}")
        }
    };
    match gradients {
        Some(g) => format!("{g}, {averages}"),
        None => averages,
    }
}

/// The test loss of the averaged model and each rank's own model's accuracy and loss, on one
/// line (the first 8 ranks; `summary.json` has all of them).
pub(crate) fn rank_results(r0: &WorkerResult, ranks: &[run::Evaluation]) -> String {
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
