//! Failures never hang: panics, dropped handles, timeouts and mismatched collectives all become
//! errors that name the ranks involved.

use localsgd_comm::{CommError, GroupExt, ProcessGroup, ReduceOp, ThreadWorld};
use std::time::{Duration, Instant};

#[test]
fn panicking_worker_fails_its_peers_fast_naming_it() {
    let start = Instant::now();
    let world = ThreadWorld::new(3).unwrap(); // default timeout (minutes): must not be what ends it
    let peers = std::sync::Mutex::new(Vec::new());
    let result = world.run(|g| {
        if g.rank() == 1 {
            panic!("boom on purpose");
        }
        let mut v = vec![1f32; 16];
        let first = g.all_reduce_slice(&mut v, ReduceOp::Sum);
        let later = g.barrier();
        peers.lock().unwrap().push((g.rank(), first, later));
    });
    let err = result.unwrap_err();
    assert_eq!(err.rank, 1);
    assert!(err.message.contains("boom on purpose"));
    let peers = peers.into_inner().unwrap();
    assert_eq!(peers.len(), 2);
    for (_, first, later) in peers {
        for e in [first.unwrap_err(), later.unwrap_err()] {
            match &e {
                CommError::PeerFailed { rank, reason, .. } => {
                    assert_eq!(*rank, 1);
                    assert!(reason.contains("panicked"), "{e}");
                }
                other => panic!("unexpected {other}"),
            }
        }
    }
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn dropped_handle_fails_pending_collective() {
    let mut groups = ThreadWorld::new(2).unwrap().groups();
    let g1 = groups.pop().unwrap();
    let g0 = groups.pop().unwrap();
    let waiter = std::thread::spawn(move || g0.barrier());
    std::thread::sleep(Duration::from_millis(50));
    drop(g1);
    let err = waiter.join().unwrap().unwrap_err();
    assert!(
        matches!(err, CommError::PeerFailed { rank: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("dropped"), "{err}");
}

#[test]
fn timeout_names_the_collective_and_missing_ranks() {
    let world = ThreadWorld::new(3)
        .unwrap()
        .with_timeout(Duration::from_millis(200));
    let out = world
        .run(|g| {
            if g.rank() == 2 {
                std::thread::sleep(Duration::from_millis(600));
                return None;
            }
            let mut v = vec![0f32; 4];
            Some(g.all_reduce_slice(&mut v, ReduceOp::Max))
        })
        .unwrap();
    for r in out.into_iter().flatten() {
        match r.unwrap_err() {
            CommError::Timeout { call, missing, .. } => {
                assert_eq!(call, "all_reduce(max, f32 x 4)");
                assert_eq!(missing, vec![2]);
            }
            other => panic!("unexpected {other}"),
        }
    }
}

#[test]
fn different_lengths_are_a_mismatch_on_every_rank() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut v = vec![0f32; 10 + g.rank()];
            let err = g.all_reduce_slice(&mut v, ReduceOp::Sum).unwrap_err();
            // The group stays usable after a caught mismatch.
            let mut w = vec![1f32; 2];
            g.all_reduce_slice(&mut w, ReduceOp::Sum).unwrap();
            (err, w)
        })
        .unwrap();
    for (err, w) in out {
        assert_eq!(w, vec![2.0, 2.0]);
        let msg = err.to_string();
        assert!(
            msg.contains("rank 0 called all_reduce(sum, f32 x 10)"),
            "{msg}"
        );
        assert!(
            msg.contains("rank 1 called all_reduce(sum, f32 x 11)"),
            "{msg}"
        );
    }
}

#[test]
fn different_op_order_is_a_mismatch() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut v = vec![0f32; 4];
            if g.rank() == 0 {
                g.all_reduce_slice(&mut v, ReduceOp::Sum)
            } else {
                g.broadcast_slice(&mut v, 0)
            }
        })
        .unwrap();
    for r in out {
        let msg = r.unwrap_err().to_string();
        assert!(
            msg.contains("rank 0 called all_reduce(sum, f32 x 4)"),
            "{msg}"
        );
        assert!(
            msg.contains("rank 1 called broadcast(root 0, f32 x 4)"),
            "{msg}"
        );
    }
}

#[test]
fn element_type_mismatch_is_caught() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            if g.rank() == 0 {
                g.all_reduce_slice(&mut [0f32; 3], ReduceOp::Sum)
            } else {
                g.all_reduce_slice(&mut [0f64; 3], ReduceOp::Sum)
            }
        })
        .unwrap();
    assert!(
        out.iter()
            .all(|r| matches!(r, Err(CommError::Mismatch { .. })))
    );
}
