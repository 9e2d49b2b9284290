//! Shared by the trainer tests that launch the binary (`mpi_train.rs`, `nccl_train.rs`,
//! `fault_soak.rs`): the binary, the run settings both backends are compared on, the reference
//! thread run, the final parameters of every rank read back from a run directory, and the check
//! that a run directory's latest checkpoint survived a fault.
// The launch helpers serve the MPI and NCCL modules, which only build with those features.
#![cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]

use localsgd_comm::params::FlatBuffer;
use localsgd_pipeline::checkpoint::{CheckpointDir, RunIdentity};
use localsgd_trainer::config::{AlgorithmKind, TrainConfig};
use std::path::Path;
use std::process::{Command, Output};

/// The `localsgd` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_localsgd");

/// A process's exit status and output, for assertion messages.
pub fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Settings shared by both backends: the digits data, 2 ranks, enough steps to cross warmup and
/// several averaging periods and an epoch boundary (1437 rows / 2 ranks / 32 = 23 batches).
pub fn args(run_dir: &Path, steps: u64) -> Vec<String> {
    [
        "train",
        "--algorithm",
        "post-local-sgd",
        "--warmup",
        "10",
        "--period",
        "4",
        "--steps",
        &steps.to_string(),
        "--log-every",
        "5",
        "--checkpoint-every",
        "20",
        "--progress",
        "false",
        "--run-dir",
        &run_dir.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The reference: the same run on `workers` threads of one process (must succeed).
pub fn run_threads(workers: usize, extra: &[String]) -> Output {
    let out = Command::new(BIN)
        .args(extra)
        .args(["--workers", &workers.to_string()])
        .output()
        .expect("run localsgd");
    assert!(out.status.success(), "{}", show(&out));
    out
}

/// Every rank's final parameters from the latest checkpoint of a run directory.
pub fn final_params(dir: &Path, workers: usize) -> Vec<Vec<f32>> {
    let cfg = TrainConfig {
        workers,
        algorithm: AlgorithmKind::PostLocalSgd,
        warmup: 10,
        period: Some(4),
        ..TrainConfig::default()
    };
    let identity = RunIdentity::from_spec(&cfg.algorithm_spec().unwrap(), workers);
    (0..workers)
        .map(|r| {
            match CheckpointDir::new(dir)
                .load_rank(r, &identity)
                .unwrap()
                .params
            {
                FlatBuffer::F32(v) => v,
                other => panic!("unexpected parameter type {other:?}"),
            }
        })
        .collect()
}

/// `checkpoints/latest`, if any, names a complete checkpoint whose every rank file decodes
/// (manifest, CRC-32, identity).
pub fn assert_checkpoint_intact(run: &Path, workers: usize) {
    if !run.join("checkpoints/latest").exists() {
        return;
    }
    let dir = CheckpointDir::new(run);
    let latest = dir.latest().unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(latest.join("manifest.json")).unwrap()).unwrap();
    let identity: RunIdentity = serde_json::from_value(manifest["identity"].clone()).unwrap();
    for rank in 0..workers {
        dir.load_rank(rank, &identity)
            .unwrap_or_else(|e| panic!("rank {rank}'s checkpoint after the fault: {e}"));
    }
}

/// The seed of a randomized test ([`localsgd_test_support::test_seed`]).
pub fn seed(what: &str) -> u64 {
    localsgd_test_support::test_seed(what)
}

/// A small deterministic random sequence (the soak's seed is printed, so a failure replays).
pub struct Lcg(u64);

impl Lcg {
    /// The sequence of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// The next number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Run `cmd` (stdout discarded) and fail as a hang if it is still running after `deadline`;
/// returns its status, its stderr and how long it took.
pub fn run_bounded(
    cmd: &mut Command,
    deadline: std::time::Duration,
    what: &str,
) -> (std::process::ExitStatus, String, std::time::Duration) {
    let started = std::time::Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read stderr on the side, so a chatty child never blocks on a full pipe.
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hang: {what} still running after {deadline:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let took = started.elapsed();
    (status, reader.join().unwrap(), took)
}
