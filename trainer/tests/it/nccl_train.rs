//! `localsgd train --backend nccl`: one process per rank, started here the way torchrun would
//! (`LOCALSGD_RANK`, `LOCALSGD_WORLD_SIZE`, `LOCALSGD_MASTER_ADDR`, `LOCALSGD_MASTER_PORT`).
//! Without a GPU every rank fails cleanly; against the CPU stand-ins for libcuda and libnccl
//! (`localsgd_comm::nccl::stand_in`) two ranks train to the same parameters, bit for bit, as two
//! threads, and a wrong `workers` is refused once. The stand-ins check our side only: running on
//! a GPU is `scripts/gpu-smoke`'s job.
#![cfg(feature = "nccl")]

use crate::one_process_per_rank;

use localsgd_comm::nccl::{NcclWorld, stand_in};
use one_process_per_rank::{BIN, args, final_params, run_threads, show};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Start `ranks` processes of `localsgd <args> --backend nccl` (each prepared by `prepare`),
/// and wait for all of them.
fn launch(ranks: usize, args: &[String], prepare: impl Fn(&mut Command)) -> Vec<Output> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let children: Vec<_> = (0..ranks)
        .map(|r| {
            let mut cmd = Command::new(BIN);
            prepare(&mut cmd);
            cmd.args(args)
                .args(["--backend", "nccl"])
                .env("LOCALSGD_RANK", r.to_string())
                .env("LOCALSGD_WORLD_SIZE", ranks.to_string())
                .env("LOCALSGD_MASTER_ADDR", "127.0.0.1")
                .env("LOCALSGD_MASTER_PORT", port.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait for a rank"))
        .collect()
}

fn stand_ins(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("stand-in-{name}"));
    if let Err(e) = stand_in::build(&dir, true) {
        panic!("building the stand-ins: {e}");
    }
    dir
}

#[test]
fn without_a_gpu_every_rank_fails_cleanly_and_writes_nothing() {
    if let Ok(p) = NcclWorld::probe() {
        println!(
            "SKIPPED without_a_gpu_every_rank_fails_cleanly_and_writes_nothing: this machine has {} GPU(s)",
            p.devices
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let outs = launch(2, &args(&run_dir, 60), |cmd| {
        cmd.env_remove("LOCALSGD_NCCL_LIB");
    });
    for out in &outs {
        assert_eq!(out.status.code(), Some(2), "{}", show(out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("error: starting NCCL: "), "{}", show(out));
        assert!(
            stderr.contains("libcuda") || stderr.contains("libnccl") || stderr.contains("GPU"),
            "{}",
            show(out)
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
    assert!(!run_dir.exists(), "nothing may be written");
}

/// With 2 ranks every reduction adds two numbers, whatever the order: NCCL (here the
/// stand-in) must give the thread backend's parameters bit for bit.
#[test]
fn two_ranks_on_stand_ins_equal_two_threads_bit_for_bit() {
    let dir = stand_ins("train");
    let threads = tempfile::tempdir().unwrap();
    let nccl = tempfile::tempdir().unwrap();
    run_threads(2, &args(threads.path(), 60));
    let outs = launch(2, &args(nccl.path(), 60), |cmd| {
        stand_in::configure(cmd, &dir, 2)
    });
    for out in &outs {
        assert!(out.status.success(), "{}", show(out));
    }
    let stdout = String::from_utf8_lossy(&outs[0].stdout);
    assert!(
        stdout.contains("NCCL: 2 ranks on 1 host(s); intra-node groups (world ranks): [0, 1]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("trained 60 iterations on 2 workers (PostLocalSgd, Nccl backend)"),
        "{stdout}"
    );
    // Rank 0 alone reports and writes the run directory.
    assert!(
        !String::from_utf8_lossy(&outs[1].stdout).contains("test accuracy:"),
        "{}",
        show(&outs[1])
    );
    for file in ["config.toml", "summary.json", "metrics.csv", "loss.svg"] {
        assert!(nccl.path().join(file).is_file(), "missing {file}");
    }
    let want = final_params(threads.path(), 2);
    let got = final_params(nccl.path(), 2);
    for rank in 0..2 {
        assert_eq!(got[rank], want[rank], "rank {rank}");
    }
}

#[test]
fn a_workers_setting_other_than_the_world_size_is_refused_once() {
    let dir = stand_ins("workers");
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let mut a = args(&run_dir, 60);
    a.extend(["--workers".to_string(), "3".to_string()]);
    let outs = launch(2, &a, |cmd| stand_in::configure(cmd, &dir, 2));
    let msg = "invalid setting `workers` = 3: under NCCL the number of workers is the world size, 2 here (`WORLD_SIZE=2` or `LOCALSGD_WORLD_SIZE=2`)";
    let mut said = 0;
    for out in &outs {
        assert_eq!(out.status.code(), Some(2), "{}", show(out));
        said += String::from_utf8_lossy(&out.stderr).matches(msg).count();
    }
    assert_eq!(said, 1, "rank 0 alone reports: {}", show(&outs[0]));
    assert!(!run_dir.exists(), "nothing may be written");
}
