//! Atomic checkpoints: kill -9 the trainer while it checkpoints every iteration; the latest
//! checkpoint is always complete and a resumed run continues from it.

use localsgd_trainer::algorithm::AlgorithmSpec;
use localsgd_trainer::checkpoint::{CheckpointDir, RunIdentity};
use localsgd_trainer::config::{DatasetKind, TrainConfig};
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

fn identity() -> RunIdentity {
    let cfg = TrainConfig {
        dataset: DatasetKind::Synthetic,
        synthetic_dim: 64,
        hidden: vec![512, 512],
        checkpoint_every: 1,
        ..TrainConfig::default()
    };
    RunIdentity {
        world_size: cfg.workers,
        algorithm: AlgorithmSpec::from_config(&cfg).unwrap().identity(),
    }
}

#[test]
fn kill_during_checkpoint_write_leaves_the_previous_checkpoint_intact() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let ckpts = CheckpointDir::new(&run);
    let mut last_done = 0;
    let mut saw_staging = false;
    for (round, delay_ms) in [700u64, 410, 530, 650, 770].into_iter().enumerate() {
        let mut args: Vec<String> = ARGS.iter().map(|s| s.to_string()).collect();
        args.extend(["0".into(), "--run-dir".into(), run.display().to_string()]);
        if round > 0 {
            args.extend(["--resume".into(), "true".into()]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_localsgd"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL: no destructors, no cleanup
        child.wait().unwrap();
        saw_staging |= std::fs::read_dir(run.join("checkpoints"))
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            })
            .unwrap_or(false);
        // Whatever moment the kill hit, `latest` names a complete checkpoint of both ranks.
        let id = identity();
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
    // A resumed run continues from the last complete checkpoint and finishes cleanly.
    let target = (last_done + 3).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args(&ARGS[..12])
        .args([&target, "--log-every", "0", "--resume", "true", "--run-dir"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{:08}", last_done + 3));
    eprintln!("killed mid-write at least once: {saw_staging}");
}
