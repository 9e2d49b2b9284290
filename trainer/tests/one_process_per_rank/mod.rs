//! Shared by the one-process-per-rank trainer tests (`mpi_train.rs`, `nccl_train.rs`): the
//! binary, the run settings both backends are compared on, the reference thread run, and the
//! final parameters of every rank read back from a run directory.
#![allow(dead_code)] // each test file uses its own subset

use localsgd_comm::params::FlatBuffer;
use localsgd_trainer::algorithm::AlgorithmSpec;
use localsgd_trainer::checkpoint::{CheckpointDir, RunIdentity};
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
        period: 4,
        ..TrainConfig::default()
    };
    let identity = RunIdentity {
        world_size: workers,
        algorithm: AlgorithmSpec::from_config(&cfg).unwrap().identity(),
    };
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
