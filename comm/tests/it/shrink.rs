//! `ProcessGroup::shrink` on the thread backend: the survivors of a failed group form a new
//! group (ULFM's `MPIX_Comm_shrink`), and `ThreadWorld::run_each` keeps their results.

use localsgd_comm::{
    CommError, Group, GroupExt, ProcessGroup, ReduceOp, ThreadWorld, Traffic, WorkerPanicked,
};
use std::time::{Duration, Instant};

/// All-reduce this rank's world rank over `g` (as one `f64`: 8 bytes of data).
fn sum_of_world_ranks(g: &Group) -> Result<f64, CommError> {
    let mut v = [g.world_ranks()[g.rank()] as f64];
    g.all_reduce_slice(&mut v, ReduceOp::Sum)?;
    Ok(v[0])
}

/// What a survivor saw: the shrunk group's layout and its first all-reduce.
#[derive(Debug, PartialEq)]
struct Survivor {
    failed_rank: usize,
    rank: usize,
    size: usize,
    world_ranks: Vec<usize>,
    host: u64,
    sum: f64,
    traffic_since_failure: Traffic,
    world_traffic_follows: bool,
}

#[test]
fn survivors_of_a_panic_shrink_and_all_reduce() {
    let world = ThreadWorld::new(4)
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .with_hosts(vec![10, 11, 12, 13])
        .unwrap();
    let out = world.run_each(|g| -> Result<Survivor, CommError> {
        if g.rank() == 2 {
            panic!("rank 2 fails on purpose");
        }
        let mut v = [1f32; 4];
        let failed_rank = match g.all_reduce_slice(&mut v, ReduceOp::Sum) {
            Err(CommError::PeerFailed { rank, .. }) => rank,
            other => panic!("expected PeerFailed, got {other:?}"),
        };
        // The old group stays failed.
        assert!(matches!(
            g.barrier(),
            Err(CommError::PeerFailed { rank: 2, .. })
        ));
        let before = g.traffic();
        let shrunk = g.shrink()?;
        let sum = sum_of_world_ranks(&shrunk)?;
        Ok(Survivor {
            failed_rank,
            rank: shrunk.rank(),
            size: shrunk.size(),
            world_ranks: shrunk.world_ranks().to_vec(),
            host: shrunk.host_id(),
            sum,
            traffic_since_failure: shrunk.traffic() - before,
            world_traffic_follows: g.traffic() == shrunk.traffic(),
        })
    });
    assert_eq!(out.len(), 4);
    let panicked = out[2].as_ref().unwrap_err();
    assert_eq!(panicked.rank, 2);
    assert!(panicked.message.contains("rank 2 fails on purpose"));
    // One f64 all-reduced on the 3 survivors: a ring moves 2 · 2/3 of its 8 bytes (10.67).
    let one_f64 = Traffic {
        collectives: 1,
        bytes: 8,
        data_bytes: 8,
        wire_bytes: 10,
    };
    for (world_rank, new_rank, host) in [(0, 0, 10), (1, 1, 11), (3, 2, 13)] {
        let survivor = out[world_rank].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(
            *survivor,
            Survivor {
                failed_rank: 2,
                rank: new_rank,
                size: 3,
                world_ranks: vec![0, 1, 3],
                host,
                sum: 4.0,
                traffic_since_failure: one_f64,
                world_traffic_follows: true,
            }
        );
    }
}

/// What a rank that survived two failures saw.
#[derive(Debug, PartialEq)]
struct TwoShrinks {
    first_world_ranks: Vec<usize>,
    first_sum: f64,
    second_rank: usize,
    second_size: usize,
    second_world_ranks: Vec<usize>,
    second_sum: f64,
}

#[test]
fn a_second_failure_shrinks_the_shrunk_group_again() {
    let world = ThreadWorld::new(4)
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let out = world.run_each(|g| -> Result<Option<TwoShrinks>, CommError> {
        if g.rank() == 2 {
            drop(g); // leaves before the first collective
            return Ok(None);
        }
        assert!(matches!(
            g.barrier(),
            Err(CommError::PeerFailed { rank: 2, .. })
        ));
        let first = g.shrink()?;
        let first_sum = sum_of_world_ranks(&first)?;
        if g.rank() == 3 {
            // World rank 3, rank 2 of the shrunk group, leaves it too.
            return Ok(None);
        }
        match sum_of_world_ranks(&first) {
            Err(CommError::PeerFailed { rank: 3, .. }) => {}
            other => panic!("expected PeerFailed naming world rank 3, got {other:?}"),
        }
        let second = first.shrink()?;
        Ok(Some(TwoShrinks {
            first_world_ranks: first.world_ranks().to_vec(),
            first_sum,
            second_rank: second.rank(),
            second_size: second.size(),
            second_world_ranks: second.world_ranks().to_vec(),
            second_sum: sum_of_world_ranks(&second)?,
        }))
    });
    let out: Vec<_> = out.into_iter().map(|r| r.unwrap().unwrap()).collect();
    assert_eq!(out[2], None);
    assert_eq!(out[3], None);
    for r in [0, 1] {
        assert_eq!(
            out[r],
            Some(TwoShrinks {
                first_world_ranks: vec![0, 1, 3],
                first_sum: 4.0,
                second_rank: r,
                second_size: 2,
                second_world_ranks: vec![0, 1],
                second_sum: 1.0,
            })
        );
    }
}

#[test]
fn shrink_without_a_failure_keeps_every_member_once() {
    let out = ThreadWorld::new(3)
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .with_hosts(vec![5, 5, 6])
        .unwrap()
        .run(|g| {
            let shrunk = g.shrink().unwrap();
            let sum = sum_of_world_ranks(&shrunk).unwrap();
            // The old group still works, and a second shrink of it is refused at once.
            let old_sum = sum_of_world_ranks(&g).unwrap();
            let again = g.shrink().unwrap_err();
            (
                shrunk.rank(),
                shrunk.size(),
                shrunk.world_ranks().to_vec(),
                shrunk.host_id(),
                sum,
                old_sum,
                again,
            )
        })
        .unwrap();
    for (r, host) in [(0, 5), (1, 5), (2, 6)] {
        let (rank, size, world_ranks, h, sum, old_sum, again) = &out[r];
        assert_eq!(
            (*rank, *size, world_ranks.clone(), *h, *sum, *old_sum),
            (r, 3, vec![0, 1, 2], host, 3.0, 3.0)
        );
        assert!(matches!(again, CommError::InvalidConfig(_)), "{again}");
        assert!(
            again
                .to_string()
                .contains("group [0, 1, 2] was shrunk already"),
            "{again}"
        );
    }
}

#[test]
fn a_survivor_that_never_shrinks_times_the_others_out_naming_it() {
    let start = Instant::now();
    let mut groups = ThreadWorld::new(4)
        .unwrap()
        .with_timeout(Duration::from_millis(300))
        .groups()
        .into_iter();
    let (g0, g1, g2, g3) = (
        groups.next().unwrap(),
        groups.next().unwrap(),
        groups.next().unwrap(),
        groups.next().unwrap(),
    );
    drop(g1); // world rank 1 has failed before anyone shrinks
    let (timed_out, late) = std::sync::mpsc::channel::<()>();
    let out = std::thread::scope(|scope| {
        let waiters = [g0, g2].map(|g| {
            let timed_out = timed_out.clone();
            scope.spawn(move || {
                let r = g.shrink().map(|s| s.size());
                let _ = timed_out.send(());
                r
            })
        });
        // World rank 3 is alive but calls only after the others gave up: too late.
        let latecomer = scope.spawn(move || {
            for _ in 0..2 {
                let _ = late.recv();
            }
            g3.shrink().map(|s| s.size())
        });
        let [w0, w2] = waiters.map(|w| w.join().unwrap());
        [w0, w2, latecomer.join().unwrap()]
    });
    for (r, outcome) in [0, 2, 3].into_iter().zip(&out) {
        match outcome {
            Err(CommError::Timeout {
                call,
                missing,
                group,
                ..
            }) => {
                assert_eq!(call, "shrink");
                assert_eq!(missing, &vec![3], "world rank {r}");
                assert_eq!(group, &vec![0, 1, 2, 3]);
            }
            other => panic!("world rank {r}: expected a shrink timeout, got {other:?}"),
        }
    }
    assert!(start.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_rank_leaving_during_the_shrink_unblocks_the_others() {
    let start = Instant::now();
    let out = ThreadWorld::new(4)
        .unwrap()
        .with_timeout(Duration::from_secs(60))
        .run(|g| {
            if g.rank() == 1 {
                // Leaves while the others already wait in the shrink.
                std::thread::sleep(Duration::from_millis(100));
                return None;
            }
            let shrunk = g.shrink().unwrap();
            Some((shrunk.rank(), shrunk.world_ranks().to_vec()))
        })
        .unwrap();
    assert_eq!(
        out,
        vec![
            Some((0, vec![0, 2, 3])),
            None,
            Some((1, vec![0, 2, 3])),
            Some((2, vec![0, 2, 3])),
        ]
    );
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn split_and_dedicated_work_on_a_shrunk_group() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .run(|g| {
            if g.rank() == 1 {
                return None;
            }
            let shrunk = g.shrink().unwrap();
            let me = shrunk.world_ranks()[shrunk.rank()];
            let half = shrunk.split((me % 2) as u64).unwrap();
            let half_sum = sum_of_world_ranks(&half).unwrap();
            let dedicated = shrunk.dedicated().unwrap();
            let dedicated_sum = sum_of_world_ranks(&dedicated).unwrap();
            Some((
                half.world_ranks().to_vec(),
                half_sum,
                dedicated.world_ranks().to_vec(),
                dedicated.rank(),
                dedicated_sum,
            ))
        })
        .unwrap();
    assert_eq!(out[1], None);
    assert_eq!(out[0], Some((vec![0, 2], 2.0, vec![0, 2, 3], 0, 5.0)));
    assert_eq!(out[2], Some((vec![0, 2], 2.0, vec![0, 2, 3], 1, 5.0)));
    assert_eq!(out[3], Some((vec![3], 3.0, vec![0, 2, 3], 2, 5.0)));
}

#[test]
fn run_each_returns_every_ranks_outcome() {
    let out = ThreadWorld::new(4).unwrap().run_each(|g| {
        if g.rank() == 2 {
            panic!("boom on rank 2");
        }
        g.rank() * 10
    });
    assert_eq!(
        out,
        vec![
            Ok(0),
            Ok(10),
            Err(WorkerPanicked {
                rank: 2,
                message: "boom on rank 2".into(),
            }),
            Ok(30),
        ]
    );
    // `run` reports the same panic and drops the other results.
    let err = ThreadWorld::new(4)
        .unwrap()
        .run(|g| {
            if g.rank() == 2 {
                panic!("boom on rank 2");
            }
        })
        .unwrap_err();
    assert_eq!(err.rank, 2);
}
