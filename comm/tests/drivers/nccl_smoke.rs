//! `nccl_smoke`: the GPU smoke test of the NCCL backend (run by `scripts/gpu-smoke`).
//!
//! `nccl_smoke [--ranks N]` checks the machine (CUDA driver, GPUs, NCCL), then starts N copies
//! of itself as ranks 0..N (rank r on GPU r mod #GPUs) that meet over TCP on 127.0.0.1. Each
//! rank runs every collective of the NCCL group against hand-computed expectations, then trains
//! a tiny burn model on the CPU with gradients averaged through NCCL, then with parameters
//! averaged every 2 steps. The parent prints every rank's lines and a summary.
//!
//! Launched with `LOCALSGD_RANK` (or `RANK`) set, it runs as that one rank (for launchers that
//! start the ranks themselves; `LOCALSGD_WORLD_SIZE`, `LOCALSGD_MASTER_ADDR`,
//! `LOCALSGD_MASTER_PORT` and optionally `LOCALSGD_LOCAL_RANK` as for
//! `NcclWorld::init_from_env`).
//!
//! `nccl_smoke --threads N` runs the same checks on the thread backend (no GPU needed): it
//! validates the smoke test's own expectations against the reference backend.
//!
//! Exit codes: 0 all checks passed; 1 a check failed; 77 skipped (no GPU, no CUDA driver, no
//! NCCL, or NCCL refused more ranks than GPUs), with a `SKIP: <reason>` line.

#[path = "check_report.rs"]
mod check_report;

use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use burn::tensor::TensorData;
use check_report::Checker;
use half::{bf16, f16};
use localsgd_comm::nccl::{NcclConfig, NcclWorld};
use localsgd_comm::params::{
    FlatBuffer, ParamSelection, flatten_grads, flatten_params, grads_from_flat, write_params,
};
use localsgd_comm::{AsyncGroup, CommError, Element, Group, GroupExt, ReduceOp, Traffic};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

const SKIP: u8 = 77;
/// A rank whose world could not be created.
const INIT_FAILED: u8 = 78;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ranks = args
        .iter()
        .position(|a| a == "--ranks")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse::<usize>());
    let ranks = match ranks {
        None => 1,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            println!("FAIL usage: nccl_smoke [--ranks N] with N >= 1");
            return ExitCode::FAILURE;
        }
    };
    if let Some(n) = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
    {
        return match n.parse::<usize>() {
            Ok(n) if n >= 1 => ExitCode::from(run_threads(n)),
            _ => {
                println!("FAIL usage: nccl_smoke --threads N with N >= 1");
                ExitCode::FAILURE
            }
        };
    }
    if std::env::var("LOCALSGD_RANK").is_ok() || std::env::var("RANK").is_ok() {
        return ExitCode::from(run_rank());
    }
    ExitCode::from(launch(ranks))
}

/// Parent: check the machine, start the ranks, summarise.
fn launch(ranks: usize) -> u8 {
    let probe = match NcclWorld::probe() {
        Ok(p) => p,
        Err(e) => {
            println!("SKIP: {e}");
            return SKIP;
        }
    };
    println!(
        "machine: {} GPU(s), NCCL {} from {}",
        probe.devices, probe.nccl_version, probe.nccl_path
    );
    if ranks > probe.devices {
        println!(
            "NOTE: {ranks} ranks on {} GPU(s): ranks share a GPU, which NCCL normally refuses \
             (\"Duplicate GPU detected\"); trying anyway",
            probe.devices
        );
    }
    let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => {
            println!("FAIL could not find a free TCP port on 127.0.0.1: {e}");
            return 1;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            println!("FAIL cannot find this executable to start the ranks: {e}");
            return 1;
        }
    };
    let started = Instant::now();
    let children: Vec<_> = (0..ranks)
        .map(|r| {
            Command::new(&exe)
                .env("LOCALSGD_RANK", r.to_string())
                .env("LOCALSGD_WORLD_SIZE", ranks.to_string())
                .env("LOCALSGD_MASTER_ADDR", "127.0.0.1")
                .env("LOCALSGD_MASTER_PORT", port.to_string())
                .env("LOCALSGD_LOCAL_RANK", (r % probe.devices).to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
        })
        .collect();
    let mut codes = Vec::new();
    let mut init_errors = Vec::new();
    for (r, child) in children.into_iter().enumerate() {
        let out = match child.and_then(|c| c.wait_with_output()) {
            Ok(o) => o,
            Err(e) => {
                println!("FAIL rank {r}: could not run: {e}");
                codes.push(1);
                continue;
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        for line in stdout.lines() {
            println!("[rank {r}] {line}");
            if let Some(m) = line.strip_prefix("INITFAIL: ") {
                init_errors.push(m.to_string());
            }
        }
        for line in String::from_utf8_lossy(&out.stderr).lines() {
            println!("[rank {r} stderr] {line}");
        }
        codes.push(out.status.code().unwrap_or(1));
    }
    let took = started.elapsed();
    let all_init_failed = codes.iter().all(|&c| c == INIT_FAILED as i32 || c == 0)
        && codes.contains(&(INIT_FAILED as i32));
    if codes.iter().all(|&c| c == 0) {
        println!(
            "SUMMARY: PASS ({ranks} rank(s) on {} GPU(s), {took:?})",
            probe.devices
        );
        0
    } else if all_init_failed && ranks > probe.devices {
        println!(
            "SKIP: NCCL could not create a world of {ranks} ranks on {} GPU(s) (ranks would \
             share a GPU): {}",
            probe.devices,
            init_errors.first().map_or("no message", String::as_str)
        );
        SKIP
    } else {
        println!("SUMMARY: FAIL ({ranks} rank(s), exit codes {codes:?})");
        1
    }
}

/// One rank of the smoke test.
fn run_rank() -> u8 {
    let config = NcclConfig::default()
        .with_timeout(Duration::from_secs(120))
        .with_rendezvous_timeout(Duration::from_secs(120))
        .with_signature_check(true);
    let (world, g) = match NcclWorld::init_from_env(config) {
        Ok(w) => w,
        Err(e) => {
            println!("INITFAIL: {e}");
            return INIT_FAILED;
        }
    };
    let (rank, size) = (g.rank(), g.size());
    println!(
        "rank {rank} of {size}: GPU {} ({}), NCCL {}, host {:?}",
        world.device(),
        world.device_name(),
        world.nccl_version(),
        world.hosts().and_then(|h| h.get(rank))
    );
    if run_checks(&g, "nccl") == 0 { 0 } else { 1 }
}

/// Every check on one rank's world group; returns the number of failed checks.
fn run_checks(g: &Group, backend: &str) -> usize {
    let (rank, size) = (g.rank(), g.size());
    let mut c = Checker::new(rank);
    c.check(
        "world",
        g.backend() == backend && g.world_ranks() == (0..size).collect::<Vec<_>>(),
        || format!("backend {} world ranks {:?}", g.backend(), g.world_ranks()),
    );
    reductions::<f32>(&mut c, g, "f32");
    reductions::<f64>(&mut c, g, "f64");
    reductions::<f16>(&mut c, g, "f16");
    reductions::<bf16>(&mut c, g, "bf16");
    large(&mut c, g);
    broadcasts(&mut c, g);
    gather_and_barrier(&mut c, g);
    subgroups(&mut c, g);
    nonblocking(&mut c, g);
    mismatch(&mut c, g);
    training(&mut c, g);
    println!(
        "RANK {rank} DONE: {} passed, {} failed",
        c.passes, c.failures
    );
    c.failures
}

/// `--threads N`: the same checks on the thread backend (the reference), to validate the
/// smoke test's own expectations on a machine without a GPU.
fn run_threads(ranks: usize) -> u8 {
    let world = match localsgd_comm::ThreadWorld::new(ranks) {
        Ok(w) => w.with_timeout(Duration::from_secs(120)),
        Err(e) => {
            println!("FAIL {e}");
            return 1;
        }
    };
    match world.run(|g| run_checks(&g, "threads")) {
        Ok(failures) if failures.iter().all(|&f| f == 0) => {
            println!("SUMMARY: PASS (thread backend, {ranks} rank(s))");
            0
        }
        Ok(failures) => {
            println!("SUMMARY: FAIL (thread backend, failures per rank {failures:?})");
            1
        }
        Err(e) => {
            println!("SUMMARY: FAIL ({e})");
            1
        }
    }
}

trait Num: Element {
    fn of(x: f64) -> Self;
}
impl Num for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
}
impl Num for f64 {
    fn of(x: f64) -> Self {
        x
    }
}
impl Num for f16 {
    fn of(x: f64) -> Self {
        f16::from_f64(x)
    }
}
impl Num for bf16 {
    fn of(x: f64) -> Self {
        bf16::from_f64(x)
    }
}

/// The expected value of element i over n ranks.
type Expect = fn(f64, f64) -> f64;

/// Rank r holds x\[i\] = (r + 1) + i/2, i in 0..8 (exact in every type for up to 8 ranks).
/// Over n ranks: sum = n(n+1)/2 + n i/2, mean = (n+1)/2 + i/2, max = n + i/2, min = 1 + i/2.
fn reductions<T: Num>(c: &mut Checker, g: &Group, ty: &str) {
    let (r, n) = (g.rank() as f64, g.size() as f64);
    let local = |i: usize| T::of(r + 1.0 + i as f64 / 2.0);
    let cases: [(ReduceOp, &str, Expect); 4] = [
        (ReduceOp::Sum, "sum", |n, i| {
            n * (n + 1.0) / 2.0 + n * i / 2.0
        }),
        (ReduceOp::Mean, "mean", |n, i| (n + 1.0) / 2.0 + i / 2.0),
        (ReduceOp::Max, "max", |n, i| n + i / 2.0),
        (ReduceOp::Min, "min", |_, i| 1.0 + i / 2.0),
    ];
    for (op, name, expect) in cases {
        let mut v: Vec<T> = (0..8).map(local).collect();
        let label = format!("all_reduce {ty} {name}");
        if c.ok(&label, g.all_reduce_slice(&mut v, op)).is_some() {
            let want: Vec<f64> = (0..8).map(|i| expect(n, i as f64)).collect();
            let got: Vec<f64> = v.iter().map(|x| x.to_f64()).collect();
            c.check(&label, got == want, || {
                format!("got {got:?}, expected {want:?}")
            });
        }
    }
}

/// 4M f32 (16 MB, grows the copy buffer): every element sums to n(n+1)/2.
fn large(c: &mut Checker, g: &Group) {
    let n = g.size();
    let mut v = vec![(g.rank() + 1) as f32; 1 << 22];
    let start = Instant::now();
    if c.ok(
        "all_reduce 4M f32",
        g.all_reduce_slice(&mut v, ReduceOp::Sum),
    )
    .is_some()
    {
        let want = (n * (n + 1) / 2) as f32;
        let bad = v.iter().filter(|&&x| x != want).count();
        c.check("all_reduce 4M f32", bad == 0, || {
            format!("{bad} elements differ from {want}")
        });
        if g.rank() == 0 {
            println!(
                "INFO all_reduce of 16 MB (host -> GPU -> host) took {:?}",
                start.elapsed()
            );
        }
    }
    let mut empty: Vec<f32> = Vec::new();
    c.ok(
        "all_reduce empty",
        g.all_reduce_slice(&mut empty, ReduceOp::Sum),
    );
}

fn broadcasts(c: &mut Checker, g: &Group) {
    let (r, n) = (g.rank(), g.size());
    for root in 0..n {
        let mut v: Vec<f64> = (0..5).map(|i| (r * 10 + i) as f64).collect();
        let mut h: Vec<bf16> = (0..3).map(|i| bf16::from_f64((r * 4 + i) as f64)).collect();
        let label = format!("broadcast from root {root}");
        if c.ok(&label, g.broadcast_slice(&mut v, root)).is_some()
            && c.ok(&label, g.broadcast_slice(&mut h, root)).is_some()
        {
            let want: Vec<f64> = (0..5).map(|i| (root * 10 + i) as f64).collect();
            let want_h: Vec<f64> = (0..3).map(|i| (root * 4 + i) as f64).collect();
            let got_h: Vec<f64> = h.iter().map(|x| x.to_f64()).collect();
            c.check(&label, v == want && got_h == want_h, || {
                format!("got {v:?} / {got_h:?}")
            });
        }
    }
    let mut v = vec![0f32; 2];
    let e = g.broadcast_slice(&mut v, n);
    c.check(
        "broadcast invalid root",
        matches!(e, Err(CommError::InvalidRoot { root, size }) if root == n && size == n),
        || format!("{e:?}"),
    );
}

fn gather_and_barrier(c: &mut Checker, g: &Group) {
    let (r, n) = (g.rank() as u64, g.size() as u64);
    if let Some(all) = c.ok("all_gather_u64", g.all_gather_u64(&[r, 100 + r * r])) {
        let want: Vec<u64> = (0..n).flat_map(|q| [q, 100 + q * q]).collect();
        c.check("all_gather_u64", all == want, || format!("got {all:?}"));
    }
    // Byte all-gather: distinct bytes per rank, odd lengths (the receive region's alignment).
    for len in [0usize, 1, 1001, 1 << 20] {
        let name = format!("all_gather_bytes {len}");
        let local: Vec<u8> = (0..len).map(|i| gather_byte(r as usize, i)).collect();
        let mut out = vec![0xAAu8; n as usize * len];
        if c.ok(&name, g.all_gather_bytes(&local, &mut out)).is_some() {
            let bad = out
                .iter()
                .zip(gathered(n as usize, len))
                .position(|(&a, b)| a != b);
            c.check(&name, bad.is_none(), || {
                format!("first wrong byte at {bad:?}")
            });
        }
    }
    let mut short = vec![0u8; 1];
    let e = g.all_gather_bytes(&[1, 2], &mut short);
    c.check(
        "all_gather_bytes wrong output length refused",
        matches!(e, Err(CommError::OutputLength { expected, actual: 1, .. }) if expected == 2 * n as usize),
        || format!("{e:?}"),
    );
    let flag = c.ok("all_true", g.all_true(true));
    c.check("all_true", flag == Some(true), || format!("{flag:?}"));
    let t = Instant::now();
    let b = g.barrier();
    c.check("barrier", b.is_ok(), || format!("{b:?}"));
    if r == 0 {
        println!("INFO barrier took {:?}", t.elapsed());
    }
}

/// Byte `i` of rank `r`'s message in the byte all-gather checks (distinct per rank).
fn gather_byte(r: usize, i: usize) -> u8 {
    (r * 97 + i * 31 + i / 256) as u8
}

/// What every rank's `all_gather_bytes` of `len` bytes per rank must give.
fn gathered(size: usize, len: usize) -> Vec<u8> {
    (0..size)
        .flat_map(|r| (0..len).map(move |i| gather_byte(r, i)))
        .collect()
}

/// `AsyncGroup`: a dedicated communicator (its own stream and copy buffer) driven by a helper
/// thread, completing an all-reduce while the group runs blocking collectives.
fn nonblocking(c: &mut Checker, g: &Group) {
    let Some(mut side) = c.ok("async group", AsyncGroup::new(g.clone())) else {
        return;
    };
    let (r, n) = (g.rank(), g.size());
    let before = g.traffic();
    let pending = c.ok(
        "async start",
        side.start_all_reduce(vec![r as f32 + 1.0; 1 << 18], ReduceOp::Sum),
    );
    let charged = g.traffic() - before;
    let flags: Vec<_> = (0..3).map(|i| g.all_true(i != 1)).collect();
    c.check(
        "async: group collectives while pending",
        flags == vec![Ok(true), Ok(false), Ok(true)],
        || format!("{flags:?}"),
    );
    let want = (n * (n + 1) / 2) as f32;
    if let Some(p) = pending {
        let v = p.wait();
        c.check(
            "async all_reduce 256k f32",
            v.as_ref().is_ok_and(|v| v.iter().all(|&x| x == want)),
            || format!("{:?}", v.map(|v| v[..2].to_vec())),
        );
    }
    c.check(
        "async traffic charged at start",
        (charged.collectives, charged.bytes) == (1, 1 << 20),
        || format!("{charged:?}"),
    );
    let before = g.traffic();
    let local: Vec<u8> = (0..1 << 16).map(|i| gather_byte(r, i)).collect();
    let pending = c.ok(
        "async all_gather_bytes start",
        side.start_all_gather_bytes(local),
    );
    let charged = g.traffic() - before;
    if let Some(p) = pending {
        let out = p.wait();
        c.check(
            "async all_gather_bytes 64k",
            out.as_ref().is_ok_and(|o| *o == gathered(n, 1 << 16)),
            || format!("{:?}", out.map(|o| o.len())),
        );
    }
    c.check(
        "async all_gather_bytes charged at start",
        (charged.collectives, charged.bytes, charged.data_bytes) == (1, 1 << 16, 1 << 16),
        || format!("{charged:?}"),
    );
    let closed = side.close();
    c.check("async close", closed.is_ok(), || format!("{closed:?}"));
}

fn sum_in(g: &Group) -> Result<f32, CommError> {
    let mut v = vec![(g.world_ranks()[g.rank()] + 1) as f32; 3];
    g.all_reduce_slice(&mut v, ReduceOp::Sum)?;
    Ok(v[0])
}

fn subgroups(c: &mut Checker, g: &Group) {
    let (r, n) = (g.rank(), g.size());
    // Split by parity.
    if let Some(s) = c.ok("split by color", g.split((r % 2) as u64)) {
        let members: Vec<usize> = (0..n).filter(|q| q % 2 == r % 2).collect();
        let want_sum: usize = members.iter().map(|q| q + 1).sum();
        let got = sum_in(&s);
        c.check(
            "split by color",
            s.world_ranks() == members && s.rank() == r / 2 && got == Ok(want_sum as f32),
            || {
                format!(
                    "members {:?} rank {} sum {got:?}",
                    s.world_ranks(),
                    s.rank()
                )
            },
        );
        // Traffic: a subgroup's collective is charged to it and to its parent.
        let (t0, s0) = (g.traffic(), s.traffic());
        let mut v = vec![1f32; 4];
        if c.ok("traffic", s.all_reduce_slice(&mut v, ReduceOp::Sum))
            .is_some()
        {
            let (dg, ds) = (g.traffic() - t0, s.traffic() - s0);
            // A ring all-reduce on the subgroup's ranks moves 2 (m - 1) / m of the 16 bytes.
            let m = s.size() as u64;
            let want = Traffic {
                collectives: 1,
                bytes: 16,
                data_bytes: 16,
                wire_bytes: 2 * (m - 1) * 16 / m,
            };
            c.check(
                "traffic counters (subgroup charged to parent)",
                dg == want && ds == want,
                || format!("world {dg:?}, subgroup {ds:?}"),
            );
        }
    }
    for size in [1, 2, n] {
        if n % size != 0 {
            continue;
        }
        let label = format!("new_subgroups({size})");
        if let Some(s) = c.ok(&label, g.new_subgroups(size)) {
            let first = r / size * size;
            let members: Vec<usize> = (first..first + size).collect();
            let want_sum: usize = members.iter().map(|q| q + 1).sum();
            let got = sum_in(&s);
            c.check(
                &label,
                s.world_ranks() == members && got == Ok(want_sum as f32),
                || format!("members {:?} sum {got:?}", s.world_ranks()),
            );
        }
    }
    let e = g.new_subgroups(0);
    c.check(
        "new_subgroups(0) refused",
        matches!(e, Err(CommError::InvalidSubgroupSize(_))),
        || format!("{e:?}"),
    );
    // Every rank of this smoke runs on one machine.
    if let Some(s) = c.ok("intra_node", g.intra_node()) {
        let got = sum_in(&s);
        c.check(
            "intra_node (one host: every rank)",
            s.world_ranks() == (0..n).collect::<Vec<_>>() && got == Ok((n * (n + 1) / 2) as f32),
            || format!("members {:?} sum {got:?}", s.world_ranks()),
        );
    }
}

fn mismatch(c: &mut Checker, g: &Group) {
    if g.size() < 2 {
        if g.rank() == 0 {
            println!("SKIP mismatch detection: needs 2 ranks");
        }
        return;
    }
    let mut v = vec![1f32; if g.rank() == 0 { 5 } else { 4 }];
    let e = g.all_reduce_slice(&mut v, ReduceOp::Sum);
    c.check(
        "mismatch detected (lengths)",
        matches!(&e, Err(CommError::Mismatch { calls, .. }) if calls.len() == g.size()),
        || format!("{e:?}"),
    );
    let len = if g.rank() == 0 { 7 } else { 6 };
    let mut out = vec![0u8; len * g.size()];
    let e = g.all_gather_bytes(&vec![1u8; len], &mut out);
    c.check(
        "mismatch detected (all_gather_bytes lengths)",
        matches!(&e, Err(CommError::Mismatch { calls, .. })
            if calls.len() == g.size() && calls[0].1 == "all_gather_bytes(u8 x 7)"),
        || format!("{e:?}"),
    );
    let got = sum_in(g);
    let n = g.size();
    c.check(
        "collectives work after a mismatch",
        got == Ok((n * (n + 1) / 2) as f32),
        || format!("{got:?}"),
    );
}

/// y = x . [1, -2, 0.5, 3] + 0.25 on this rank's 16 samples.
fn batch(rank: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let w = [1.0f32, -2.0, 0.5, 3.0];
    let mut xs = Vec::with_capacity(64);
    let mut ys = Vec::with_capacity(16);
    for j in 0..16 {
        let row: Vec<f32> = (0..4)
            .map(|k| ((j * 7 + k * 3 + rank * 5) % 11) as f32 / 11.0 - 0.5)
            .collect();
        ys.push(row.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() + 0.25);
        xs.extend(row);
    }
    (
        Tensor::<2>::from_data(TensorData::new(xs, [16, 4]), device),
        Tensor::<2>::from_data(TensorData::new(ys, [16, 1]), device),
    )
}

fn loss_of(model: &Linear, x: &Tensor<2>, y: &Tensor<2>) -> Tensor<1> {
    let d = model.forward(x.clone()) - y.clone();
    (d.clone() * d).mean()
}

fn scalar(t: Tensor<1>) -> f32 {
    t.into_data()
        .try_into_vec::<f32>()
        .ok()
        .and_then(|v| v.first().copied())
        .unwrap_or(f32::NAN)
}

/// Whether every rank holds bit-identical parameters (max == min over ranks, element-wise).
fn identical(g: &Group, model: &Linear) -> Result<bool, CommError> {
    let flat = flatten_params(model, &ParamSelection::All)?;
    let FlatBuffer::F32(v) = flat.buffer else {
        return Ok(false);
    };
    let (mut hi, mut lo) = (v.clone(), v);
    g.all_reduce_slice(&mut hi, ReduceOp::Max)?;
    g.all_reduce_slice(&mut lo, ReduceOp::Min)?;
    Ok(hi == lo)
}

fn training(c: &mut Checker, g: &Group) {
    let device = Device::flex().autodiff();
    let mut model: Linear = LinearConfig::new(4, 1).init(&device);
    // Same start everywhere: rank 0's initial parameters.
    let start = flatten_params(&model, &ParamSelection::All).and_then(|mut flat| {
        g.broadcast(flat.buffer.as_buffer_mut(), 0)?;
        Ok(flat)
    });
    let Some(start) = c.ok("training: broadcast initial parameters", start) else {
        return;
    };
    model = match write_params(model, &start) {
        Ok(m) => m,
        Err(e) => {
            c.check("training: write initial parameters", false, || {
                e.to_string()
            });
            return;
        }
    };
    let (x, y) = batch(g.rank(), &device);
    let mut optim = SgdConfig::new().init();
    let first = scalar(loss_of(&model, &x, &y));
    // Phase 1: 40 steps with gradients averaged over the group every step.
    let mut step_ok = true;
    for _ in 0..40 {
        let loss = loss_of(&model, &x, &y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let averaged = flatten_grads(&model, &grads, &ParamSelection::All).and_then(|mut flat| {
            g.all_reduce(flat.buffer.as_buffer_mut(), ReduceOp::Mean)?;
            grads_from_flat(&model, &flat)
        });
        match averaged {
            Ok(avg) => model = optim.step(0.2, model, avg),
            Err(e) => {
                c.check("training: gradient averaging", false, || e.to_string());
                step_ok = false;
                break;
            }
        }
    }
    if !step_ok {
        return;
    }
    let after = scalar(loss_of(&model, &x, &y));
    c.check(
        "training: loss falls with averaged gradients",
        after < first * 0.5,
        || format!("loss {first} -> {after}"),
    );
    let same = identical(g, &model);
    c.check(
        "training: parameters identical on every rank (gradient averaging)",
        same == Ok(true),
        || format!("{same:?}"),
    );
    // Phase 2: local steps, parameters averaged every 2 steps.
    for step in 1..=10 {
        let loss = loss_of(&model, &x, &y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(0.2, model, grads);
        if step % 2 == 0 {
            let averaged = flatten_params(&model, &ParamSelection::All).and_then(|mut flat| {
                g.all_reduce(flat.buffer.as_buffer_mut(), ReduceOp::Mean)?;
                Ok(flat)
            });
            model = match averaged.and_then(|flat| write_params(model.clone(), &flat)) {
                Ok(m) => m,
                Err(e) => {
                    c.check("training: parameter averaging", false, || e.to_string());
                    return;
                }
            };
            let same = identical(g, &model);
            c.check(
                &format!("training: parameters identical after averaging at step {step}"),
                same == Ok(true),
                || format!("{same:?}"),
            );
        }
    }
    let last = scalar(loss_of(&model, &x, &y));
    c.check(
        "training: loss stays low with parameter averaging",
        last < first * 0.5,
        || format!("loss {first} -> {last}"),
    );
    if g.rank() == 0 {
        println!("INFO training loss {first:.4} -> {after:.4} -> {last:.4}");
    }
}
