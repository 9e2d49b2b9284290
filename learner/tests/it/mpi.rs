//! `LocalSgdStrategy::with_group` under real MPI: `mpirun -np 2` runs the `mpi_digits` example
//! (one rank per process, each with its own `SupervisedTraining`), and every rank's own final
//! parameters, the world average each returns and the traffic report each holds equal the same
//! run on 2 thread ranks in this process (`LocalSgdStrategy::new`, same data, initial weights
//! and settings: both runs go through the example's `digits` module), to the bit. With 2 ranks
//! every reduction is one addition of two numbers, so MPI and the thread backend agree exactly.
//!
//! `cargo test --test learner_it` builds no examples: build `mpi_digits` first (`cargo build
//! --workspace --example mpi_digits --features localsgd-learner/mpi`, as `.ci/run` does), or
//! run `cargo test --workspace --features localsgd-learner/mpi` without `--test`. The test
//! refuses a binary older than the sources it is built from; `LOCALSGD_MPI_DIGITS` names
//! another binary.

use crate::common::digits;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use localsgd_learner::{LocalSgdStrategy, StrategyConfig};
use localsgd_test_support::{mpirun, one_mpi_job};

const RANKS: usize = 2;
const EPOCHS: usize = 2;
const WARMUP: u64 = 10;
const PERIOD: u64 = 4;

/// What one run ended with.
#[derive(Debug)]
struct Run {
    /// Each rank's own final parameters, in rank order.
    own: Vec<Vec<f32>>,
    /// The world average `launch` returned, per rank (the thread run returns one).
    averaged: Vec<Vec<f32>>,
    /// The strategy's report, per rank (the thread run has one).
    reports: Vec<serde_json::Value>,
}

/// The same run on `RANKS` thread ranks of this process.
fn run_threads(algorithm: &str) -> Run {
    let spec = digits::spec(algorithm, RANKS, WARMUP, PERIOD).unwrap();
    let config = StrategyConfig::new(spec).with_workers(RANKS);
    let strategy = Arc::new(LocalSgdStrategy::new(config, digits::device()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let result = digits::train(dir.path(), strategy.clone(), EPOCHS).unwrap();
    assert!(result.error.is_none(), "{algorithm}: {:?}", result.error);
    let own = strategy.rank_models::<digits::Net>().unwrap();
    assert_eq!(own.len(), RANKS);
    Run {
        own: own.iter().map(digits::params).collect(),
        averaged: vec![digits::params(&result.model)],
        reports: vec![digits::report_json(&strategy.report().unwrap())],
    }
}

/// The example under `mpirun -np RANKS`, and the files its ranks wrote.
fn run_mpi(bin: &Path, algorithm: &str) -> Run {
    let out = tempfile::tempdir().unwrap();
    let output = {
        let _one = one_mpi_job();
        mpirun(RANKS, bin.to_str().unwrap())
            .args(["--algorithm", algorithm])
            .args(["--warmup", &WARMUP.to_string()])
            .args(["--period", &PERIOD.to_string()])
            .args(["--epochs", &EPOCHS.to_string()])
            .arg("--out")
            .arg(out.path())
            .output()
            .expect("run mpirun (is Open MPI installed?)")
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(output.status.success(), "{algorithm}: {text}");
    for rank in 0..RANKS {
        assert!(
            text.contains(&format!(
                "rank {rank} of {RANKS}: {algorithm} for {EPOCHS} epochs"
            )),
            "{text}"
        );
    }
    let read = |path: PathBuf| {
        digits::read_f32(&path).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
    };
    let report = |rank| -> serde_json::Value {
        let path = digits::report_file(out.path(), rank);
        let json = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()));
        serde_json::from_str(&json).unwrap()
    };
    Run {
        own: (0..RANKS)
            .map(|r| read(digits::own_file(out.path(), r)))
            .collect(),
        averaged: (0..RANKS)
            .map(|r| read(digits::averaged_file(out.path(), r)))
            .collect(),
        reports: (0..RANKS).map(report).collect(),
    }
}

/// Whether `a` and `b` are the same floats to the bit; otherwise how far apart.
pub(crate) fn assert_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let differ = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(
        differ == 0,
        "{what}: {differ} of {} floats differ, max |diff| {max}",
        a.len()
    );
}

/// The MPI run of `algorithm`, after checking it against the thread run.
fn mpi_equals_threads(algorithm: &str) -> Run {
    let bin = example_binary();
    let threads = run_threads(algorithm);
    let mpi = run_mpi(&bin, algorithm);
    for rank in 0..RANKS {
        assert_bits(
            &format!("{algorithm}: rank {rank}'s own parameters"),
            &mpi.own[rank],
            &threads.own[rank],
        );
        assert_bits(
            &format!("{algorithm}: the world average rank {rank} returned"),
            &mpi.averaged[rank],
            &threads.averaged[0],
        );
        assert_eq!(
            mpi.reports[rank], threads.reports[0],
            "{algorithm}: rank {rank}'s report (MPI, left) vs the thread ranks' (right)"
        );
    }
    // The report counts every rank's steps, and something was sent.
    let ranks = threads.reports[0]["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), RANKS);
    for r in ranks {
        assert!(r["iterations"].as_u64().unwrap() > 0, "{r}");
        assert!(r["data_bytes"].as_u64().unwrap() > 0, "{r}");
    }
    mpi
}

#[test]
fn post_local_sgd_under_mpirun_equals_thread_ranks() {
    let mpi = mpi_equals_threads("post-local-sgd");
    // 2 epochs of 23 steps end 2 local steps after the last average: the replicas differ, so
    // each rank's file is its own model, not the average.
    assert_ne!(mpi.own[0], mpi.own[1]);
    assert_ne!(mpi.own[0], mpi.averaged[0]);
}

#[test]
fn diloco_under_mpirun_equals_thread_ranks() {
    mpi_equals_threads("diloco");
}

#[test]
fn every_other_algorithm_under_mpirun_equals_thread_ranks() {
    for algorithm in [
        "ddp",
        "local-sgd",
        "hierarchical",
        "streaming-diloco",
        "slowmo",
    ] {
        mpi_equals_threads(algorithm);
    }
}

/// A setting every rank refuses alike is printed once, by rank 0, and no rank trains.
#[test]
fn a_bad_algorithm_is_printed_once_and_the_job_fails() {
    let bin = example_binary();
    let out = tempfile::tempdir().unwrap();
    let output = {
        let _one = one_mpi_job();
        mpirun(RANKS, bin.to_str().unwrap())
            .args(["--algorithm", "fedavg", "--out"])
            .arg(out.path())
            .output()
            .expect("run mpirun (is Open MPI installed?)")
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let error = "error: invalid setting `algorithm` = \"fedavg\": one of ddp, local-sgd, \
                 post-local-sgd, hierarchical, diloco, streaming-diloco, slowmo";
    assert_eq!(stderr.matches(error).count(), 1, "{stderr}");
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("Starting training"),
        "{stderr}"
    );
}

/// The example's binary: `LOCALSGD_MPI_DIGITS`, or `target/<profile>/examples/mpi_digits` beside
/// this test binary (`target/<profile>/deps/`), refused when missing or older than a file it was
/// built from (cargo lists them in `mpi_digits.d` beside it: the example's sources and those of
/// the workspace crates it links). Looked up once per test binary, so that every test runs the
/// same one.
pub(crate) fn example_binary() -> PathBuf {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(find_example_binary)
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn find_example_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("LOCALSGD_MPI_DIGITS") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("no target directory")?;
    let bin = profile.join("examples").join("mpi_digits");
    let build = "build it with `cargo build --workspace --example mpi_digits --features \
                 localsgd-learner/mpi` (`cargo test --test learner_it` builds no examples), or set \
                 LOCALSGD_MPI_DIGITS";
    let built = modified(&bin).map_err(|e| format!("{}: {e}: {build}", bin.display()))?;
    let dep_info = std::fs::read_to_string(bin.with_extension("d")).unwrap_or_default();
    match dep_info_inputs(&dep_info)
        .into_iter()
        .find(|input| modified(input).is_ok_and(|t| t > built))
    {
        Some(input) => Err(format!(
            "{} is older than {}: {build}",
            bin.display(),
            input.display()
        )),
        None => Ok(bin),
    }
}

fn modified(path: &Path) -> std::io::Result<SystemTime> {
    std::fs::metadata(path)?.modified()
}

/// The inputs a Makefile-style dependency file lists (`target: input input ...`; a space in a
/// path is written `\ `).
fn dep_info_inputs(text: &str) -> Vec<PathBuf> {
    let mut inputs = Vec::new();
    for line in text.lines() {
        let mut word = String::new();
        let mut chars = line.chars().peekable();
        let mut words = Vec::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => word.push(chars.next().unwrap()),
                ' ' => words.push(std::mem::take(&mut word)),
                c => word.push(c),
            }
        }
        words.push(word);
        // The first word is the target (`path:`), the rest its inputs.
        inputs.extend(
            words
                .into_iter()
                .skip_while(|w| !w.ends_with(':'))
                .skip(1)
                .filter(|w| !w.is_empty())
                .map(PathBuf::from),
        );
    }
    inputs
}
