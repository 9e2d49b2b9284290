//! `on-rank-failure = "replace"` on the thread backend: the survivors of a failed rank start a
//! replacement, hand it the failed rank's state of the last checkpoint, and the world of 4
//! trains on from that checkpoint. The reference is independent of every recovery path: the
//! same run with nothing failing. Every rank's final parameters must equal it bit for bit.

use super::rank_failure::{args, final_params, localsgd};
use std::path::Path;

const STEPS: u64 = 14;

/// Run `algorithm` with `fault` under `replace` and without any fault; returns the replace
/// run's output after checking that both end with the same parameters on every rank.
fn check(
    algorithm: &str,
    every: u64,
    fault: &str,
) -> (String, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("replace");
    let mut a = args(algorithm, &run, 4, every, STEPS);
    a.extend(["--on-rank-failure".into(), "replace".into()]);
    let out = localsgd(&a, Some(fault));
    let reference = dir.path().join("reference");
    localsgd(&args(algorithm, &reference, 4, every, STEPS), None);
    let (got_identity, got) = final_params(&run, algorithm);
    let (_, want) = final_params(&reference, algorithm);
    assert_eq!(got_identity.world_size, 4, "{algorithm}: {out}");
    assert_eq!(got_identity.member_ranks(), vec![0, 1, 2, 3], "{algorithm}");
    for rank in 0..4 {
        assert_eq!(
            got[rank], want[rank],
            "{algorithm} ({fault}): rank {rank} differs from the run without a failure"
        );
    }
    (out, run, dir)
}

fn membership_rows(run: &Path) -> Vec<String> {
    std::fs::read_to_string(run.join("membership.csv"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn every_algorithm_ends_as_if_nothing_had_failed() {
    for (algorithm, every, failed, at) in [
        ("ddp", 1, 2, 5),
        ("local-sgd", 2, 1, 7),
        ("post-local-sgd", 4, 3, 7),
        ("hierarchical", 1, 1, 6),
    ] {
        let (out, run, _dir) = check(algorithm, every, &format!("panic@{failed}:{at}"));
        let resumed_at = at - at % every;
        assert!(
            out.contains(&format!(
                "rank(s) [{failed}] left at iteration {at}, replaced by new workers [{failed}]: \
                 4 workers continued from iteration {resumed_at}"
            )),
            "{algorithm}: {out}"
        );
        let rows = membership_rows(&run);
        assert_eq!(
            rows[0],
            "iteration,detected_at,left,joined,world_size,members,recovery_seconds"
        );
        assert!(
            rows[1].starts_with(&format!("{resumed_at},{at},{failed},{failed},4,0 1 2 3,")),
            "{algorithm}: {rows:?}"
        );
    }
}

#[test]
fn outer_optimizers_end_as_if_nothing_had_failed() {
    check("diloco", 1, "panic@2:8");
    check("slowmo", 1, "panic@3:5");
    check("streaming-diloco", 2, "panic@1:9");
}

/// Rank 0 fails: the replacement becomes rank 0, writes the records and reports.
#[test]
fn rank_0_is_replaced_too() {
    let (out, run, _dir) = check("local-sgd", 1, "panic@0:6");
    assert!(
        out.contains("rank(s) [0] left at iteration 6, replaced"),
        "{out}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["world_size"], 4);
    assert_eq!(summary["membership"][0]["joined"], serde_json::json!([0]));
    assert_eq!(summary["iterations"], STEPS);
}

/// The replacement fails again (its own later fault): a second replacement takes over; a
/// failure inside an iteration, and one inside a checkpoint (the previous one is taken up),
/// and one before the first checkpoint (everyone starts over).
#[test]
fn repeated_failures_and_failures_mid_iteration_or_mid_checkpoint() {
    let (_, run, _dir) = check("post-local-sgd", 2, "panic@1:5,panic@1:9");
    let rows = membership_rows(&run);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows[1].starts_with("4,5,1,1,4,"), "{rows:?}");
    assert!(rows[2].starts_with("8,9,1,1,4,"), "{rows:?}");
    check("ddp", 1, "step@2:5");
    // Rank 2 fails after the checkpoint of 8 iterations is written, before it is published,
    // so the world goes back to 4.
    let (_, run, _dir) = check("local-sgd", 4, "checkpoint@2:8");
    assert!(membership_rows(&run)[1].starts_with("4,8,2,2,4,"));
    let (_, run, _dir) = check("diloco", 4, "panic@3:2");
    assert!(membership_rows(&run)[1].starts_with("0,2,3,3,4,"));
}

/// A replacement for a rank the saving world did not have takes a copy of the sender's state:
/// a 4-worker job resumed from a 3-worker checkpoint (`resume-ranks = [0, 1, 2, 0]`: rank 3
/// starts as a copy of saved rank 0) loses rank 3 before its first checkpoint; its replacement
/// again starts as a copy of the sender's saved rank 0, so the run ends as the same resumed
/// run without a failure.
#[test]
fn a_rank_the_saving_world_lacked_is_replaced_by_a_copy_of_the_sender() {
    let dir = tempfile::tempdir().unwrap();
    let three = |run: &Path| {
        let mut a = args("local-sgd", run, 3, 4, 4);
        a.extend(["--on-rank-failure".into(), "replace".into()]);
        a
    };
    let resumed = |run: &Path| {
        let mut a = args("local-sgd", run, 4, 4, STEPS);
        a.extend([
            "--on-rank-failure".into(),
            "replace".into(),
            "--resume".into(),
            "true".into(),
            "--resume-ranks".into(),
            "0,1,2,0".into(),
        ]);
        a
    };
    let (run, reference) = (dir.path().join("replace"), dir.path().join("reference"));
    for r in [&run, &reference] {
        localsgd(&three(r), None);
    }
    let out = localsgd(&resumed(&run), Some("panic@3:6"));
    assert!(
        out.contains(
            "rank(s) [3] left at iteration 6, replaced by new workers [3]: 4 workers \
             continued from iteration 4"
        ),
        "{out}"
    );
    localsgd(&resumed(&reference), None);
    let (_, got) = final_params(&run, "local-sgd");
    let (_, want) = final_params(&reference, "local-sgd");
    assert_eq!(got, want);
}
