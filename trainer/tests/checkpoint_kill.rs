//! Atomic checkpoints: kill -9 the trainer while it checkpoints every iteration; the latest
//! checkpoint is always complete and a resumed run continues from it.

use localsgd_trainer::algorithm::AlgorithmSpec;
use localsgd_trainer::checkpoint::{CheckpointDir, RunIdentity};
use localsgd_trainer::config::{AlgorithmKind, DatasetKind, TrainConfig};
use std::process::{Command, Stdio};
use std::time::Duration;

const ARGS: [&str; 14] = [
    "train",
    "--dataset",
    "synthetic",
    "--synthetic-dim",
    "64",
    "--hidden",
    "512,512",
    "--checkpoint-every",
    "1",
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
            "--period" => cfg.period = v.parse().unwrap(),
            "--fragments" => cfg.fragments = Some(v.parse().unwrap()),
            "--fragment-sync-delay" => cfg.fragment_sync_delay = Some(v.parse().unwrap()),
            "--fragment-alpha" => cfg.fragment_alpha = Some(v.parse().unwrap()),
            other => panic!("identity: unhandled flag {other}"),
        }
    }
    RunIdentity {
        world_size: cfg.workers,
        algorithm: AlgorithmSpec::from_config(&cfg).unwrap().identity(),
    }
}

/// Start `localsgd train` (ARGS, `--log-every 0`, `extra`) in `run` and SIGKILL it after each
/// delay, resuming from the second round on. After every kill, `latest` must name a complete
/// checkpoint of both ranks, and progress never goes backwards. Returns the iterations the last
/// checkpoint holds and whether a kill ever hit a checkpoint being written.
fn kill_rounds(run: &std::path::Path, extra: &[&str], delays: &[u64]) -> (u64, bool) {
    let ckpts = CheckpointDir::new(run);
    let mut last_done = 0;
    let mut saw_staging = false;
    for (round, delay_ms) in delays.iter().enumerate() {
        let mut args: Vec<String> = ARGS.iter().map(|s| s.to_string()).collect();
        args.extend(["0".into(), "--run-dir".into(), run.display().to_string()]);
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

/// Run ARGS with `--steps steps` (no logging) and `extra` in `run`, resuming if asked.
fn finish_run(run: &std::path::Path, steps: u64, extra: &[&str], resume: bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args(&ARGS[..12])
        .args([&steps.to_string(), "--log-every", "0", "--run-dir"])
        .arg(run)
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

#[test]
fn kill_during_checkpoint_write_leaves_the_previous_checkpoint_intact() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (last_done, saw_staging) = kill_rounds(&run, &[], &[700, 410, 530, 650, 770]);
    // A resumed run continues from the last complete checkpoint and finishes cleanly.
    finish_run(&run, last_done + 3, &[], true);
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{:08}", last_done + 3));
    eprintln!("killed mid-write at least once: {saw_staging}");
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
    let (last_done, _) = kill_rounds(&killed, &STREAMING, &[600, 450, 550]);
    let steps = last_done + 5;
    finish_run(&killed, steps, &STREAMING, true);
    let straight = dir.path().join("straight");
    finish_run(&straight, steps, &STREAMING, false);
    let model = |run: &std::path::Path| std::fs::read(run.join("model.safetensors")).unwrap();
    assert!(
        model(&killed) == model(&straight),
        "rank 0's final model after {steps} iterations differs from the uninterrupted run's"
    );
}
