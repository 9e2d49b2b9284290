//! The fault soak, thread backend: many short `localsgd train` runs, each with one random fault
//! injected through `LOCALSGD_FAULT` (a rank panicking, stalled past the collective timeout,
//! aborting its process, issuing a mismatched collective, or running out of data early). Every
//! run must end within the timeout plus a few seconds (no hang), with the error that names the
//! faulty rank (or, for `short`, successfully), and leave `checkpoints/latest` naming a complete,
//! loadable checkpoint of every rank. The seed is printed (`LOCALSGD_TEST_SEED` replays it); the
//! counts are printed at the end.
//! The MPI soak is in `mpi_train.rs`.

use crate::one_process_per_rank;

use one_process_per_rank::{Lcg, assert_checkpoint_intact, run_bounded};
use std::process::Command;
use std::time::Duration;

const TIMEOUT_SECS: u64 = 3;

/// A run must end within this: the collective timeout, the stall (timeout + 3 s), and slack.
const DEADLINE: Duration = Duration::from_secs(2 * TIMEOUT_SECS + 3 + 8);

#[test]
fn random_faults_end_each_run_cleanly_naming_the_rank() {
    let seed = one_process_per_rank::seed("fault soak");
    let mut rng = Lcg::new(seed);
    let kinds = ["panic", "stall", "abort", "kill", "mismatch", "short"];
    let algorithms = [
        "ddp",
        "post-local-sgd",
        "local-sgd",
        "diloco",
        "hierarchical",
    ];
    let runs = 20;
    let mut counts = std::collections::BTreeMap::new();
    for k in 0..runs {
        // Every kind at least 3 times, the rest at random.
        let kind = kinds[if k < 3 * kinds.len() {
            k % kinds.len()
        } else {
            rng.below(kinds.len() as u64) as usize
        }];
        let workers = 2 + rng.below(3) as usize; // 2 to 4
        let algorithm = algorithms[rng.below(5) as usize];
        let rank = rng.below(workers as u64) as usize;
        let iteration = 1 + rng.below(24);
        let fault = format!("{kind}@{rank}:{iteration}");
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let mut args = vec![
            "train".to_string(),
            "--workers".into(),
            workers.to_string(),
            "--algorithm".into(),
            algorithm.into(),
            "--steps".into(),
            "30".into(),
            "--checkpoint-every".into(),
            "4".into(),
            "--timeout-secs".into(),
            TIMEOUT_SECS.to_string(),
            "--progress".into(),
            "false".into(),
            "--run-dir".into(),
            run.display().to_string(),
        ];
        // Each algorithm with the settings it takes: levels for hierarchical averaging, a
        // period for those that average on one (DDP takes neither).
        // DDP has no warmup (it refuses one).
        if algorithm != "ddp" {
            args.extend(["--warmup".into(), "3".into()]);
        }
        match algorithm {
            "hierarchical" => args.extend(["--levels".into(), format!("2:1,4:{workers}")]),
            "ddp" => {}
            _ => args.extend(["--period".into(), "2".into()]),
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_localsgd"));
        cmd.args(&args).env("LOCALSGD_FAULT", &fault);
        let (status, stderr, took) = run_bounded(
            &mut cmd,
            DEADLINE,
            &format!("{fault} ({algorithm}, {workers} workers)"),
        );
        let what =
            format!("{fault} ({algorithm}, {workers} workers, {took:?}): {status}\n{stderr}");
        match kind {
            "panic" => {
                assert_eq!(status.code(), Some(2), "{what}");
                assert!(
                    stderr.contains(&format!("error: rank {rank} panicked: injected fault")),
                    "{what}"
                );
            }
            "stall" => {
                assert_eq!(status.code(), Some(2), "{what}");
                assert!(stderr.contains("timed out after"), "{what}");
                assert!(
                    stderr.contains("did not arrive") && stderr.contains(&format!("[{rank}]")),
                    "{what}"
                );
            }
            "abort" => {
                assert_eq!(status.code(), None, "killed by a signal: {what}");
                assert!(
                    stderr.contains(&format!("injected fault: rank {rank} aborts")),
                    "{what}"
                );
            }
            "kill" => {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {what}");
                assert!(
                    stderr.contains(&format!(
                        "injected fault: rank {rank} sends its process SIGKILL"
                    )),
                    "{what}"
                );
            }
            "mismatch" => {
                assert_eq!(status.code(), Some(2), "{what}");
                assert!(stderr.contains("collective mismatch"), "{what}");
                assert!(
                    stderr.contains(&format!("rank {rank} called barrier()")),
                    "{what}"
                );
            }
            _ => assert!(status.success(), "{what}"),
        }
        assert_checkpoint_intact(&run, workers);
        *counts.entry(kind).or_insert(0) += 1;
    }
    eprintln!("fault soak (threads): {runs} runs, every one ended cleanly, none hung: {counts:?}");
}
