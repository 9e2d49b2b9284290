//! Per-iteration metrics, one file per rank (`metrics.csv` for rank 0, `metrics-rank{R}.csv`
//! for the others): loss, learning rate, phase times, communication.

use crate::config::MetricsFormat;
use localsgd_pipeline::atomic::write_atomic;
use localsgd_pipeline::pipeline::{ITERATION_ORDER, IterationReport};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Open a run file for writing: truncated for a fresh run, or, on resume, cut back to the rows
/// `keep` accepts and continued. Returns the lines kept when it existed already (then they
/// start with its header), `None` when it starts over.
///
/// The cut-back keeps the leading complete lines (ending in a newline) for which `keep` holds
/// and drops everything from the first one that fails: the rows a killed run wrote after its
/// last checkpoint (the resumed run writes them again) and a row torn by the kill. It is
/// written atomically, so a kill during the resume itself loses nothing.
fn open_run_file(
    path: &Path,
    resume: bool,
    keep: impl Fn(&str) -> bool,
) -> std::io::Result<(BufWriter<File>, Option<String>)> {
    let mut kept_text = None;
    if resume && path.exists() {
        let text = std::fs::read(path)?;
        let mut kept = 0;
        for line in text.split_inclusive(|&b| b == b'\n') {
            let complete = line.ends_with(b"\n");
            match std::str::from_utf8(line) {
                Ok(l) if complete && keep(l.trim_end()) => kept += line.len(),
                _ => break,
            }
        }
        if kept < text.len() {
            write_atomic(path, &text[..kept])?;
        }
        // Nothing kept (an empty file, or only a torn header): it starts over with its header.
        // The kept lines are whole UTF-8 lines, checked above.
        kept_text = (kept > 0).then(|| String::from_utf8_lossy(&text[..kept]).into_owned());
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(resume)
        .write(true)
        .truncate(!resume)
        .open(path)?;
    Ok((BufWriter::new(file), kept_text))
}

/// The first comma-separated field of a CSV row as an iteration number (`None` for the header).
fn csv_iteration(line: &str) -> Option<u64> {
    line.split(',').next()?.parse().ok()
}

/// Writes one row per iteration to `metrics.csv` or `metrics.jsonl`.
pub struct MetricsWriter {
    out: BufWriter<File>,
    format: MetricsFormat,
    path: PathBuf,
    /// Rows carry `wire_bytes` (false only when continuing a CSV file whose header, written
    /// before the column existed, has none: its rows keep the header's columns).
    wire: bool,
}

impl MetricsWriter {
    /// The name of `rank`'s metrics file: `metrics.csv` (`metrics.jsonl`) for rank 0, whose file
    /// kept that name when the other ranks got theirs, and `metrics-rank{R}.csv` (`.jsonl`) for
    /// rank `R >= 1`.
    pub fn file_name(format: MetricsFormat, rank: usize) -> String {
        let ext = match format {
            MetricsFormat::Csv => "csv",
            MetricsFormat::Jsonl => "jsonl",
        };
        match rank {
            0 => format!("metrics.{ext}"),
            r => format!("metrics-rank{r}.{ext}"),
        }
    }

    /// Create `rank`'s metrics file in `run_dir` ([`file_name`](Self::file_name)), or, when
    /// resuming a run whose checkpoint holds `resume_done` iterations, continue it: rows of
    /// iterations `0..resume_done` are kept, later ones (and a row torn by a kill) are dropped,
    /// so every iteration appears exactly once.
    pub fn create(
        run_dir: &Path,
        format: MetricsFormat,
        rank: usize,
        resume_done: Option<u64>,
    ) -> std::io::Result<Self> {
        let path = run_dir.join(Self::file_name(format, rank));
        let done = resume_done.unwrap_or(0);
        let keep = |line: &str| match format {
            MetricsFormat::Csv => csv_iteration(line).is_none_or(|i| i < done),
            MetricsFormat::Jsonl => serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|row| row.get("iteration")?.as_u64())
                .is_some_and(|i| i < done),
        };
        let (mut out, kept) = open_run_file(&path, resume_done.is_some(), keep)?;
        let existed = kept.is_some();
        let wire = format != MetricsFormat::Csv
            || kept.as_deref().is_none_or(|text| {
                text.lines()
                    .next()
                    .is_some_and(|header| header.split(',').any(|c| c == "wire_bytes"))
            });
        if format == MetricsFormat::Csv && !existed {
            let phases: Vec<String> = ITERATION_ORDER
                .iter()
                .map(|p| format!("{}_ms", p.name()))
                .collect();
            writeln!(
                out,
                "iteration,epoch,loss,global_loss,lr,skipped_step,collectives,bytes,data_bytes,wire_bytes,{}",
                phases.join(",")
            )?;
        }
        Ok(Self {
            out,
            format,
            path,
            wire,
        })
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
                let wire = match self.wire {
                    true => format!("{},", r.traffic.wire_bytes),
                    false => String::new(),
                };
                writeln!(
                    self.out,
                    "{},{},{},{},{},{},{},{},{},{wire}{}",
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
                    "wire_bytes": r.traffic.wire_bytes,
                    "phases": phases,
                });
                writeln!(self.out, "{row}")
            }
        }
    }

    /// Flush the rows written so far and sync them to disk (before a checkpoint is published,
    /// so the rows it covers are durable when it is).
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        self.out.get_ref().sync_data()
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

    /// Create `eval.csv` in `run_dir`, or, when resuming a run whose checkpoint holds
    /// `resume_done` iterations, continue it: evaluations after `resume_done` iterations (and a
    /// row torn by a kill) are dropped; the resumed run makes them again.
    pub fn create(run_dir: &Path, resume_done: Option<u64>) -> std::io::Result<Self> {
        let path = run_dir.join(Self::FILE);
        let done = resume_done.unwrap_or(0);
        let (mut out, kept) = open_run_file(&path, resume_done.is_some(), |line| {
            csv_iteration(line).is_none_or(|i| i <= done)
        })?;
        let existed = kept.is_some();
        // A resumed run's clock restarts at 0: continue from the last recorded time.
        let offset = if let Some(text) = &kept {
            text.lines()
                .skip(1)
                .filter_map(|l| l.split(',').nth(1)?.parse::<f64>().ok())
                .last()
                .unwrap_or(0.0)
        } else {
            0.0
        };
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

    /// Sync the evaluations written so far to disk (before a checkpoint is published).
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        self.out.get_ref().sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use localsgd_pipeline::pipeline::PhaseTimes;

    fn report(iteration: u64) -> IterationReport {
        IterationReport {
            iteration,
            loss: 0.5,
            global_loss: None,
            skipped_step: false,
            lr: 0.1,
            times: PhaseTimes::default(),
            traffic: Default::default(),
            micro_batches: 1,
            data: None,
        }
    }

    fn iterations(text: &str, jsonl: bool) -> Vec<u64> {
        text.lines()
            .skip(usize::from(!jsonl))
            .map(|l| {
                if jsonl {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["iteration"]
                        .as_u64()
                        .unwrap()
                } else {
                    csv_iteration(l).unwrap()
                }
            })
            .collect()
    }

    /// A killed run wrote rows 0..6 and half of row 6; its checkpoint holds 4 iterations. The
    /// resume keeps rows 0..4 and continues with 4: no gap, no duplicate, no torn row.
    #[test]
    fn resume_cuts_rows_back_to_the_checkpoint_and_drops_a_torn_row() {
        for format in [MetricsFormat::Csv, MetricsFormat::Jsonl] {
            let dir = tempfile::tempdir().unwrap();
            let mut w = MetricsWriter::create(dir.path(), format, 0, None).unwrap();
            for i in 0..6 {
                w.record(0, 0.1, &report(i)).unwrap();
            }
            w.sync().unwrap();
            let path = w.path().to_path_buf();
            drop(w);
            let full = std::fs::read_to_string(&path).unwrap();
            let torn = &full[..full.len() - 10];
            std::fs::write(&path, format!("{full}{torn}")).unwrap();

            let mut w = MetricsWriter::create(dir.path(), format, 0, Some(4)).unwrap();
            for i in 4..7 {
                w.record(0, 0.1, &report(i)).unwrap();
            }
            w.sync().unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            let jsonl = format == MetricsFormat::Jsonl;
            assert_eq!(iterations(&text, jsonl), (0..7).collect::<Vec<_>>());
            if !jsonl {
                assert_eq!(text.matches("iteration,epoch").count(), 1, "one header");
            }
        }
    }

    /// Every row has as many fields as the header: a new file's rows carry `wire_bytes`, and
    /// rows continued into a file whose header has no such column (written before it existed)
    /// leave it out.
    #[test]
    fn rows_keep_the_columns_of_the_header_they_continue() {
        let dir = tempfile::tempdir().unwrap();
        let fields = |l: &str| l.split(',').count();
        let mut w = MetricsWriter::create(dir.path(), MetricsFormat::Csv, 0, None).unwrap();
        w.record(0, 0.1, &report(0)).unwrap();
        w.sync().unwrap();
        let path = w.path().to_path_buf();
        drop(w);
        let text = std::fs::read_to_string(&path).unwrap();
        let header = text.lines().next().unwrap();
        assert!(header.contains(",data_bytes,wire_bytes,"), "{header}");
        assert!(text.lines().all(|l| fields(l) == fields(header)), "{text}");

        let old_header = header.replace(",wire_bytes", "");
        let old_row = text
            .lines()
            .nth(1)
            .unwrap()
            .splitn(11, ',')
            .collect::<Vec<_>>();
        let old_row = [&old_row[..9], &old_row[10..]].concat().join(",");
        std::fs::write(&path, format!("{old_header}\n{old_row}\n")).unwrap();
        let mut w = MetricsWriter::create(dir.path(), MetricsFormat::Csv, 0, Some(1)).unwrap();
        w.record(0, 0.1, &report(1)).unwrap();
        w.sync().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(
            text.lines().all(|l| fields(l) == fields(&old_header)),
            "{text}"
        );
    }

    #[test]
    fn resume_keeps_evaluations_up_to_the_checkpoint_and_continues_their_clock() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = EvalWriter::create(dir.path(), None).unwrap();
        e.record(2, 1.5, 0.5).unwrap();
        e.record(4, 3.0, 0.6).unwrap();
        e.record(6, 4.5, 0.7).unwrap();
        drop(e);
        let mut e = EvalWriter::create(dir.path(), Some(4)).unwrap();
        e.record(6, 1.0, 0.65).unwrap();
        let text = std::fs::read_to_string(dir.path().join(EvalWriter::FILE)).unwrap();
        assert_eq!(
            text,
            "iteration,train_seconds,test_accuracy\n2,1.500000,0.5\n4,3.000000,0.6\n6,4.000000,0.65\n"
        );
    }
}
