//! `on_rank_failure = Replace` under MPI with ULFM (Open MPI 5, `mpirun --with-ft ulfm`; the
//! binary's `mpi_ulfm` tests say how it is installed): 3 processes of the `mpi_digits` example
//! with DiLoCo, one killed (`SIGKILL`) at a random optimizer step. The survivors start a
//! process of the same program in its place (`MPI_Comm_spawn`), a live rank hands it the killed
//! rank's state of the last epoch every rank saved, and the job ends on 3 ranks with the files
//! of the same MPI job in which nothing failed, bit for bit on every rank.

use crate::common::digits;
use crate::mpi::{assert_bits, example_binary};

use std::path::Path;
use std::process::Output;

const RANKS: usize = 3;
const EPOCHS: usize = 3;
/// Optimizer steps per epoch: 1437 training digits over 3 ranks in batches of 32.
const STEPS_PER_EPOCH: u64 = 15;

fn job(bin: &Path, out: &Path, kill_at: Option<(usize, u64)>) -> Output {
    let _one = localsgd_test_support::one_mpi_job();
    let mut cmd = localsgd_test_support::mpirun_ulfm(RANKS, bin.to_str().unwrap(), 120, &[]);
    cmd.args(["--algorithm", "diloco", "--period", "4"])
        .args(["--epochs", &EPOCHS.to_string()])
        .args(["--on-rank-failure", "replace"])
        .arg("--out")
        .arg(out);
    if let Some((rank, step)) = kill_at {
        cmd.args(["--kill-at", &format!("{rank}:{step}")]);
    }
    let output = cmd.output().expect("run Open MPI 5's mpirun");
    println!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn a_killed_rank_is_replaced_and_the_job_ends_as_without_the_failure() {
    let bin = example_binary();
    let seed = localsgd_test_support::test_seed("the killed rank and step");
    let killed = (seed % RANKS as u64) as usize;
    // Any step but the last: in epoch 1 the world starts over, later from the last saved epoch.
    let step = 2 + (seed / 7) % (EPOCHS as u64 * STEPS_PER_EPOCH - 2);
    let dir = tempfile::tempdir().unwrap();
    let (replaced, reference) = (dir.path().join("replaced"), dir.path().join("reference"));
    let out = job(&bin, &replaced, Some((killed, step)));
    let text = String::from_utf8_lossy(&out.stdout);
    for rank in 0..RANKS {
        assert!(
            text.contains(&format!(
                "rank {rank} of {RANKS}: diloco for {EPOCHS} epochs"
            )),
            "rank {rank} did not finish: {text}"
        );
    }
    let membership =
        std::fs::read_to_string(replaced.join("strategy").join("membership.csv")).unwrap();
    // The state the world went back to: the last epoch every rank saved before the kill.
    let saved = STEPS_PER_EPOCH * ((step - 1) / STEPS_PER_EPOCH);
    assert!(
        membership.lines().nth(1).is_some_and(|l| {
            let row: Vec<&str> = l.split(',').collect();
            row[0] == saved.to_string()
                && row[2..6] == [&killed.to_string(), &killed.to_string(), "3", "0 1 2"]
        }),
        "killed rank {killed} at step {step}: {membership}"
    );
    let out = job(&bin, &reference, None);
    assert!(out.status.success(), "the job without a failure failed");
    for rank in 0..RANKS {
        let read = |dir: &Path, file: fn(&Path, usize) -> std::path::PathBuf| {
            digits::read_f32(&file(dir, rank)).unwrap()
        };
        assert_bits(
            &format!("rank {rank}'s own parameters (rank {killed} killed at step {step})"),
            &read(&replaced, digits::own_file),
            &read(&reference, digits::own_file),
        );
        assert_bits(
            &format!("the world average rank {rank} returned"),
            &read(&replaced, digits::averaged_file),
            &read(&reference, digits::averaged_file),
        );
    }
}
