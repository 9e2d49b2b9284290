//! `localsgd train --backend mpi` under `mpirun`: the same parameters as the thread backend,
//! checkpoints and resume, one clear error for a bad world size, a killed rank ends the job, and
//! training across two hosts (network namespaces). MPI initialises once per process, so every
//! test launches the binary.
#![cfg(feature = "mpi")]

use crate::one_process_per_rank;

use localsgd_test_support::{network_namespaces_usable, one_mpi_job, two_hosts};
use one_process_per_rank::{BIN, args, final_params, run_threads, show};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn mpirun_cmd(ranks: usize) -> Command {
    localsgd_test_support::mpirun(ranks, BIN)
}

fn run_mpi(ranks: usize, extra: &[String]) -> Output {
    let _one = one_mpi_job();
    let out = mpirun_cmd(ranks)
        .args(extra)
        .args(["--backend", "mpi"])
        .output()
        .expect("run mpirun (is OpenMPI installed?)");
    println!("{}", show(&out));
    out
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// With 2 ranks every reduction is one addition of two numbers, which does not depend on the
/// order: the MPI run must be bit-identical to the thread run.
#[test]
fn two_mpi_ranks_equal_two_threads_bit_for_bit() {
    let threads = tempfile::tempdir().unwrap();
    let mpi = tempfile::tempdir().unwrap();
    run_threads(2, &args(threads.path(), 60));
    let exported = mpi.path().join("world.safetensors");
    let mut mpi_args = args(mpi.path(), 60);
    mpi_args.extend(["--export".to_string(), exported.display().to_string()]);
    let out = run_mpi(2, &mpi_args);
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Rank 0 alone prints the report.
    assert_eq!(stdout.matches("test accuracy:").count(), 1, "{stdout}");
    assert!(
        stdout.contains("trained 60 iterations on 2 workers (PostLocalSgd, Mpi backend)"),
        "{stdout}"
    );
    for file in [
        "config.toml",
        "summary.json",
        "metrics.csv",
        "metrics-rank1.csv",
        "loss.svg",
    ] {
        assert!(mpi.path().join(file).is_file(), "missing {file}");
    }
    // Rank 1 writes its own losses, the thread run's to the bit.
    let losses = |d: &Path| -> Vec<String> {
        std::fs::read_to_string(d.join("metrics-rank1.csv"))
            .unwrap()
            .lines()
            .map(|l| l.split(',').nth(2).unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(losses(threads.path()), losses(mpi.path()));
    // `--export` under MPI (rank 0 writes the world average) equals `localsgd export` of the
    // thread run: one addition of two numbers has one result.
    let offline = threads.path().join("world.safetensors");
    let out = Command::new(BIN)
        .arg("export")
        .arg(threads.path())
        .arg(&offline)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        std::fs::read(&offline).unwrap() == std::fs::read(&exported).unwrap(),
        "the exported models differ"
    );
    let t = final_params(threads.path(), 2);
    let m = final_params(mpi.path(), 2);
    for r in 0..2 {
        let tb: Vec<u32> = t[r].iter().map(|x| x.to_bits()).collect();
        let mb: Vec<u32> = m[r].iter().map(|x| x.to_bits()).collect();
        assert!(
            tb == mb,
            "rank {r}: max |diff| {}",
            max_abs_diff(&t[r], &m[r])
        );
    }
    // Communication volume is the same too (every rank's payload, summed).
    let summary = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("summary.json")).unwrap()).unwrap()
    };
    assert_eq!(
        summary(threads.path())["bytes"],
        summary(mpi.path())["bytes"]
    );
    // Every rank's own model's test accuracy and loss, gathered to rank 0 under MPI, equal the
    // thread run's (the same parameters).
    let ranks = summary(mpi.path())["ranks"].clone();
    assert_eq!(ranks.as_array().map(Vec::len), Some(2), "{ranks}");
    assert_eq!(summary(threads.path())["ranks"], ranks);
}

/// With 4 ranks MPI may add the four contributions in another order than the thread backend
/// ((a+b)+(c+d) instead of ((a+b)+c)+d), so results differ in the last bits, and training
/// carries the difference on. Tolerance: 1e-5 absolute on parameters of magnitude ~0.1-1 after
/// 60 steps (observed on OpenMPI 4.1 with shared memory: 3.6e-7).
#[test]
fn four_mpi_ranks_match_four_threads_within_tolerance() {
    let threads = tempfile::tempdir().unwrap();
    let mpi = tempfile::tempdir().unwrap();
    run_threads(4, &args(threads.path(), 60));
    let out = run_mpi(4, &args(mpi.path(), 60));
    assert!(out.status.success(), "{}", show(&out));
    let t = final_params(threads.path(), 4);
    let m = final_params(mpi.path(), 4);
    for r in 0..4 {
        let d = max_abs_diff(&t[r], &m[r]);
        println!("rank {r}: max |threads - mpi| = {d:e}");
        assert!(d <= 1e-5, "rank {r}: max |diff| {d}");
    }
}

#[test]
fn mpi_resume_is_bit_identical_to_an_uninterrupted_run() {
    let straight = tempfile::tempdir().unwrap();
    let resumed = tempfile::tempdir().unwrap();
    let out = run_mpi(2, &args(straight.path(), 50));
    assert!(out.status.success(), "{}", show(&out));
    let out = run_mpi(2, &args(resumed.path(), 30));
    assert!(out.status.success(), "{}", show(&out));
    let mut again = args(resumed.path(), 50);
    again.push("--resume".into());
    let out = run_mpi(2, &again);
    assert!(out.status.success(), "{}", show(&out));
    let a = final_params(straight.path(), 2);
    let b = final_params(resumed.path(), 2);
    for r in 0..2 {
        let ab: Vec<u32> = a[r].iter().map(|x| x.to_bits()).collect();
        let bb: Vec<u32> = b[r].iter().map(|x| x.to_bits()).collect();
        assert!(
            ab == bb,
            "rank {r}: max |diff| {}",
            max_abs_diff(&a[r], &b[r])
        );
    }
    // Resuming with another world size is refused with one clear message (every rank reaches
    // it, also ranks 2 and 3, which have no file in the checkpoint; rank 0 prints it), and a
    // length the checkpoint already holds is refused before that.
    let mut longer = args(resumed.path(), 60);
    longer.push("--resume".into());
    let out = run_mpi(4, &longer);
    assert!(!out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refusals: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.starts_with("error: cannot resume with `workers` = 4: the run in")
                && l.contains("was started with `workers` = 2")
                && l.contains("give `resume-ranks`")
        })
        .collect();
    assert_eq!(refusals.len(), 1, "{stderr}");
    assert!(!stderr.contains("No such file"), "{stderr}");
    let out = run_mpi(2, &again);
    assert!(!out.status.success(), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`steps` = 50 is already reached"),
        "{}",
        show(&out)
    );
}

#[test]
fn explicit_workers_must_equal_the_mpi_world_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args(dir.path(), 5);
    a.extend(["--workers".to_string(), "3".to_string()]);
    let out = run_mpi(2, &a);
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let msg = "invalid setting `workers` = 3: under MPI the number of workers is the world size, 2 here (`mpirun -np 2`)";
    assert_eq!(stderr.matches(msg).count(), 1, "{stderr}");
    // Nothing was written.
    assert!(!dir.path().join("config.toml").exists());
}

#[test]
fn a_killed_rank_makes_the_job_exit_non_zero() {
    let _one = one_mpi_job();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().display().to_string();
    let mut a = args(dir.path(), 1_000_000);
    a.extend(["--timeout-secs".to_string(), "20".to_string()]);
    let mut child = mpirun_cmd(2)
        .args(&a)
        .args(["--backend", "mpi"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mpirun");
    // Wait until training has started (rank 0 wrote the configuration), then kill a rank.
    let start = Instant::now();
    while !dir.path().join("config.toml").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let pids = Command::new("pgrep")
        .args(["-f", &format!("localsgd train.*{marker}")])
        .output()
        .expect("pgrep");
    let victim = String::from_utf8_lossy(&pids.stdout)
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .find(|&p| p != child.id())
        .expect("a rank process");
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill");
    let out = loop {
        if let Some(_status) = child.try_wait().expect("wait") {
            break child.wait_with_output().expect("output");
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "the job did not end within 60 s of killing rank pid {victim}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = killed.elapsed();
    println!("{}\nended {took:?} after the kill", show(&out));
    assert!(!out.status.success());
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// The fault soak under MPI (the thread backend's is `fault_soak.rs`): 10 jobs of 2 ranks, each
/// kind of `LOCALSGD_FAULT` twice on a random rank and iteration. Each job ends within the
/// collective timeout plus a few seconds (no hang), naming the faulty rank: its panic, after
/// "error on rank R of N"; for a stall, the waiting peer's watchdog (an MPI collective cannot tell
/// which peer is missing: the message names the waiting rank and the collective); the rank
/// `mpirun` saw die; for a mismatch, the calls of the ranks whose watchdogs fired first. `short` finishes. The latest checkpoint
/// stays intact.
#[test]
fn random_faults_end_each_mpi_job_cleanly_naming_the_rank() {
    let _one = one_mpi_job();
    let seed = one_process_per_rank::seed("mpi fault soak");
    let mut rng = one_process_per_rank::Lcg::new(seed);
    const TIMEOUT: u64 = 3;
    let deadline = Duration::from_secs(2 * TIMEOUT + 3 + 15);
    let mut ended = 0;
    for (k, kind) in ["panic", "stall", "abort", "mismatch", "short"]
        .iter()
        .cycle()
        .take(10)
        .enumerate()
    {
        let rank = rng.below(2) as usize;
        let other = 1 - rank;
        let fault = format!("{kind}@{rank}:{}", 1 + rng.below(20));
        let algorithm = ["ddp", "post-local-sgd"][k % 2];
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("mpirun");
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("LOCALSGD_FAULT", &fault)
            .args(["--oversubscribe", "--mca", "btl", "self,vader,tcp"])
            .args(["--mca", "btl_vader_single_copy_mechanism", "none"])
            .args([
                "-x",
                "LOCALSGD_FAULT",
                "-np",
                "2",
                BIN,
                "train",
                "--backend",
                "mpi",
            ])
            .args(["--algorithm", algorithm])
            // DDP takes no warmup and no period (the binary refuses them).
            .args(if algorithm == "ddp" {
                &[][..]
            } else {
                &["--warmup", "3", "--period", "2"][..]
            })
            .args([
                "--steps",
                "25",
                "--checkpoint-every",
                "4",
                "--progress",
                "false",
            ])
            .args(["--timeout-secs", &TIMEOUT.to_string(), "--run-dir"])
            .arg(dir.path());
        let what = format!("{fault} ({algorithm})");
        let (status, stderr, took) = one_process_per_rank::run_bounded(&mut cmd, deadline, &what);
        let what = format!("{what}, {took:?}: {status}\n{stderr}");
        let has = |needle: &str| stderr.contains(needle);
        match *kind {
            "panic" => assert!(
                !status.success()
                    && has(&format!("error on rank {rank} of 2"))
                    && has(&format!("injected fault: rank {rank} panics")),
                "{what}"
            ),
            "stall" => assert!(
                !status.success()
                    && has(&format!("world rank {other} on host"))
                    && has(&format!(
                        "did not complete within the timeout of {TIMEOUT}s"
                    )),
                "{what}"
            ),
            "abort" => assert!(
                !status.success()
                    && has(&format!("injected fault: rank {rank} aborts"))
                    && has(&format!("process rank {rank} with PID")),
                "{what}"
            ),
            // The first watchdog to fire ends the job; the other rank's message may not appear.
            "mismatch" => assert!(
                !status.success()
                    && has("did not complete within the timeout")
                    && (has("collective barrier()") || has("collective all_gather(u64 x 1)")),
                "{what}"
            ),
            _ => assert!(status.success(), "{what}"),
        }
        one_process_per_rank::assert_checkpoint_intact(dir.path(), 2);
        ended += 1;
    }
    println!("mpi fault soak: {ended} jobs, each ended cleanly, none hung");
}

/// Two "machines" (network namespaces h1 and h2, 2 ranks each, TCP between them): the
/// intra-node groups follow the hosts and post-local SGD with a per-host gradient all-reduce
/// trains to a useful model. Needs root and `ip netns`; elsewhere it says SKIPPED.
#[test]
fn trains_across_two_hosts_in_network_namespaces() {
    let usable = network_namespaces_usable();
    if !usable {
        println!(
            "SKIPPED trains_across_two_hosts_in_network_namespaces: needs root and `ip netns`"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ok, text) = two_hosts(BIN, || {
        // A second attempt starts from an empty run directory, not the first one's checkpoints.
        let _ = std::fs::remove_dir_all(dir.path());
        std::fs::create_dir_all(dir.path()).unwrap();
        let mut a = args(dir.path(), 300);
        // `on`: the warmup's pipelined gradient sync runs across the hosts even where `auto`
        // would block (4 ranks on fewer than 4 cores).
        a.extend(
            [
                "--backend",
                "mpi",
                "--post-local-allreduce",
                "true",
                "--pipeline-buckets",
                "on",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        a
    });
    println!("{text}");
    assert!(ok, "{text}");
    assert!(
        text.contains("MPI: 4 ranks on 2 host(s); intra-node groups (world ranks): [0, 1] [2, 3]"),
        "{text}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["iterations"], 300);
    assert_eq!(summary["workers"], 4);
    let acc = summary["test_accuracy"].as_f64().unwrap();
    // 300 iterations of batch 32 on 4 ranks is ~27 epochs of digits: a working run is far above
    // chance (10%); the thread backend reaches ~0.9 on the same settings.
    assert!(acc > 0.8, "test accuracy {acc}");
}

/// `bench-step --backend mpi`: every rank runs the bare loop between one-float collectives;
/// rank 0 alone reports, over 2 ranks.
#[test]
fn bench_step_runs_on_every_rank_between_collectives() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("step.json");
    let json_arg = json.to_str().unwrap();
    let a = [
        "bench-step",
        "--iters",
        "20",
        "--warmup-iters",
        "2",
        "--json",
        json_arg,
    ];
    let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
    let out = run_mpi(2, &a);
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout
            .matches("each step's slowest of 2 ranks, a one-float all-reduce between steps")
            .count(),
        1,
        "{stdout}"
    );
    let step: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(step["ranks"], 2);
    assert_eq!(step["params"], 4810);
    assert_eq!(step["iters"], 20);
    let cycle = step["cycle_mean_ms"].as_f64().unwrap();
    assert!(cycle.is_finite() && cycle > 0.0, "cycle_mean_ms {cycle}");
}

/// Started without `mpirun`, MPI would make a world of one process that trains alone: refused,
/// saying how to start it.
#[test]
fn backend_mpi_outside_mpirun_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut cmd = Command::new(BIN);
    for var in ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"] {
        cmd.env_remove(var);
    }
    let out = cmd
        .args(["train", "--backend", "mpi", "--steps", "3", "--run-dir"])
        .arg(&run)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not started by an MPI launcher")
            && stderr.contains("mpirun -np N localsgd train --backend mpi"),
        "{stderr}"
    );
    assert!(!run.exists());
}
