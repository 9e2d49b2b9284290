//! Per-iteration metrics written by rank 0: loss, learning rate, phase times, communication.

use crate::config::MetricsFormat;
use crate::pipeline::{ITERATION_ORDER, IterationReport};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Open a run file for writing: truncated, or continued when `append` (resume). Also says
/// whether it existed already (then it has its header).
fn open_run_file(path: &Path, append: bool) -> std::io::Result<(BufWriter<File>, bool)> {
    let existed = append && path.exists();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(append)
        .write(true)
        .truncate(!append)
        .open(path)?;
    Ok((BufWriter::new(file), existed))
}

/// Writes one row per iteration to `metrics.csv` or `metrics.jsonl`.
pub struct MetricsWriter {
    out: BufWriter<File>,
    format: MetricsFormat,
    path: PathBuf,
}

impl MetricsWriter {
    /// Create (or, when `append`, continue) the metrics file in `run_dir`.
    pub fn create(run_dir: &Path, format: MetricsFormat, append: bool) -> std::io::Result<Self> {
        let path = run_dir.join(match format {
            MetricsFormat::Csv => "metrics.csv",
            MetricsFormat::Jsonl => "metrics.jsonl",
        });
        let (mut out, existed) = open_run_file(&path, append)?;
        if format == MetricsFormat::Csv && !existed {
            let phases: Vec<String> = ITERATION_ORDER
                .iter()
                .map(|p| format!("{}_ms", p.name()))
                .collect();
            writeln!(
                out,
                "iteration,epoch,loss,global_loss,lr,skipped_step,collectives,bytes,data_bytes,{}",
                phases.join(",")
            )?;
        }
        Ok(Self { out, format, path })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one iteration.
    pub fn record(&mut self, epoch: u64, lr: f64, r: &IterationReport) -> std::io::Result<()> {
        let ms: Vec<f64> = r.times.iter().map(|(_, d)| d.as_secs_f64() * 1e3).collect();
        match self.format {
            MetricsFormat::Csv => {
                let global = r.global_loss.map(|g| g.to_string()).unwrap_or_default();
                let ms: Vec<String> = ms.iter().map(|m| format!("{m:.4}")).collect();
                writeln!(
                    self.out,
                    "{},{},{},{},{},{},{},{},{},{}",
                    r.iteration,
                    epoch,
                    r.loss,
                    global,
                    lr,
                    r.skipped_step,
                    r.traffic.collectives,
                    r.traffic.bytes,
                    r.traffic.data_bytes,
                    ms.join(",")
                )
            }
            MetricsFormat::Jsonl => {
                let mut phases = serde_json::Map::new();
                for ((p, _), m) in r.times.iter().zip(&ms) {
                    phases.insert(format!("{}_ms", p.name()), serde_json::json!(m));
                }
                let row = serde_json::json!({
                    "iteration": r.iteration,
                    "epoch": epoch,
                    "loss": r.loss,
                    "global_loss": r.global_loss,
                    "lr": lr,
                    "skipped_step": r.skipped_step,
                    "collectives": r.traffic.collectives,
                    "bytes": r.traffic.bytes,
                    "data_bytes": r.traffic.data_bytes,
                    "phases": phases,
                });
                writeln!(self.out, "{row}")
            }
        }
    }

    /// Flush to disk.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Test-set evaluations during training, written by rank 0 to `eval.csv`
/// (`iteration,train_seconds,test_accuracy`): what accuracy-against-time curves and "time to a
/// target accuracy" are computed from.
///
/// `iteration` counts iterations done; `train_seconds` is rank 0's training time so far (the sum
/// of its phase times, so evaluations themselves are not counted; after a resume it continues
/// from the file's last row); `test_accuracy` is rank 0's own model on the whole test set.
/// Right after a model-averaging step all ranks hold the same model: periodic averaging runs in
/// the iteration with 0-based index `warmup + k * period`, so evaluations after
/// `done = warmup + 1 + k * period` iterations measure the consensus model (hierarchical
/// averaging counts from 0: `done = 1 + k * period`); other evaluations see rank 0's replica.
pub struct EvalWriter {
    out: BufWriter<File>,
    offset: f64,
}

impl EvalWriter {
    /// The file's name in the run directory.
    pub const FILE: &'static str = "eval.csv";

    /// Create (or, when `append`, continue) `eval.csv` in `run_dir`.
    pub fn create(run_dir: &Path, append: bool) -> std::io::Result<Self> {
        let path = run_dir.join(Self::FILE);
        // A resumed run's clock restarts at 0: continue from the last recorded time.
        let offset = if append && path.exists() {
            std::fs::read_to_string(&path)?
                .lines()
                .skip(1)
                .filter_map(|l| l.split(',').nth(1)?.parse::<f64>().ok())
                .last()
                .unwrap_or(0.0)
        } else {
            0.0
        };
        let (mut out, existed) = open_run_file(&path, append)?;
        if !existed {
            writeln!(out, "iteration,train_seconds,test_accuracy")?;
        }
        Ok(Self { out, offset })
    }

    /// Append one evaluation and flush it (evaluations are rare; a killed run keeps them).
    pub fn record(
        &mut self,
        iteration: u64,
        train_seconds: f64,
        test_accuracy: f64,
    ) -> std::io::Result<()> {
        let secs = self.offset + train_seconds;
        writeln!(self.out, "{iteration},{secs:.6},{test_accuracy}")?;
        self.out.flush()
    }
}
