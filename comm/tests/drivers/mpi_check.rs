//! `mpi_check`: the driver the MPI tests launch under `mpirun` (MPI initialises once per process,
//! so MPI tests run as separate processes).
//!
//! Modes (first argument):
//! - `check [--no-signature-check] [--no-preconnect] [--no-async] [--expect-hosts N]
//!   [--expect-tcp-links N]`: every collective (the byte all-gather and all-to-all too),
//!   subgroups (blocks, colors, intra-node), traffic counters, the TCP links asked of Open MPI
//!   (default 2),
//!   (unless `--no-async`) non-blocking collectives on a dedicated communicator while the world
//!   runs blocking ones, (with signature checks, the default) mismatch detection, and (with
//!   start-up's connection set-up, the default) that no TCP connection opened after start-up. Prints `PASS ...` lines, `FAIL ...` lines for failures, and finally `ALL PASS`
//!   (rank 0) or exits with code 1.
//! - `all-to-all [--no-signature-check]`: the byte all-to-all alone (also part of `check`):
//!   every received block for several block lengths (empty, one, odd, 1 MiB) on the world, a
//!   subgroup and a dedicated communicator (polled, strided pieces), the traffic it charges,
//!   wrong buffer lengths refused, and (with signature checks) differing blocks reported as a
//!   mismatch.
//! - `kill-rank R`: rank R kills itself with SIGKILL after one all-reduce; the others keep
//!   all-reducing (the job must end, non-zero).
//! - `hang-rank R --timeout SECS`: rank R never joins the next all-reduce (it sleeps); the
//!   others' watchdog must abort the job after SECS seconds.
//! - `abort-rank R`: rank R calls `MpiWorld::abort(3)` while the others wait in an all-reduce
//!   (the job must end at once with exit code 3).
//!
//! The MPI all-reduce throughput benchmark's driver is `localsgd-planner`'s `mpi_bench`.

#[path = "check_report.rs"]
mod check_report;

use check_report::Checker;
use half::{bf16, f16};
use localsgd_comm::mpi::{DEFAULT_TCP_LINKS, MpiConfig, MpiWorld, TCP_LINKS_VAR};
use localsgd_comm::{AsyncGroup, CommError, Group, GroupExt, ReduceOp};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("check");
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let result = match mode {
        "check" => check(
            !flag("--no-signature-check"),
            !flag("--no-preconnect"),
            !flag("--no-async"),
            value("--expect-hosts"),
            value("--expect-tcp-links").unwrap_or(u64::from(DEFAULT_TCP_LINKS)),
        ),
        "all-to-all" => all_to_all_only(!flag("--no-signature-check")),
        "kill-rank" => kill_rank(args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1)),
        "hang-rank" => hang_rank(
            args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1),
            value("--timeout").unwrap_or(3),
        ),
        "abort-rank" => abort_rank(args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1)),
        other => Err(format!(
            "unknown mode {other:?}; valid: check, all-to-all, kill-rank, hang-rank, abort-rank"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            println!("FAIL {message}");
            ExitCode::FAILURE
        }
    }
}

fn init(config: MpiConfig) -> Result<(MpiWorld, Group), String> {
    MpiWorld::init_with(config).map_err(|e| format!("MpiWorld::init: {e}"))
}

fn check(
    signature_check: bool,
    preconnect: bool,
    overlapped: bool,
    expect_hosts: Option<u64>,
    expect_tcp_links: u64,
) -> Result<(), String> {
    // Invalid settings are refused before MPI is touched.
    let zero = MpiWorld::init_with(MpiConfig::default().with_timeout(Duration::ZERO));
    let zero_refused = matches!(&zero, Err(CommError::InvalidConfig(m)) if m.contains("0s"));
    drop(zero);
    let no_links = MpiWorld::init_with(MpiConfig::default().with_tcp_links(Some(0)));
    let no_links_refused =
        matches!(&no_links, Err(CommError::InvalidConfig(m)) if m.contains("got 0"));
    drop(no_links);
    let config = MpiConfig::default()
        .with_timeout(Duration::from_secs(60))
        .with_signature_check(signature_check)
        .with_preconnect(preconnect);
    let (world, g) = init(config)?;
    let at_start = tcp_connections();
    let (rank, size) = (g.rank(), g.size());
    let mut c = Checker::new(rank);
    c.check("zero timeout refused", zero_refused, || {
        "no InvalidConfig".into()
    });
    c.check("zero TCP links refused", no_links_refused, || {
        "no InvalidConfig".into()
    });
    // What Open MPI read at MPI_Init: ours (2) unless the launcher set it.
    let links = std::env::var(TCP_LINKS_VAR).unwrap_or_default();
    c.check(
        &format!("TCP links {expect_tcp_links}"),
        links == expect_tcp_links.to_string(),
        || format!("{TCP_LINKS_VAR}={links:?}"),
    );
    let again = MpiWorld::init();
    c.check(
        "second init refused",
        matches!(&again, Err(CommError::Backend { message, .. }) if message.contains("once")),
        || format!("{again:?}"),
    );
    c.check("world", g.backend() == "mpi" && rank < size, || {
        format!("backend {} rank {rank} size {size}", g.backend())
    });
    c.check(
        "world ranks",
        g.world_ranks() == (0..size).collect::<Vec<_>>(),
        || format!("{:?}", g.world_ranks()),
    );

    collectives(&mut c, &g);
    subgroups(&mut c, &g, expect_hosts);
    traffic(&mut c, &g);
    if overlapped {
        nonblocking(&mut c, &g, signature_check);
    } else if rank == 0 {
        println!("SKIPPED non-blocking collectives (--no-async)");
    }
    if signature_check {
        mismatches(&mut c, &g);
    }

    if preconnect {
        connections(&mut c, at_start, expect_hosts, size);
    }

    let all_ok = c.ok("final agreement", g.all_true(c.failures == 0));
    if all_ok == Some(true) {
        if rank == 0 {
            println!(
                "ALL PASS ({size} ranks, signature check {signature_check}, {}, MPI_Iallreduce \
                 algorithm {:?})",
                world.library_version().lines().next().unwrap_or_default(),
                world.iallreduce_algorithm()
            );
        }
        Ok(())
    } else {
        Err(format!("rank {rank}: {} check(s) failed", c.failures))
    }
}

/// This process's established TCP connections (Linux: its socket descriptors listed in
/// `/proc/self/net/tcp{,6}` with state 01); `None` where `/proc` cannot tell.
fn tcp_connections() -> Option<usize> {
    let mut inodes = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").ok()? {
        let target = std::fs::read_link(entry.ok()?.path()).ok()?;
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
        {
            inodes.push(inode.to_string());
        }
    }
    let mut established = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        established += text
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() > 9 && f[3] == "01" && inodes.contains(&f[9].to_string()))
            .count();
    }
    Some(established)
}

/// With start-up's connection set-up ([`MpiConfig::with_preconnect`]): no TCP connection was
/// opened after `MpiWorld::init` returned, and on `hosts` hosts every rank had one to each rank
/// on other hosts by then (Linux only; elsewhere nothing is checked).
fn connections(c: &mut Checker, at_start: Option<usize>, hosts: Option<u64>, size: usize) {
    let (Some(start), Some(end)) = (at_start, tcp_connections()) else {
        return;
    };
    c.check(
        "no TCP connection opened after start-up",
        start == end,
        || format!("{start} at start-up, {end} now"),
    );
    if let Some(hosts) = hosts.filter(|&h| h > 1) {
        let elsewhere = size - size / hosts as usize;
        c.check(
            "start-up connected every rank on another host",
            start >= elsewhere,
            || format!("{start} TCP connections at start-up, {elsewhere} ranks elsewhere"),
        );
    }
}

fn collectives(c: &mut Checker, g: &Group) {
    let (rank, size) = (g.rank(), g.size());
    let n = size as f64;
    let tri = (size * (size - 1) / 2) as f64; // sum of ranks

    // f32 sum of small integers: exact in any summation order.
    let mut v: Vec<f32> = (0..1000).map(|i| (rank * 10 + i % 7) as f32).collect();
    if c.ok(
        "all_reduce f32 sum",
        g.all_reduce_slice(&mut v, ReduceOp::Sum),
    )
    .is_some()
    {
        let ok = v
            .iter()
            .enumerate()
            .all(|(i, &x)| x as f64 == 10.0 * tri + n * (i % 7) as f64);
        c.check("all_reduce f32 sum", ok, || format!("{:?}", &v[..4]));
    }

    // Mean op: sum then divide.
    let mut m = vec![rank as f32; 3];
    if c.ok(
        "all_reduce f32 mean",
        g.all_reduce_slice(&mut m, ReduceOp::Mean),
    )
    .is_some()
    {
        c.check(
            "all_reduce f32 mean",
            m == vec![(tri / n) as f32; 3],
            || format!("{m:?}"),
        );
    }

    // average_slice (divide first, then sum), the V3 numbers of the book's semantics §10 on 4 ranks.
    let mut a64 = vec![rank as f64 + 0.1; 2];
    let mut a16 = vec![f16::from_f64(rank as f64 + 0.1); 2];
    let r64 = g.average_slice(&mut a64);
    let r16 = g.average_slice(&mut a16);
    if c.ok("average f64", r64).is_some() && c.ok("average f16", r16).is_some() {
        let want = (0..size).map(|r| r as f64 + 0.1).sum::<f64>() / n;
        c.check("average f64", (a64[0] - want).abs() < 1e-12, || {
            format!("{a64:?}")
        });
        if size == 4 {
            c.check(
                "average f64 semantics V3",
                (a64[0] - 1.6).abs() < 1e-12,
                || format!("{a64:?}"),
            );
            c.check(
                "average f16 semantics V3 (1.599609375)",
                a16[0].to_f64() == 1.599609375,
                || format!("{}", a16[0]),
            );
        }
    }

    // bf16 and f16 sums of small integers (exact).
    let mut b = vec![bf16::from_f32(rank as f32 + 1.0); 5];
    if c.ok(
        "all_reduce bf16 sum",
        g.all_reduce_slice(&mut b, ReduceOp::Sum),
    )
    .is_some()
    {
        let want = tri + n;
        c.check(
            "all_reduce bf16 sum",
            b.iter().all(|x| x.to_f64() == want),
            || format!("{b:?}"),
        );
    }

    // Max / min with NaN propagation (rank 1 contributes NaN at index 0), every float type.
    let vals = |r: usize| {
        [
            if r == 1 { f64::NAN } else { r as f64 },
            r as f64,
            -(r as f64),
        ]
    };
    let mine = vals(rank);
    let mut f32s: Vec<f32> = mine.iter().map(|&x| x as f32).collect();
    let mut f64s: Vec<f64> = mine.to_vec();
    let mut h16: Vec<f16> = mine.iter().map(|&x| f16::from_f64(x)).collect();
    let mut hb: Vec<bf16> = mine.iter().map(|&x| bf16::from_f64(x)).collect();
    let top = (size - 1) as f64;
    let nan_ok = size < 2;
    let judge = |name: &str, got: [f64; 3], c: &mut Checker, want1: f64, want2: f64| {
        let ok = (got[0].is_nan() || nan_ok) && got[1] == want1 && got[2] == want2;
        c.check(name, ok, || format!("{got:?}"));
    };
    if c.ok("max f32", g.all_reduce_slice(&mut f32s, ReduceOp::Max))
        .is_some()
    {
        judge("max f32", [0, 1, 2].map(|i| f32s[i] as f64), c, top, 0.0);
    }
    if c.ok("min f64", g.all_reduce_slice(&mut f64s, ReduceOp::Min))
        .is_some()
    {
        judge("min f64", [0, 1, 2].map(|i| f64s[i]), c, 0.0, -top);
    }
    if c.ok("max f16", g.all_reduce_slice(&mut h16, ReduceOp::Max))
        .is_some()
    {
        judge("max f16", [0, 1, 2].map(|i| h16[i].to_f64()), c, top, 0.0);
    }
    if c.ok("min bf16", g.all_reduce_slice(&mut hb, ReduceOp::Min))
        .is_some()
    {
        judge("min bf16", [0, 1, 2].map(|i| hb[i].to_f64()), c, 0.0, -top);
    }

    // Bit-identical results on every rank for a large buffer of inexact values.
    let mut big: Vec<f32> = (0..(1usize << 20))
        .map(|i| ((i * 2654435761 + rank * 40503) % 100_003) as f32 * 1e-3 + 0.1)
        .collect();
    if c.ok(
        "all_reduce 1M bit-identical",
        g.all_reduce_slice(&mut big, ReduceOp::Sum),
    )
    .is_some()
    {
        let digest = big.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
            (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
        });
        if let Some(all) = c.ok("all_reduce 1M bit-identical", g.all_gather_u64(&[digest])) {
            c.check(
                "all_reduce 1M bit-identical",
                all.iter().all(|&d| d == digest),
                || format!("digests {all:?}"),
            );
        }
    }

    // Buffers of several all-reduce pieces (256 KiB each) and a remainder: every element is
    // reduced, across the piece boundaries, for 4-, 8- and 2-byte elements.
    let n32 = 3 * 65_536 + 17;
    let mut sum32: Vec<f32> = (0..n32).map(|i| (i % 1000 + rank) as f32).collect();
    let mut mean64: Vec<f64> = (0..n32).map(|i| (i % 1000 + rank) as f64).collect();
    let mut max16: Vec<f16> = (0..n32)
        .map(|i| f16::from_f32(((i + rank) % 7) as f32))
        .collect();
    let ranks_sum = (size * (size - 1) / 2) as f64;
    let wrong = |got: &mut dyn Iterator<Item = f64>, want: &dyn Fn(usize) -> f64| {
        got.enumerate().find(|&(i, x)| x != want(i))
    };
    if c.ok(
        "all_reduce sum, 3+ pieces",
        g.all_reduce_slice(&mut sum32, ReduceOp::Sum),
    )
    .is_some()
    {
        let bad = wrong(&mut sum32.iter().map(|&x| f64::from(x)), &|i| {
            (size * (i % 1000)) as f64 + ranks_sum
        });
        c.check("all_reduce sum, 3+ pieces", bad.is_none(), || {
            format!("first wrong element (index, value): {bad:?}")
        });
    }
    if c.ok(
        "all_reduce mean f64, 6+ pieces",
        g.all_reduce_slice(&mut mean64, ReduceOp::Mean),
    )
    .is_some()
    {
        let bad = wrong(&mut mean64.iter().copied(), &|i| {
            (i % 1000) as f64 + ranks_sum / size as f64
        });
        c.check("all_reduce mean f64, 6+ pieces", bad.is_none(), || {
            format!("first wrong element (index, value): {bad:?}")
        });
    }
    if c.ok(
        "all_reduce max f16, 1+ pieces",
        g.all_reduce_slice(&mut max16, ReduceOp::Max),
    )
    .is_some()
    {
        // Some rank holds 6 at every index once there are 7 ranks; with fewer, the largest
        // of (i + r) % 7 over the ranks r.
        let bad = wrong(&mut max16.iter().map(|x| x.to_f64()), &|i| {
            (0..size).map(|r| ((i + r) % 7) as f64).fold(0.0, f64::max)
        });
        c.check("all_reduce max f16, 1+ pieces", bad.is_none(), || {
            format!("first wrong element (index, value): {bad:?}")
        });
    }

    // Empty buffers still synchronise.
    let mut empty: Vec<f32> = Vec::new();
    let r = g.all_reduce_slice(&mut empty, ReduceOp::Sum);
    c.ok("all_reduce empty", r);

    // Broadcast from the last rank (f32 and f16); an invalid root is refused on every rank.
    let root = size - 1;
    let mut bc = vec![rank as f32 * 2.0 + 0.5; 7];
    let mut bh = vec![f16::from_f32(rank as f32); 3];
    if c.ok("broadcast f32", g.broadcast_slice(&mut bc, root))
        .is_some()
        && c.ok("broadcast f16", g.broadcast_slice(&mut bh, root))
            .is_some()
    {
        c.check(
            "broadcast",
            bc.iter().all(|&x| x == root as f32 * 2.0 + 0.5)
                && bh.iter().all(|&x| x.to_f32() == root as f32),
            || format!("{bc:?} {bh:?}"),
        );
    }
    let bad = g.broadcast_slice(&mut bc, size);
    c.check(
        "broadcast invalid root",
        matches!(bad, Err(CommError::InvalidRoot { root: r, size: s }) if r == size && s == size),
        || format!("{bad:?}"),
    );

    c.ok("barrier", g.barrier());
    c.check("barrier", true, String::new);

    let gathered = g.all_gather_u64(&[rank as u64, rank as u64 * 100]);
    if let Some(all) = c.ok("all_gather_u64", gathered) {
        let want: Vec<u64> = (0..size as u64).flat_map(|r| [r, r * 100]).collect();
        c.check("all_gather_u64", all == want, || format!("{all:?}"));
    }
    gather_bytes(c, g);
    all_to_all(c, g);
    let t = g.all_true(true);
    let f = g.all_true(rank != size - 1);
    c.check("all_true", t == Ok(true) && f == Ok(false), || {
        format!("{t:?} {f:?}")
    });
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

/// `all_gather_bytes`: distinct bytes per rank for several lengths (empty, one, odd, 1 MiB),
/// compared on every rank; a wrong output length is refused before communicating.
fn gather_bytes(c: &mut Checker, g: &Group) {
    let (rank, size) = (g.rank(), g.size());
    for len in [0, 1, 1000, 1 << 20] {
        let name = format!("all_gather_bytes {len}");
        let local: Vec<u8> = (0..len).map(|i| gather_byte(rank, i)).collect();
        let mut out = vec![0xAAu8; size * len];
        if c.ok(&name, g.all_gather_bytes(&local, &mut out)).is_some() {
            let want = gathered(size, len);
            let bad = out.iter().zip(&want).position(|(a, b)| a != b);
            c.check(&name, bad.is_none(), || {
                format!("first wrong byte at {bad:?} of {}", out.len())
            });
        }
    }
    let mut short = vec![0u8; 3];
    let r = g.all_gather_bytes(&[1, 2], &mut short);
    c.check(
        "all_gather_bytes wrong output length refused",
        matches!(r, Err(CommError::OutputLength { expected, actual: 3, .. }) if expected == 2 * size),
        || format!("{r:?}"),
    );
}

/// Byte `i` of the block rank `from` sends rank `to` in the all-to-all checks (distinct per
/// sender and per receiver).
fn exchange_byte(from: usize, to: usize, i: usize) -> u8 {
    (from * 89 + to * 53 + i * 31 + i / 256) as u8
}

/// One `all_to_all_bytes` of `block`-byte blocks on `g`, named `name`: every block this rank
/// receives, and what it charges `g`'s counters (one collective of one block's bytes, all
/// data, `(size - 1) * block` on the wire).
fn exchange(c: &mut Checker, g: &Group, name: &str, block: usize) {
    let (rank, size) = (g.rank(), g.size());
    let send: Vec<u8> = (0..size)
        .flat_map(|to| (0..block).map(move |i| exchange_byte(rank, to, i)))
        .collect();
    let mut recv = vec![0xAAu8; size * block];
    let before = g.traffic();
    let r = g.all_to_all_bytes(&send, &mut recv);
    let charged = g.traffic() - before;
    if c.ok(name, r).is_none() {
        return;
    }
    let want: Vec<u8> = (0..size)
        .flat_map(|from| (0..block).map(move |i| exchange_byte(from, rank, i)))
        .collect();
    let bad = recv.iter().zip(&want).position(|(a, b)| a != b);
    c.check(name, bad.is_none() && recv.len() == want.len(), || {
        format!(
            "first wrong byte at {bad:?} (in the block from rank {:?}) of {}",
            bad.map(|b| b / block.max(1)),
            recv.len()
        )
    });
    let b = block as u64;
    c.check(
        &format!("{name} charged"),
        (
            charged.collectives,
            charged.bytes,
            charged.data_bytes,
            charged.wire_bytes,
        ) == (1, b, b, (size as u64 - 1) * b),
        || format!("{charged:?}"),
    );
}

/// `all_to_all_bytes`: several block lengths (empty, one, odd, 1 MiB) on the world, one on a
/// subgroup (odd and even ranks); wrong buffer lengths refused before communicating.
fn all_to_all(c: &mut Checker, g: &Group) {
    let (rank, size) = (g.rank(), g.size());
    for block in [0, 1, 1000, 1 << 20] {
        exchange(c, g, &format!("all_to_all_bytes {block}"), block);
    }
    if let Some(sub) = c.ok("all_to_all_bytes subgroup", g.split((rank % 2) as u64)) {
        let before = g.traffic();
        exchange(c, &sub, "all_to_all_bytes on a subgroup", 777);
        let parent = g.traffic() - before;
        c.check(
            "all_to_all_bytes on a subgroup charged to the parent",
            (parent.collectives, parent.wire_bytes) == (1, (sub.size() as u64 - 1) * 777),
            || format!("{parent:?}"),
        );
    }
    if size > 1 {
        let mut recv = vec![0u8; 2 * size + 1];
        let r = g.all_to_all_bytes(&vec![1u8; 2 * size + 1], &mut recv);
        c.check(
            "all_to_all_bytes uneven blocks refused",
            matches!(r, Err(CommError::OutputLength { actual, .. }) if actual == 2 * size + 1),
            || format!("{r:?}"),
        );
    }
    let mut recv = vec![0u8; 3 * size];
    let r = g.all_to_all_bytes(&vec![1u8; 2 * size], &mut recv);
    c.check(
        "all_to_all_bytes wrong receive length refused",
        matches!(r, Err(CommError::OutputLength { expected, actual, .. })
            if expected == 2 * size && actual == 3 * size),
        || format!("{r:?}"),
    );
}

/// `all_to_all_bytes` on a dedicated communicator (`MPI_Ialltoall` polled, in pieces of at most
/// 256 KiB exchanged: an odd block of 100003 bytes takes several strided pieces from 3 ranks
/// on), empty blocks too. Its counters are its own.
fn all_to_all_dedicated(c: &mut Checker, g: &Group) {
    if let Some(d) = c.ok("all_to_all_bytes dedicated", g.dedicated()) {
        exchange(c, &d, "all_to_all_bytes dedicated 100003", 100_003);
        exchange(c, &d, "all_to_all_bytes dedicated 0", 0);
    }
}

/// With signature checks: rank 0 exchanges 7-byte blocks, the others 6 — a mismatch on every
/// rank, not a truncation; the group works afterwards.
fn all_to_all_mismatch(c: &mut Checker, g: &Group) {
    let (rank, size) = (g.rank(), g.size());
    if size < 2 {
        return;
    }
    let block = if rank == 0 { 7 } else { 6 };
    let mut recv = vec![0u8; block * size];
    let r = g.all_to_all_bytes(&vec![1u8; block * size], &mut recv);
    let ok = matches!(&r, Err(CommError::Mismatch { calls, .. })
        if calls[0].1 == "all_to_all_bytes(u8 x 7)"
            && calls[size - 1].1 == "all_to_all_bytes(u8 x 6)");
    c.check("mismatch: all_to_all_bytes blocks", ok, || format!("{r:?}"));
    exchange(c, g, "all_to_all_bytes after a mismatch", 5);
}

/// The `all-to-all` mode: [`all_to_all`], [`all_to_all_dedicated`] and (with signature checks)
/// [`all_to_all_mismatch`], then every rank's agreement that all passed.
fn all_to_all_only(signature_check: bool) -> Result<(), String> {
    let config = MpiConfig::default()
        .with_timeout(Duration::from_secs(60))
        .with_signature_check(signature_check);
    let (_world, g) = init(config)?;
    let (rank, size) = (g.rank(), g.size());
    let mut c = Checker::new(rank);
    all_to_all(&mut c, &g);
    all_to_all_dedicated(&mut c, &g);
    if signature_check {
        all_to_all_mismatch(&mut c, &g);
    }
    if c.ok("final agreement", g.all_true(c.failures == 0)) == Some(true) {
        if rank == 0 {
            println!("ALL PASS all-to-all ({size} ranks, signature check {signature_check})");
        }
        Ok(())
    } else {
        Err(format!("rank {rank}: {} check(s) failed", c.failures))
    }
}

fn subgroups(c: &mut Checker, g: &Group, expect_hosts: Option<u64>) {
    let (rank, size) = (g.rank(), g.size());

    // Blocks of 2 (on 4 ranks: {0,1}, {2,3}).
    if size % 2 == 0
        && let Some(pair) = c.ok("new_subgroups(2)", g.new_subgroups(2))
    {
        let lo = rank / 2 * 2;
        let mut v = vec![rank as f32; 2];
        let r = pair.average_slice(&mut v);
        c.check(
            "new_subgroups(2)",
            pair.world_ranks() == [lo, lo + 1]
                && pair.rank() == rank % 2
                && r.is_ok()
                && v[0] == (2 * lo + 1) as f32 / 2.0,
            || format!("{:?} {r:?} {v:?}", pair.world_ranks()),
        );
        // A color split of a subgroup: each pair split into singletons.
        if let Some(single) = c.ok("nested split", pair.split(pair.rank() as u64)) {
            c.check("nested split", single.world_ranks() == [rank], || {
                format!("{:?}", single.world_ranks())
            });
        }
    }
    if let Some(all) = c.ok("new_subgroups(size)", g.new_subgroups(size)) {
        c.check(
            "new_subgroups(size) is a new group of everyone",
            all.world_ranks() == g.world_ranks() && all.rank() == rank,
            || format!("{:?}", all.world_ranks()),
        );
    }
    for bad in [0, size + 1] {
        let r = g.new_subgroups(bad);
        c.check(
            &format!("new_subgroups({bad}) refused"),
            matches!(r, Err(CommError::InvalidSubgroupSize(_))),
            || format!("{r:?}"),
        );
    }
    if size == 4 {
        let r = g.new_subgroups(3);
        c.check(
            "new_subgroups(3) refused on 4",
            matches!(&r, Err(CommError::InvalidSubgroupSize(m)) if m == "group size 4 must be divisible by subgroup size 3"),
            || format!("{r:?}"),
        );
    }

    // Color split with colors far outside MPI's int range: even and odd ranks.
    let color = u64::MAX - (rank % 2) as u64;
    if let Some(parity) = c.ok("split by color", g.split(color)) {
        let want: Vec<usize> = (0..size).filter(|r| r % 2 == rank % 2).collect();
        let mut v = vec![1f64; 3];
        let r = parity.all_reduce_slice(&mut v, ReduceOp::Sum);
        c.check(
            "split by color",
            parity.world_ranks() == want && r.is_ok() && v[0] == want.len() as f64,
            || format!("{:?} {r:?} {v:?}", parity.world_ranks()),
        );
    }

    // Intra-node group: exactly the world ranks with this rank's host id.
    let hosts = c.ok("host ids", g.all_gather_u64(&[g.host_id()]));
    if let (Some(hosts), Some(node)) = (hosts, c.ok("intra_node", g.intra_node())) {
        let want: Vec<usize> = (0..size).filter(|&r| hosts[r] == g.host_id()).collect();
        println!(
            "INTRA rank {rank} host {:016x} intra_node world ranks {:?}",
            g.host_id(),
            node.world_ranks()
        );
        let mut v = vec![1f32; 2];
        let r = node.all_reduce_slice(&mut v, ReduceOp::Sum);
        c.check(
            "intra_node follows hosts",
            node.world_ranks() == want && r.is_ok() && v[0] == want.len() as f32,
            || format!("intra {:?} vs same-host {want:?} {r:?}", node.world_ranks()),
        );
        if let Some(n) = expect_hosts {
            let mut distinct = hosts.clone();
            distinct.sort_unstable();
            distinct.dedup();
            c.check(
                &format!("{n} hosts, each with an equal intra-node group"),
                distinct.len() as u64 == n && node.size() as u64 * n == size as u64,
                || {
                    format!(
                        "{} distinct hosts, intra size {}",
                        distinct.len(),
                        node.size()
                    )
                },
            );
        }
    }
}

fn traffic(c: &mut Checker, g: &Group) {
    let Some(sub) = c.ok("traffic subgroup", g.split(0)) else {
        return;
    };
    let w0 = g.traffic();
    let s0 = sub.traffic();
    let mut a = vec![0f32; 10];
    let mut b = vec![0f64; 3];
    let r1 = g.all_reduce_slice(&mut a, ReduceOp::Sum);
    let r2 = sub.all_reduce_slice(&mut b, ReduceOp::Max);
    let r3 = sub.barrier();
    let mut gathered = vec![0u8; 5 * sub.size()];
    let r4 = sub.all_gather_bytes(&[1u8; 5], &mut gathered);
    let (dw, ds) = (g.traffic() - w0, sub.traffic() - s0);
    c.check(
        "traffic counters (subgroup charged to parent)",
        r1.is_ok()
            && r2.is_ok()
            && r3.is_ok()
            && r4.is_ok()
            && (dw.collectives, dw.bytes, dw.data_bytes) == (4, 69, 69)
            && (ds.collectives, ds.bytes, ds.data_bytes) == (3, 29, 29),
        || format!("world {dw:?} sub {ds:?}"),
    );
}

/// `AsyncGroup` over MPI (`MPI_Comm_dup` driven by a helper thread, MPI_THREAD_MULTIPLE): a
/// pending all-reduce completes while the world group runs blocking collectives, its traffic is
/// charged at the start, a mismatch is reported on wait, and close checks for leftovers.
fn nonblocking(c: &mut Checker, g: &Group, signature_check: bool) {
    let Some(mut side) = c.ok("async group", AsyncGroup::new(g.clone())) else {
        return;
    };
    let (rank, size) = (g.rank(), g.size());
    let before = g.traffic();
    let big = c.ok(
        "async start",
        side.start_all_reduce(vec![rank as f32; 1 << 20], ReduceOp::Sum),
    );
    let charged = g.traffic() - before;
    let flags: Vec<_> = (0..4).map(|i| g.all_true(i % 2 == 0)).collect();
    c.check(
        "async: world collectives while pending",
        flags == vec![Ok(true), Ok(false), Ok(true), Ok(false)],
        || format!("{flags:?}"),
    );
    let want = (size * (size - 1) / 2) as f32;
    if let Some(p) = big {
        let v = p.wait();
        c.check(
            "async all_reduce 1M",
            v.as_ref()
                .is_ok_and(|v| v.len() == 1 << 20 && v.iter().all(|&x| x == want)),
            || format!("{:?}", v.map(|v| v[..2].to_vec())),
        );
    }
    c.check(
        "async traffic charged at start",
        (charged.collectives, charged.bytes) == (1, 4 << 20),
        || format!("{charged:?}"),
    );
    // A byte all-gather on the dedicated communicator: polled MPI_Iallgather pieces of at most
    // 256 KiB gathered, so 1 MiB per rank takes several strided pieces.
    let before = g.traffic();
    let local: Vec<u8> = (0..1 << 20).map(|i| gather_byte(rank, i)).collect();
    let pending = c.ok(
        "async all_gather_bytes start",
        side.start_all_gather_bytes(local),
    );
    let charged = g.traffic() - before;
    let flag = g.all_true(true);
    if let Some(p) = pending {
        let out = p.wait();
        let ok = out.as_ref().is_ok_and(|o| *o == gathered(size, 1 << 20));
        c.check("async all_gather_bytes 1M", ok && flag == Ok(true), || {
            format!("{:?} {flag:?}", out.map(|o| o.len()))
        });
    }
    c.check(
        "async all_gather_bytes charged at start",
        (charged.collectives, charged.bytes, charged.data_bytes) == (1, 1 << 20, 1 << 20),
        || format!("{charged:?}"),
    );
    if signature_check {
        let p = side.start_all_reduce(vec![0f32; 3 + rank % 2], ReduceOp::Sum);
        let r = p.map(|p| p.wait());
        c.check(
            "async: mismatch on wait",
            matches!(r, Ok(Err(CommError::Mismatch { .. }))),
            || format!("{r:?}"),
        );
    }
    let closed = side.close();
    c.check("async close", closed.is_ok(), || format!("{closed:?}"));
    all_to_all_dedicated(c, g);
}

fn mismatches(c: &mut Checker, g: &Group) {
    let (rank, size) = (g.rank(), g.size());
    if size < 2 {
        return;
    }
    // Rank 0 reduces 5 elements, the others 4.
    let mut v = vec![1f32; if rank == 0 { 5 } else { 4 }];
    let r = g.all_reduce_slice(&mut v, ReduceOp::Sum);
    let ok = match &r {
        Err(CommError::Mismatch { calls, group }) => {
            group == g.world_ranks()
                && calls.len() == size
                && calls[0] == (0, "all_reduce(sum, f32 x 5)".to_string())
                && calls[1..]
                    .iter()
                    .enumerate()
                    .all(|(i, call)| *call == (i + 1, "all_reduce(sum, f32 x 4)".to_string()))
        }
        _ => false,
    };
    c.check("mismatch: lengths", ok && v == vec![1.0; v.len()], || {
        format!("{r:?}")
    });
    if let (0, Err(e)) = (rank, &r) {
        println!("MISMATCH {e}");
    }

    // Rank 0 gathers 7 bytes, the others 6: a mismatch on every rank, not a truncation.
    let len = if rank == 0 { 7 } else { 6 };
    let mut out = vec![0u8; len * size];
    let r = g.all_gather_bytes(&vec![1u8; len], &mut out);
    let ok = matches!(&r, Err(CommError::Mismatch { calls, .. })
        if calls[0].1 == "all_gather_bytes(u8 x 7)" && calls[size - 1].1 == "all_gather_bytes(u8 x 6)");
    c.check("mismatch: all_gather_bytes lengths", ok, || {
        format!("{r:?}")
    });

    all_to_all_mismatch(c, g);

    // The last rank calls a barrier while the others broadcast.
    let r = if rank == size - 1 {
        g.barrier()
    } else {
        g.broadcast_slice(&mut v, 0)
    };
    let ok = matches!(&r, Err(CommError::Mismatch { calls, .. })
        if calls[size - 1].1 == "barrier()" && calls[0].1.starts_with("broadcast(root 0"));
    c.check("mismatch: kinds", ok, || format!("{r:?}"));

    // The group still works afterwards.
    let mut w = vec![1f32; 4];
    let r = g.all_reduce_slice(&mut w, ReduceOp::Sum);
    c.check(
        "collectives work after a mismatch",
        r.is_ok() && w[0] == size as f32,
        || format!("{r:?} {w:?}"),
    );
}

fn kill_rank(victim: usize) -> Result<(), String> {
    let (_world, g) = init(MpiConfig::default())?;
    let mut v = vec![1f32; 1 << 16];
    g.all_reduce_slice(&mut v, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    if g.rank() == victim {
        println!("rank {victim} kills itself (SIGKILL)");
        let pid = std::process::id().to_string();
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        std::thread::sleep(Duration::from_secs(5));
        return Err(format!(
            "kill -KILL {pid} did not end the process: {status:?}"
        ));
    }
    let start = Instant::now();
    loop {
        g.all_reduce_slice(&mut v, ReduceOp::Sum)
            .map_err(|e| format!("rank {} after {:?}: {e}", g.rank(), start.elapsed()))?;
        if start.elapsed() > Duration::from_secs(600) {
            return Err("the job survived a killed rank for 10 minutes".into());
        }
    }
}

fn hang_rank(sleeper: usize, timeout_s: u64) -> Result<(), String> {
    let config = MpiConfig::default().with_timeout(Duration::from_secs(timeout_s));
    let (_world, g) = init(config)?;
    g.barrier().map_err(|e| e.to_string())?;
    if g.rank() == sleeper {
        println!("rank {sleeper} stops taking part (sleeps)");
        std::thread::sleep(Duration::from_secs(600));
        return Err("the watchdog did not end the job".into());
    }
    let mut v = vec![1f32; 8];
    g.all_reduce_slice(&mut v, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    Err("the all-reduce completed without the sleeping rank".into())
}

fn abort_rank(victim: usize) -> Result<(), String> {
    let (world, g) = init(MpiConfig::default())?;
    g.barrier().map_err(|e| e.to_string())?;
    if g.rank() == victim {
        println!("rank {victim} aborts the job");
        world.abort(3);
    }
    let mut v = vec![1f32; 8];
    g.all_reduce_slice(&mut v, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    Err("the all-reduce completed without the aborting rank".into())
}
