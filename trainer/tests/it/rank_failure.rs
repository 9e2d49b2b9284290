//! `on-rank-failure = "continue"` on the thread backend: a rank that fails leaves, the survivors
//! go back to the last checkpoint and train on. The reference is computed another way: the same
//! run stopped at that checkpoint (`steps`), then resumed on the survivors alone with
//! `resume-ranks` (a new process, a new world of 3 threads). The survivors' final parameters
//! must equal the reference's bit for bit, for every algorithm.

use localsgd_pipeline::checkpoint::{CheckpointDir, RunIdentity};
use localsgd_trainer::config::{AlgorithmKind, TrainConfig};
use std::path::Path;
use std::process::Command;

/// The settings every run here shares: 4 workers on synthetic data, a checkpoint every
/// `every` iterations, 14 iterations (200 rows: 160 for training, 40 per rank and epoch at 4
/// workers, 54 at 3: 3 and 4 batches of 16, so the failures fall mid-epoch and the survivors'
/// epochs are dealt again).
pub(crate) fn args(
    algorithm: &str,
    run: &Path,
    workers: usize,
    every: u64,
    steps: u64,
) -> Vec<String> {
    let mut a: Vec<String> = [
        "train",
        "--algorithm",
        algorithm,
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "200",
        "--synthetic-dim",
        "6",
        "--synthetic-classes",
        "3",
        "--hidden",
        "8",
        "--batch-size",
        "16",
        "--lr",
        "0.05",
        "--momentum",
        "0.9",
        "--shuffle",
        "true",
        "--log-every",
        "3",
        "--progress",
        "false",
        "--timeout-secs",
        "20",
    ]
    .map(String::from)
    .to_vec();
    a.extend([
        "--workers".into(),
        workers.to_string(),
        "--checkpoint-every".into(),
        every.to_string(),
        "--steps".into(),
        steps.to_string(),
        "--run-dir".into(),
        run.display().to_string(),
    ]);
    // DDP has no warmup (it refuses one).
    if algorithm != "ddp" {
        a.extend(["--warmup".into(), "2".into()]);
    }
    match algorithm {
        "hierarchical" => a.extend(["--levels".into(), format!("2:1,4:{workers}")]),
        "ddp" => {}
        // Two fragments, each synced every 4 steps.
        "streaming-diloco" => a.extend(["--period".into(), "4".into()]),
        _ => a.extend(["--period".into(), "3".into()]),
    }
    a
}

pub(crate) fn localsgd(args: &[String], fault: Option<&str>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_localsgd"));
    cmd.args(args).env_remove("LOCALSGD_FAULT");
    if let Some(f) = fault {
        cmd.env("LOCALSGD_FAULT", f);
    }
    let out = cmd.output().expect("running localsgd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "localsgd {args:?} ({fault:?}): {text}"
    );
    text
}

/// Every rank's parameters in the run's latest checkpoint (its final state), as bits.
pub(crate) fn final_params(run: &Path, algorithm: &str) -> (RunIdentity, Vec<Vec<u32>>) {
    let dir = CheckpointDir::new(run);
    let (_, saved) = dir.latest_identity().unwrap();
    let params = (0..saved.world_size)
        .map(|rank| {
            let ckpt = dir.load_rank(rank, &saved).unwrap();
            match ckpt.params {
                localsgd_comm::params::FlatBuffer::F32(v) => {
                    v.iter().map(|x| x.to_bits()).collect()
                }
                other => panic!("{algorithm}: unexpected {other:?}"),
            }
        })
        .collect();
    (saved, params)
}

/// Rank `failed` panics before iteration `at`; checkpoints every `every` iterations, so the
/// survivors continue from iteration `at - at % every`.
fn check(algorithm: &str, every: u64, failed: usize, at: u64) {
    check_fault(
        algorithm,
        every,
        failed,
        &format!("panic@{failed}:{at}"),
        at,
        at - at % every,
    );
}

/// `fault` makes rank `failed` fail; the survivors see it after `at` iterations and continue
/// from the checkpoint of `resumed_at`.
fn check_fault(algorithm: &str, every: u64, failed: usize, fault: &str, at: u64, resumed_at: u64) {
    let steps = 14;
    let survivors: Vec<usize> = (0..4).filter(|&r| r != failed).collect();

    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("continue");
    let mut a = args(algorithm, &run, 4, every, steps);
    a.extend(["--on-rank-failure".into(), "continue".into()]);
    let out = localsgd(&a, Some(fault));
    assert!(
        out.contains(&format!(
            "rank(s) [{failed}] left at iteration {at}: 3 workers continued from iteration {resumed_at}"
        )),
        "{algorithm}: {out}"
    );

    let reference = dir.path().join("reference");
    localsgd(&args(algorithm, &reference, 4, every, resumed_at), None);
    let mut b = args(algorithm, &reference, 3, every, steps);
    let ranks: Vec<String> = survivors.iter().map(usize::to_string).collect();
    b.extend([
        "--resume".into(),
        "true".into(),
        "--resume-ranks".into(),
        ranks.join(","),
    ]);
    localsgd(&b, None);

    let (got_identity, got) = final_params(&run, algorithm);
    let (want_identity, want) = final_params(&reference, algorithm);
    assert_eq!(got_identity.world_size, 3, "{algorithm}");
    assert_eq!(got_identity.member_ranks(), survivors, "{algorithm}");
    assert_eq!(want_identity.world_size, 3, "{algorithm}");
    for rank in 0..3 {
        assert_eq!(
            got[rank], want[rank],
            "{algorithm}: survivor {rank} (job rank {}) differs from the resumed reference",
            survivors[rank]
        );
    }

    let membership = std::fs::read_to_string(run.join("membership.csv")).unwrap();
    let rows: Vec<&str> = membership.lines().collect();
    assert_eq!(rows.len(), 2, "{algorithm}: {membership}");
    let remaining: Vec<String> = survivors.iter().map(usize::to_string).collect();
    assert!(
        rows[1].starts_with(&format!(
            "{resumed_at},{at},{failed},,3,{},",
            remaining.join(" ")
        )),
        "{algorithm}: {membership}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["world_size"], 3, "{algorithm}");
    assert_eq!(
        summary["membership"][0]["left"],
        serde_json::json!([failed])
    );
    assert_eq!(summary["iterations"], steps, "{algorithm}");
}

#[test]
fn ddp_continues_on_the_survivors_as_a_resume_on_them_would() {
    check("ddp", 1, 2, 5);
}

#[test]
fn local_sgd_continues_on_the_survivors_as_a_resume_on_them_would() {
    check("local-sgd", 1, 0, 7);
}

#[test]
fn post_local_sgd_goes_back_to_the_last_checkpoint() {
    // Checkpoints every 4: the failure before iteration 7 resumes from 4.
    check("post-local-sgd", 4, 3, 7);
}

#[test]
fn hierarchical_rebuilds_its_levels_on_the_survivors() {
    check("hierarchical", 1, 1, 6);
}

#[test]
fn diloco_keeps_its_outer_state_on_the_survivors() {
    check("diloco", 1, 2, 8);
}

#[test]
fn slowmo_and_streaming_diloco_continue_on_the_survivors() {
    check("slowmo", 1, 3, 5);
    check("streaming-diloco", 2, 1, 9);
}

/// A rank that fails after writing its file of a checkpoint, before the checkpoint is
/// published: the previous checkpoint is the one the survivors take up, intact.
#[test]
fn a_failure_inside_a_checkpoint_leaves_the_previous_one() {
    // Rank 2 panics after the checkpoint of 8 iterations is written, before it is published,
    // so the survivors go back to 4.
    check_fault("local-sgd", 4, 2, "checkpoint@2:8", 8, 4);
}

/// A rank that fails inside an iteration, after the ranks agreed on data: its peers meet the
/// failure in the gradient sync (DDP) or in the average (post-local SGD averages at 8), not at
/// the iteration's start.
#[test]
fn a_failure_inside_an_iteration_is_survived_too() {
    check_fault("ddp", 1, 2, "step@2:5", 5, 5);
    check_fault("post-local-sgd", 1, 3, "step@3:8", 8, 8);
}

/// A run directory a finished job left behind: a new job (no `resume`) whose rank fails before
/// it published a checkpoint of its own does not take up the old job's checkpoint; the
/// survivors start over, and end as a fresh run of three workers does.
#[test]
fn survivors_never_take_up_another_jobs_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    localsgd(&args("local-sgd", &run, 4, 1, 9), None);
    let mut a = args("local-sgd", &run, 4, 1, 14);
    a.extend(["--on-rank-failure".into(), "continue".into()]);
    let out = localsgd(&a, Some("panic@1:0"));
    assert!(
        out.contains("rank(s) [1] left at iteration 0: 3 workers continued from iteration 0"),
        "{out}"
    );
    let fresh = dir.path().join("fresh");
    localsgd(&args("local-sgd", &fresh, 3, 1, 14), None);
    let (_, got) = final_params(&run, "local-sgd");
    let (_, want) = final_params(&fresh, "local-sgd");
    assert_eq!(got, want);
}

/// A run of `epochs` (no `steps`): the survivors' run ends with the epochs, counted in their
/// own batches, as the resume on them does (the run's length is the iterations left).
#[test]
fn an_epoch_run_ends_with_its_epochs_after_a_failure() {
    let epochs = |a: &mut Vec<String>| {
        let i = a.iter().position(|x| x == "--steps").unwrap();
        a.splice(i..i + 2, ["--epochs".to_string(), "2".to_string()]);
    };
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("continue");
    let mut a = args("local-sgd", &run, 4, 1, 0);
    epochs(&mut a);
    a.extend(["--on-rank-failure".into(), "continue".into()]);
    localsgd(&a, Some("panic@2:4"));
    let reference = dir.path().join("reference");
    localsgd(&args("local-sgd", &reference, 4, 1, 4), None);
    let mut b = args("local-sgd", &reference, 3, 1, 0);
    epochs(&mut b);
    b.extend([
        "--resume".into(),
        "true".into(),
        "--resume-ranks".into(),
        "0,1,3".into(),
    ]);
    localsgd(&b, None);
    let summary = |d: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(d.join("summary.json")).unwrap()).unwrap()
    };
    // 160 training rows; on 4 ranks 40 each, 3 batches of 16 per epoch: iterations 0-2 are
    // epoch 0 and iteration 3 is epoch 1's first batch (64 of its rows dealt). The other 96
    // rows go to the 3 survivors, 32 each, 2 batches: 4 + 2 = 6 iterations, then the epochs
    // are done.
    assert_eq!(summary(&run)["iterations"], 6);
    assert_eq!(summary(&reference)["iterations"], 6);
    assert_eq!(
        final_params(&run, "epochs").1,
        final_params(&reference, "epochs").1
    );
}

#[test]
fn two_failures_in_a_row_leave_two_workers() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut a = args("diloco", &run, 4, 1, 14);
    a.extend(["--on-rank-failure".into(), "continue".into()]);
    let out = localsgd(&a, Some("panic@1:4,panic@3:9"));
    assert!(
        out.contains("rank(s) [1] left at iteration 4: 3 workers"),
        "{out}"
    );
    assert!(
        out.contains("rank(s) [3] left at iteration 9: 2 workers"),
        "{out}"
    );
    let (identity, params) = final_params(&run, "diloco");
    assert_eq!(identity.members, vec![0, 2]);
    assert_eq!(params.len(), 2);
    let membership = std::fs::read_to_string(run.join("membership.csv")).unwrap();
    assert_eq!(membership.lines().count(), 3, "{membership}");
}

#[test]
fn continue_is_refused_without_checkpoints_or_on_nccl() {
    let bad = |extra: &[&str]| {
        let mut cfg = TrainConfig {
            algorithm: AlgorithmKind::LocalSgd,
            ..TrainConfig::default()
        };
        cfg.on_rank_failure = localsgd_trainer::config::OnRankFailure::Continue;
        cfg.checkpoint_every = 1;
        for e in extra {
            match *e {
                "no-checkpoints" => cfg.checkpoint_every = 0,
                "nccl" => cfg.backend = localsgd_trainer::config::Backend::Nccl,
                "replace" => cfg.on_rank_failure = localsgd_trainer::config::OnRankFailure::Replace,
                _ => unreachable!(),
            }
        }
        cfg.validate().unwrap_err().to_string()
    };
    let e = bad(&["no-checkpoints"]);
    assert!(
        e.contains("on-rank-failure") && e.contains("checkpoint-every"),
        "{e}"
    );
    let e = bad(&["nccl"]);
    assert!(
        e.contains("on-rank-failure") && e.contains("backend nccl") && e.contains("ULFM"),
        "{e}"
    );
    let e = bad(&["replace", "no-checkpoints"]);
    assert!(
        e.contains("= replace") && e.contains("checkpoint-every"),
        "{e}"
    );
    let e = bad(&["replace", "nccl"]);
    assert!(e.contains("= replace") && e.contains("backend nccl"), "{e}");
}

/// A lower hierarchical level that no longer divides the survivors' world ends the run with an
/// error naming it (not the failure it survived, and not a hang).
#[test]
fn a_level_that_no_longer_fits_the_survivors_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args("hierarchical", &dir.path().join("run"), 4, 1, 14);
    let levels = a.iter().position(|x| x == "--levels").unwrap() + 1;
    a[levels] = "2:2,4:4".into();
    a.extend(["--on-rank-failure".into(), "continue".into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args(&a)
        .env("LOCALSGD_FAULT", "panic@1:6")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error: invalid setting `levels` = \"2:2,4:3\"")
            && stderr.contains("(3 workers)"),
        "{stderr}"
    );
}
