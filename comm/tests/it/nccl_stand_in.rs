//! The NCCL backend's own logic, run end to end without a GPU: `nccl_smoke` (every collective
//! on every element type, broadcasts, gathers, subgroups, mismatch detection, a short training)
//! as 2 and 3 rank processes against CPU stand-ins for `libcuda.so.1` and `libnccl.so.2`
//! (`tests/stand_in/*.c`, compiled with `cc` by `localsgd_comm::nccl::stand_in`). This checks our side — buffer sizes and
//! offsets, datatype and operation codes, subgroup ranks through `ncclCommSplit` and through
//! the pre-2.18 fallback, traffic counters, the wait for a busy stream — not CUDA or NCCL
//! themselves: running on a GPU is `scripts/gpu-smoke`'s job. Two more tests run failure
//! scenarios (a peer that never comes; mismatched calls without the signature check) with two
//! ranks as threads of a child process that has the stand-ins on its library path.
#![cfg(feature = "nccl")]

use localsgd_comm::nccl::{NcclConfig, NcclWorld, stand_in};
use localsgd_comm::{CommError, GroupExt, ReduceOp};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A directory with the stand-ins (see `localsgd_comm::nccl::stand_in`).
fn stand_ins(variant: &str, with_split: bool) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("stand-in-{variant}"));
    if let Err(e) = stand_in::build(&dir, with_split) {
        panic!("building the stand-ins: {e}");
    }
    dir
}

/// `program` with the stand-ins in `dir` first on its library path.
fn with_stand_ins(program: impl AsRef<std::ffi::OsStr>, dir: &Path, gpus: usize) -> Command {
    let mut cmd = Command::new(program);
    stand_in::configure(&mut cmd, dir, gpus);
    cmd
}

/// Run `nccl_smoke --ranks N` against the stand-ins.
fn smoke(dir: &Path, ranks: usize, gpus: usize) -> (Option<i32>, String) {
    let out = with_stand_ins(env!("CARGO_BIN_EXE_nccl_smoke"), dir, gpus)
        .args(["--ranks", &ranks.to_string()])
        .output()
        .expect("run nccl_smoke");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn assert_passed(code: Option<i32>, text: &str, ranks: usize) {
    assert_eq!(code, Some(0), "{text}");
    // The stand-ins, not a real driver or NCCL, were loaded.
    assert!(text.contains("NCCL 2.21.5 from"), "{text}");
    assert!(text.contains("CPU stand-in device"), "{text}");
    assert!(
        text.contains(&format!("SUMMARY: PASS ({ranks} rank(s)")),
        "{text}"
    );
    assert!(!text.contains("FAIL"), "{text}");
    for r in 0..ranks {
        assert!(
            text.contains(&format!("RANK {r} DONE:")) && text.contains(", 0 failed"),
            "{text}"
        );
    }
    for name in [
        "async: group collectives while pending",
        "async all_reduce 256k f32",
        "async traffic charged at start",
        "async close",
        "all_gather_bytes 0",
        "all_gather_bytes 1001",
        "all_gather_bytes 1048576",
        "all_gather_bytes wrong output length refused",
        "async all_gather_bytes 64k",
        "async all_gather_bytes charged at start",
        "mismatch detected (all_gather_bytes lengths)",
    ] {
        assert!(
            text.contains(&format!("PASS {name}")),
            "missing PASS {name}:\n{text}"
        );
    }
    let passes = text.lines().filter(|l| l.contains("] PASS ")).count();
    assert!(passes >= 40, "only {passes} checks passed:\n{text}");
}

#[test]
fn smoke_passes_on_stand_ins_with_comm_split() {
    let dir = stand_ins("split", true);
    for ranks in [2, 3] {
        let (code, text) = smoke(&dir, ranks, 4);
        assert_passed(code, &text, ranks);
    }
}

#[test]
fn smoke_passes_on_stand_ins_without_comm_split() {
    let dir = stand_ins("no-split", false);
    let (code, text) = smoke(&dir, 3, 4);
    assert_passed(code, &text, 3);
}

/// Run the test `name` again in a child process with the stand-ins on its library path (the
/// dynamic loader reads `LD_LIBRARY_PATH` only at start-up); the child sees `STAND_IN_CHILD`
/// and runs the scenario. The child must report that the scenario finished.
fn run_in_child(name: &str) {
    let dir = stand_ins(name, true);
    let exe = std::env::current_exe().expect("this test binary");
    // libtest names a test by its module path inside the test binary: `nccl_stand_in::name`.
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, m)| m);
    let out = with_stand_ins(exe, &dir, 2)
        .args(["--exact", &format!("{module}::{name}"), "--nocapture"])
        .arg("--test-threads=1")
        .env("STAND_IN_CHILD", "1")
        .output()
        .expect("run the child test process");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SCENARIO DONE"), "{text}");
}

/// Two ranks as threads: rank 1 runs `peer` on its group, rank 0 runs `main` on its group,
/// then rank 1 is told to finish. Both get a 2 s collective timeout.
fn two_ranks(
    peer: impl FnOnce(&localsgd_comm::Group) + Send + 'static,
    main: impl FnOnce(&localsgd_comm::Group),
) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let config = NcclConfig::default().with_timeout(Duration::from_secs(2));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (peer_addr, peer_config) = (addr.clone(), config.clone());
    let rank1 = std::thread::spawn(move || {
        let (_world, g) = NcclWorld::init_tcp(1, 2, &peer_addr, 1, peer_config).expect("rank 1");
        peer(&g);
        let _ = done_rx.recv();
    });
    let (_world, g) = NcclWorld::init_tcp(0, 2, &addr, 0, config).expect("rank 0");
    main(&g);
    let _ = done_tx.send(());
    rank1.join().expect("rank 1 finished");
}

/// A peer that never calls the collective: rank 0's all-reduce is enqueued, its stream stays busy, and after
/// the group timeout the wait gives up with `Timeout` naming rank 1, aborts the communicator
/// (which ends the enqueued work), and every later call is refused.
#[test]
fn a_missing_peer_times_out_aborts_and_refuses_later_calls() {
    if std::env::var_os("STAND_IN_CHILD").is_none() {
        return run_in_child("a_missing_peer_times_out_aborts_and_refuses_later_calls");
    }
    two_ranks(
        |_| {},
        |g| {
            let mut v = vec![1f32; 4];
            let started = Instant::now();
            let e = g.all_reduce_slice(&mut v, ReduceOp::Sum).unwrap_err();
            match &e {
                CommError::Timeout { missing, group, .. } => {
                    assert_eq!(missing, &vec![1], "{e}");
                    assert_eq!(group, &vec![0, 1], "{e}");
                }
                other => panic!("expected a timeout, got {other:?}"),
            }
            assert!(started.elapsed() >= Duration::from_secs(2), "{e}");
            let again = g.all_reduce_slice(&mut v, ReduceOp::Sum).unwrap_err();
            assert!(again.to_string().contains("aborted earlier"), "{again}");
            assert!(again.to_string().contains("timed out"), "{again}");
        },
    );
    println!("SCENARIO DONE");
}

/// Mismatched lengths without the signature check: the stand-in fails the enqueued collective
/// on both ranks (as a broken NCCL connection would: the stream stays busy, the error is
/// asynchronous); the wait sees `ncclCommGetAsyncError` and returns an error well before the
/// timeout, on both ranks, and the communicator is aborted.
#[test]
fn an_asynchronous_nccl_error_ends_the_wait_on_every_rank() {
    if std::env::var_os("STAND_IN_CHILD").is_none() {
        return run_in_child("an_asynchronous_nccl_error_ends_the_wait_on_every_rank");
    }
    fn check(g: &localsgd_comm::Group, len: usize) {
        let mut v = vec![1f32; len];
        let e = g.all_reduce_slice(&mut v, ReduceOp::Sum).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(
                e,
                CommError::Backend {
                    backend: "nccl",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(text.contains("asynchronous error"), "{text}");
        assert!(text.contains("peers passed different sizes"), "{text}");
        let again = g.barrier().unwrap_err();
        assert!(again.to_string().contains("aborted earlier"), "{again}");
    }
    two_ranks(|g| check(g, 4), |g| check(g, 5));
    println!("SCENARIO DONE");
}
