//! NCCL backend tests that need no GPU: the TCP rendezvous (threads as ranks on 127.0.0.1),
//! configuration errors, and errors (never panics) when CUDA or NCCL is missing. The last test
//! runs the GPU smoke binary when the machine has a GPU and says explicitly that it skipped
//! otherwise.
#![cfg(feature = "nccl")]

use localsgd_comm::CommError;
use localsgd_comm::nccl::rendezvous::split_host_port;
use localsgd_comm::nccl::{NcclConfig, NcclWorld, TcpRendezvous, stand_in, try_load_nccl};
use std::process::Command;
use std::time::{Duration, Instant};

/// A port that was free a moment ago.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn id_pattern() -> [u8; 128] {
    std::array::from_fn(|i| (i * 7 + 3) as u8)
}

fn meet(rank: usize, size: usize, addr: &str, timeout: Duration) -> TcpRendezvous {
    TcpRendezvous {
        rank,
        size,
        addr: addr.to_string(),
        timeout,
    }
}

#[test]
fn rendezvous_hands_the_id_and_hosts_to_every_rank() {
    let addr = format!("127.0.0.1:{}", free_port());
    let size = 4;
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let addr = addr.clone();
                s.spawn(move || {
                    // Peers start before rank 0 listens: they must retry.
                    if rank == 0 {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    meet(rank, size, &addr, Duration::from_secs(20)).run(
                        &format!("host-{}", rank % 2),
                        || {
                            assert_eq!(rank, 0, "only rank 0 creates the id");
                            Ok(id_pattern())
                        },
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, o) in outcomes.into_iter().enumerate() {
        let o = o.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(o.id, id_pattern(), "rank {rank}");
        assert_eq!(
            o.hosts,
            ["host-0", "host-1", "host-0", "host-1"],
            "rank {rank}"
        );
    }
}

#[test]
fn single_rank_rendezvous_opens_no_socket() {
    // Port 1 cannot be bound by an unprivileged test, and a world of one must not try.
    let o = meet(0, 1, "127.0.0.1:1", Duration::from_secs(1))
        .run("solo", || Ok(id_pattern()))
        .unwrap();
    assert_eq!(o.id, id_pattern());
    assert_eq!(o.hosts, ["solo"]);
}

#[test]
fn peer_without_rank_zero_times_out_naming_the_address() {
    let addr = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    let e = meet(1, 2, &addr, Duration::from_millis(500))
        .run("h", || unreachable!("rank 1 never creates the id"))
        .unwrap_err();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "gave up after {waited:?}"
    );
    assert!(waited < Duration::from_secs(10), "took {waited:?}");
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
    assert!(text.contains(&addr), "{text}");
    assert!(text.contains("500ms"), "{text}");
    assert!(text.contains("could not connect to rank 0"), "{text}");
}

#[test]
fn rank_zero_times_out_naming_the_missing_ranks() {
    let addr = format!("127.0.0.1:{}", free_port());
    let e = meet(0, 3, &addr, Duration::from_millis(400))
        .run("h", || Ok(id_pattern()))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&addr), "{e}");
    assert!(e.contains("rank(s) [1, 2] did not connect"), "{e}");
}

#[test]
fn world_size_disagreement_fails_on_both_sides() {
    let addr = format!("127.0.0.1:{}", free_port());
    let (root, peer) = std::thread::scope(|s| {
        let a = addr.clone();
        let root =
            s.spawn(move || meet(0, 2, &a, Duration::from_secs(10)).run("h0", || Ok(id_pattern())));
        let peer =
            s.spawn(|| meet(1, 3, &addr, Duration::from_secs(10)).run("h1", || Ok([0; 128])));
        (root.join().unwrap(), peer.join().unwrap())
    });
    let root = root.unwrap_err().to_string();
    let peer = peer.unwrap_err().to_string();
    assert!(
        root.contains("rank 1 was started with world size 3, rank 0 with 2"),
        "{root}"
    );
    assert!(peer.contains("rank 0 refused this rank"), "{peer}");
    assert!(peer.contains("world size 3"), "{peer}");
}

#[test]
fn bad_addresses_and_ports_are_config_errors() {
    for (addr, needle) in [
        ("127.0.0.1:notaport", "\"notaport\" is not a number"),
        ("127.0.0.1:70000", "\"70000\" is not a number"),
        ("127.0.0.1:0", "port 0 is not allowed"),
        ("127.0.0.1", "no port given"),
        (":29500", "empty host"),
    ] {
        let e = split_host_port(addr).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, CommError::InvalidConfig(_)), "{addr}: {e:?}");
        assert!(text.contains(needle), "{addr}: {text}");
        assert!(text.contains(addr), "{addr}: {text}");
    }
    assert_eq!(split_host_port("[::1]:29500").unwrap(), ("::1", 29500));
    assert_eq!(split_host_port("node-3:29500").unwrap(), ("node-3", 29500));
    let e = meet(1, 2, "no-such-host.invalid:29500", Duration::from_secs(1))
        .run("h", || Ok([0; 128]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not resolve"), "{e}");
    // The same checks guard the world constructor, before any library is loaded.
    let e = NcclWorld::init_tcp(0, 2, "127.0.0.1:x", 0, NcclConfig::default()).unwrap_err();
    assert!(matches!(e, CommError::InvalidConfig(_)), "{e:?}");
}

#[test]
fn invalid_settings_are_refused_before_any_library_is_loaded() {
    let zero = NcclConfig::default().with_timeout(Duration::ZERO);
    let e = NcclWorld::init_tcp(0, 1, "127.0.0.1:29500", 0, zero).unwrap_err();
    assert_eq!(
        e,
        CommError::InvalidConfig("the NCCL collective timeout must be positive (got 0s)".into())
    );
    let e = NcclWorld::init_tcp(2, 2, "127.0.0.1:29500", 0, NcclConfig::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("rank 2 is not valid for a world of 2"),
        "{e}"
    );
}

#[test]
fn missing_nccl_library_is_an_error_naming_what_to_do() {
    let e = try_load_nccl(&["/nonexistent/dir/libnccl.so.2"]).unwrap_err();
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
    assert!(text.contains("/nonexistent/dir/libnccl.so.2"), "{text}");
    assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
    assert!(text.contains("LOCALSGD_NCCL_LIB"), "{text}");
}

#[test]
fn init_without_cuda_or_nccl_returns_the_probe_error_not_a_panic() {
    match NcclWorld::probe() {
        Ok(p) => println!(
            "skipped: this machine has {} GPU(s) and NCCL {}, so nothing is missing",
            p.devices, p.nccl_version
        ),
        Err(probe_error) => {
            let port = free_port();
            let r = std::panic::catch_unwind(|| {
                NcclWorld::init_tcp(0, 1, &format!("127.0.0.1:{port}"), 0, NcclConfig::default())
            });
            let e = r.expect("init must not panic").unwrap_err();
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
            let text = e.to_string();
            assert!(
                text.contains("libcuda") || text.contains("libnccl") || text.contains("GPU"),
                "{text}"
            );
            assert_eq!(e, probe_error);
        }
    }
}

#[test]
fn gpu_smoke_runs_or_reports_skip() {
    let out = Command::new(env!("CARGO_BIN_EXE_nccl_smoke"))
        .output()
        .expect("run nccl_smoke");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    match NcclWorld::probe() {
        Err(reason) => {
            assert_eq!(out.status.code(), Some(77), "{stdout}");
            let line = stdout.lines().find(|l| l.starts_with("SKIP: "));
            assert!(line.is_some(), "{stdout}");
            assert!(
                line.unwrap_or_default().contains(&reason.to_string()),
                "{stdout}"
            );
            println!("skipped: no GPU ({reason})");
        }
        Ok(p) => {
            assert_eq!(out.status.code(), Some(0), "{stdout}");
            assert!(stdout.contains("SUMMARY: PASS"), "{stdout}");
            assert!(!stdout.contains("FAIL"), "{stdout}");
            println!("ran on {} GPU(s), NCCL {}", p.devices, p.nccl_version);
        }
    }
}

#[test]
fn smoke_expectations_hold_on_the_thread_backend() {
    // The smoke test's hand-computed expectations and training thresholds, checked against the
    // reference backend, so a GPU failure of the smoke points at the NCCL backend.
    for ranks in ["1", "3", "4"] {
        let out = Command::new(env!("CARGO_BIN_EXE_nccl_smoke"))
            .args(["--threads", ranks])
            .output()
            .expect("run nccl_smoke --threads");
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{ranks} ranks:\n{stdout}");
        assert!(!stdout.contains("FAIL"), "{ranks} ranks:\n{stdout}");
        assert!(
            stdout.contains(&format!("SUMMARY: PASS (thread backend, {ranks} rank(s))")),
            "{stdout}"
        );
        for name in [
            "PASS all_reduce bf16 mean",
            "PASS all_reduce 4M f32",
            "PASS broadcast from root 0",
            "PASS split by color",
            "PASS traffic counters (subgroup charged to parent)",
            "PASS training: loss falls with averaged gradients",
            "PASS training: parameters identical after averaging at step 10",
        ] {
            assert!(
                stdout.contains(name),
                "{ranks} ranks: missing {name}:\n{stdout}"
            );
        }
    }
}

/// Build a stand-in `libnccl.so.2` (C, through the system C compiler that Rust links with)
/// whose `ncclGetVersion` reports `version` and which exports the NCCL entry points named in
/// `symbols` as stubs that are never called. Only the loader's checks run against it.
fn stand_in_nccl(name: &str, version: u32, symbols: &[&str]) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nccl-{name}"));
    std::fs::create_dir_all(&dir).expect("create the stand-in's directory");
    let mut c = format!("int ncclGetVersion(int *v) {{ *v = {version}; return 0; }}\n");
    for s in symbols {
        c.push_str(&format!("int {s}(void) {{ return 0; }}\n"));
    }
    let src = dir.join("stand_in.c");
    std::fs::write(&src, c).expect("write the stand-in's source");
    let lib = dir.join("libnccl.so.2");
    if let Err(e) = stand_in::compile(&src, &lib, &[]) {
        panic!("{e}");
    }
    lib.to_string_lossy().into_owned()
}

/// Every NCCL entry point the loader requires besides `ncclGetVersion`.
const REQUIRED: &[&str] = &[
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclAllGather",
];

#[test]
fn a_complete_nccl_loads_and_reports_its_version() {
    let lib = stand_in_nccl("complete", 22105, REQUIRED);
    assert_eq!(try_load_nccl(&[&lib]), Ok("2.21.5".to_string()));
}

#[test]
fn nccl_older_than_2_12_is_refused_naming_both_versions() {
    let lib = stand_in_nccl("old", 21003, REQUIRED);
    let text = try_load_nccl(&[&lib]).unwrap_err().to_string();
    assert!(text.contains("is NCCL 2.10.3"), "{text}");
    assert!(text.contains("NCCL 2.12.0 or newer"), "{text}");
    assert!(text.contains("LOCALSGD_NCCL_LIB"), "{text}");
}

#[test]
fn a_library_without_a_required_entry_point_is_refused_naming_it() {
    let lib = stand_in_nccl("partial", 22105, &REQUIRED[..REQUIRED.len() - 1]);
    let text = try_load_nccl(&[&lib]).unwrap_err().to_string();
    assert!(text.contains("has no symbol ncclAllGather"), "{text}");
    assert!(text.contains("install NCCL >= 2.12"), "{text}");
}

/// The rendezvous' wire messages under random input (property tests, a bounded number of
/// cases): rank 0 ignores connections that are not a hello and still meets the real peer, or
/// refuses a well-formed hello with a bad rank or world size, naming it; a peer given a random
/// answer by a fake rank 0 gets a clear error. Never a panic, a hang past the timeout, or an
/// allocation sized by the input (strings are capped at 64 KiB).
mod rendezvous_fuzz {
    use super::*;
    use proptest::prelude::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    const MAGIC: u64 = 0x4c53_4744_4e43_4c31; // "LSGDNCL1"

    /// How long one case may take before it counts as a hang. The timeouts involved are 2-5 s
    /// and a case normally takes well under 1 s; the margin is for a loaded 2-core CI machine,
    /// where a case once took over 12 s while a 4-rank MPI job spun beside it.
    const NO_HANG: Duration = Duration::from_secs(60);

    fn send(addr: &str, bytes: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match TcpStream::connect(addr) {
                Ok(mut s) => {
                    let _ = s.write_all(bytes);
                    return; // closed: rank 0's read ends at once
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("cannot reach rank 0 at {addr}: {e}"),
            }
        }
    }

    /// A message: random bytes, or a hello with the right magic and random fields.
    fn message() -> impl Strategy<Value = (Vec<u8>, Option<(u64, u64)>)> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(|b| (b, None)),
            (
                0..5u64,
                0..5u64,
                proptest::option::of(any::<u32>()),
                proptest::collection::vec(any::<u8>(), 0..16),
            )
                .prop_map(|(rank, size, len, host)| {
                    // The host's own length, or any length (too long, or past the 64 KiB cap).
                    let len = len.unwrap_or(host.len() as u32);
                    let mut b = MAGIC.to_le_bytes().to_vec();
                    b.extend_from_slice(&rank.to_le_bytes());
                    b.extend_from_slice(&size.to_le_bytes());
                    b.extend_from_slice(&len.to_le_bytes());
                    b.extend_from_slice(&host);
                    (b, Some((rank, size)))
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn rank_zero_survives_or_refuses_stray_messages((bytes, hello) in message()) {
            let addr = format!("127.0.0.1:{}", free_port());
            let started = Instant::now();
            let (root, peer) = std::thread::scope(|s| {
                let a = addr.clone();
                let root = s.spawn(move || {
                    meet(0, 2, &a, Duration::from_secs(5)).run("h0", || Ok(id_pattern()))
                });
                send(&addr, &bytes);
                // The real peer arrives after the stray message.
                std::thread::sleep(Duration::from_millis(150));
                let peer = meet(1, 2, &addr, Duration::from_secs(2)).run("h1", || Ok([0; 128]));
                (root.join().unwrap(), peer)
            });
            prop_assert!(started.elapsed() < NO_HANG, "took {:?}", started.elapsed());
            // A whole hello (its host string complete and under the cap) is read; anything
            // else ends in a read error and is ignored.
            let whole = |bytes: &[u8]| {
                let len = u32::from_le_bytes(bytes[24..28].try_into().unwrap()) as usize;
                len <= 64 * 1024 && bytes.len() >= 28 + len
            };
            match hello {
                Some((rank, size)) if whole(&bytes) && (size != 2 || rank == 0 || rank >= 2) => {
                    let e = root.unwrap_err().to_string();
                    prop_assert!(e.contains("world size") || e.contains("not valid"), "{}", e);
                    prop_assert!(peer.is_err());
                }
                Some(_) if whole(&bytes) => {
                    // A valid rank 1 took the real one's place: rank 0 hands it the id (the
                    // write to the closed socket may fail) and stops listening; the real peer
                    // cannot meet anyone.
                    prop_assert!(peer.is_err());
                    let _ = root;
                }
                _ => {
                    let root = root.unwrap_or_else(|e| panic!("rank 0: {e}"));
                    let peer = peer.unwrap_or_else(|e| panic!("rank 1: {e}"));
                    prop_assert_eq!(root.id, id_pattern());
                    prop_assert_eq!(peer.id, id_pattern());
                    prop_assert_eq!(peer.hosts, vec!["h0".to_string(), "h1".to_string()]);
                }
            }
        }

        #[test]
        fn a_peer_given_a_random_answer_gets_an_error(
            good_magic in any::<bool>(),
            status in any::<u8>(),
            tail in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let started = Instant::now();
            let peer = std::thread::scope(|s| {
                s.spawn(move || {
                    let (mut c, _) = listener.accept().unwrap();
                    let mut hello = [0u8; 28 + 2];
                    let _ = c.read_exact(&mut hello);
                    let magic = if good_magic { MAGIC } else { MAGIC ^ 1 };
                    let mut answer = magic.to_le_bytes().to_vec();
                    answer.push(status);
                    answer.extend_from_slice(&tail);
                    let _ = c.write_all(&answer);
                });
                meet(1, 2, &addr, Duration::from_secs(3)).run("h1", || Ok([0; 128]))
            });
            prop_assert!(started.elapsed() < NO_HANG, "took {:?}", started.elapsed());
            // 300 bytes cannot hold an id (128) and two host strings unless they are short:
            // an answer may parse, but only as rank 0's id and host names.
            if let Err(e) = peer {
                let e = e.to_string();
                prop_assert!(
                    e.contains("bad magic") || e.contains("refused this rank")
                        || e.contains("connection to rank 0 failed") || e.contains("did not send the id"),
                    "{}", e
                );
            }
        }
    }
}
