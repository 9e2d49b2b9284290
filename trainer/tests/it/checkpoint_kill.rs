//! Atomic checkpoints and run files: kill -9 the trainer while it checkpoints every iteration;
//! the latest checkpoint is always complete, a resumed run continues from it to the same final
//! model as an uninterrupted run, and `metrics.csv` ends with every iteration exactly once.

use crate::one_process_per_rank;

use localsgd_pipeline::checkpoint::{CheckpointDir, RunIdentity};
use localsgd_trainer::config::{AlgorithmKind, DatasetKind, TrainConfig};
use std::process::{Command, Stdio};
use std::time::Duration;

const ARGS: [&str; 12] = [
    "train",
    "--dataset",
    "synthetic",
    "--synthetic-dim",
    "64",
    "--hidden",
    "512,512",
    "--progress",
    "false",
    "--steps",
    "100000",
    "--log-every",
];

/// The run identity of ARGS plus `extra` (flags of the outer-optimizer settings only).
fn identity(extra: &[&str]) -> RunIdentity {
    let mut cfg = TrainConfig {
        dataset: DatasetKind::Synthetic,
        synthetic_dim: 64,
        hidden: vec![512, 512],
        checkpoint_every: 1,
        ..TrainConfig::default()
    };
    for pair in extra.chunks(2) {
        let v = pair[1];
        match pair[0] {
            "--algorithm" => {
                assert_eq!(
                    v, "streaming-diloco",
                    "identity: only streaming-diloco is mapped"
                );
                cfg.algorithm = AlgorithmKind::StreamingDiloco;
            }
            "--warmup" => cfg.warmup = v.parse().unwrap(),
            "--period" => cfg.period = Some(v.parse().unwrap()),
            "--fragments" => cfg.fragments = Some(v.parse().unwrap()),
            "--fragment-sync-delay" => cfg.fragment_sync_delay = Some(v.parse().unwrap()),
            "--fragment-alpha" => cfg.fragment_alpha = Some(v.parse().unwrap()),
            other => panic!("identity: unhandled flag {other}"),
        }
    }
    RunIdentity::from_spec(&cfg.algorithm_spec().unwrap(), cfg.workers)
}

/// Start `localsgd train` (ARGS, `--log-every 0`, a checkpoint every `every` iterations,
/// `extra`) in `run` and SIGKILL it after each delay, resuming from the second round on. After every kill, `latest` must name a complete
/// checkpoint of both ranks, and progress never goes backwards. Returns the iterations the last
/// checkpoint holds and whether a kill ever hit a checkpoint being written.
fn kill_rounds(run: &std::path::Path, every: u64, extra: &[&str], delays: &[u64]) -> (u64, bool) {
    let ckpts = CheckpointDir::new(run);
    let mut last_done = 0;
    let mut saw_staging = false;
    for (round, delay_ms) in delays.iter().enumerate() {
        let mut args: Vec<String> = ARGS.iter().map(|s| s.to_string()).collect();
        args.extend(["0".into(), "--run-dir".into(), run.display().to_string()]);
        args.extend(["--checkpoint-every".into(), every.to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        if round > 0 {
            args.extend(["--resume".into(), "true".into()]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_localsgd"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if round == 0 {
            // The first kill must find a checkpoint to resume from: wait for it (a slow machine
            // may take longer than the delay to start), then wait the delay.
            let started = std::time::Instant::now();
            while !run.join("checkpoints/latest").exists() {
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "no checkpoint after 120 s"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        std::thread::sleep(Duration::from_millis(*delay_ms));
        child.kill().unwrap(); // SIGKILL: no destructors, no cleanup
        child.wait().unwrap();
        saw_staging |= std::fs::read_dir(run.join("checkpoints"))
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            })
            .unwrap_or(false);
        // Whatever moment the kill hit, `latest` names a complete checkpoint of both ranks.
        let id = identity(extra);
        let r0 = ckpts.load_rank(0, &id).unwrap();
        let r1 = ckpts.load_rank(1, &id).unwrap();
        assert_eq!(r0.meta.iterations_done, r1.meta.iterations_done);
        assert!(
            r0.meta.iterations_done >= last_done,
            "progress went backwards"
        );
        last_done = r0.meta.iterations_done;
    }
    assert!(last_done > 0);
    (last_done, saw_staging)
}

/// Run ARGS with `--steps steps` (no logging), a checkpoint every `every` iterations and
/// `extra` in `run`, resuming if asked.
fn finish_run(run: &std::path::Path, steps: u64, every: u64, extra: &[&str], resume: bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args(&ARGS[..10])
        .args([&steps.to_string(), "--log-every", "0", "--run-dir"])
        .arg(run)
        .args(["--checkpoint-every", &every.to_string()])
        .args(extra)
        .args(["--resume", if resume { "true" } else { "false" }])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each rank's metrics file (`metrics.csv`, `metrics-rank1.csv`) of a finished run of `steps`
/// iterations: the header, then iterations `0..steps` once each and in order, every row
/// complete (as many fields as the header).
fn assert_metrics_once(run: &std::path::Path, steps: u64) {
    for file in ["metrics.csv", "metrics-rank1.csv"] {
        assert_file_once(&run.join(file), steps);
    }
}

fn assert_file_once(path: &std::path::Path, steps: u64) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.ends_with('\n'), "torn last row");
    let mut lines = text.lines();
    let fields = lines.next().unwrap().split(',').count();
    let mut iterations = Vec::new();
    for (k, row) in lines.enumerate() {
        assert_eq!(row.split(',').count(), fields, "row {k} is torn: {row}");
        iterations.push(row.split(',').next().unwrap().parse::<u64>().unwrap());
    }
    assert_eq!(iterations, (0..steps).collect::<Vec<_>>());
}

/// Kill delays (ms) from a seed: the first `first` ms or more (counted once the first checkpoint
/// exists), the rest spread over 250-900 ms so kills land anywhere in an iteration (the seed is
/// printed; every instant must pass).
fn random_delays(count: usize, first: u64) -> Vec<u64> {
    let seed = one_process_per_rank::seed("kill delays");
    let mut state = seed | 1;
    (0..count)
        .map(|k| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let spread = (state >> 33) % 650;
            if k == 0 {
                first + spread / 4
            } else {
                250 + spread
            }
        })
        .collect()
}

/// Checkpoints every iteration (kills often land inside a checkpoint write) and every 150 (a
/// kill finds rows still buffered, rows of iterations after the checkpoint already on disk, and
/// rows torn where the 8 KiB buffer was flushed mid-row): whatever the instant, the resumed run
/// ends with the final model of an uninterrupted run and each iteration once in its metrics.
#[test]
fn kill_during_checkpoint_write_leaves_the_previous_checkpoint_intact() {
    for (every, first) in [(1, 200), (150, 300)] {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let (last_done, saw_staging) = kill_rounds(&run, every, &[], &random_delays(6, first));
        let steps = last_done + 3;
        finish_run(&run, steps, every, &[], true);
        let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
        assert_eq!(latest.trim(), format!("step-{steps:08}"));
        assert_metrics_once(&run, steps);
        let straight = dir.path().join("straight");
        finish_run(&straight, steps, every, &[], false);
        let model = |run: &std::path::Path| std::fs::read(run.join("model.safetensors")).unwrap();
        assert!(
            model(&run) == model(&straight),
            "rank 0's final model after {steps} iterations differs from the uninterrupted run's"
        );
        eprintln!("checkpoint every {every}: killed mid-write at least once: {saw_staging}");
    }
}

/// Streaming DiLoCo killed at arbitrary moments (its checkpoints hold θ per fragment, the
/// outer momenta and, between a fragment's prepare and outer step, the pending averaged
/// pseudo-gradient) and resumed each time: the final model equals an uninterrupted run's bit
/// for bit.
#[test]
fn streaming_diloco_killed_and_resumed_equals_an_uninterrupted_run() {
    const STREAMING: [&str; 12] = [
        "--algorithm",
        "streaming-diloco",
        "--warmup",
        "3",
        "--period",
        "4",
        "--fragments",
        "2",
        "--fragment-sync-delay",
        "1",
        "--fragment-alpha",
        "0.5",
    ];
    let dir = tempfile::tempdir().unwrap();
    let killed = dir.path().join("killed");
    let (last_done, _) = kill_rounds(&killed, 1, &STREAMING, &[600, 450, 550]);
    let steps = last_done + 5;
    finish_run(&killed, steps, 1, &STREAMING, true);
    let straight = dir.path().join("straight");
    finish_run(&straight, steps, 1, &STREAMING, false);
    assert_metrics_once(&killed, steps);
    let model = |run: &std::path::Path| std::fs::read(run.join("model.safetensors")).unwrap();
    assert!(
        model(&killed) == model(&straight),
        "rank 0's final model after {steps} iterations differs from the uninterrupted run's"
    );
}
