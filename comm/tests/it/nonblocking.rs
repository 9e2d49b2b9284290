//! Non-blocking collectives (`AsyncGroup`, `Pending`) on the threads backend: results, overlap
//! with blocking collectives on the original group, mismatch and failure errors, the
//! completion rule and traffic accounting.

use localsgd_comm::{AsyncGroup, CommError, GroupExt, ReduceOp, ThreadWorld};
use std::time::Duration;

#[test]
fn results_come_back_in_the_same_buffer_in_start_order() {
    let out = ThreadWorld::new(3)
        .unwrap()
        .run(|g| {
            let mut side = AsyncGroup::new(g.clone()).unwrap();
            let r = g.rank() as f64;
            let a = side.start_all_reduce(vec![r, 1.0], ReduceOp::Sum).unwrap();
            let b = side.start_all_reduce(vec![r * 2.0], ReduceOp::Max).unwrap();
            let c = side.start_average(vec![3.0f32 * (r as f32 + 1.0)]).unwrap();
            // Completed out of start order: completion does not communicate.
            let c = c.wait().unwrap();
            let b = b.wait().unwrap();
            let a = a.wait().unwrap();
            side.close().unwrap();
            (a, b, c)
        })
        .unwrap();
    for (a, b, c) in out {
        assert_eq!(a, vec![3.0, 3.0]);
        assert_eq!(b, vec![4.0]);
        // (3 + 6 + 9) / 3, divided first: 1 + 2 + 3.
        assert_eq!(c, vec![6.0]);
    }
}

#[test]
fn blocking_collectives_on_the_group_run_while_one_is_pending() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut side = AsyncGroup::new(g.clone()).unwrap();
            let mut pending = side
                .start_all_reduce(vec![1.0f32; 1 << 16], ReduceOp::Sum)
                .unwrap();
            // The world group keeps working: several blocking collectives in between.
            let mut flags = Vec::new();
            for i in 0..5 {
                flags.push(g.all_true(i % 2 == 0).unwrap());
                let _ = pending.test();
            }
            let v = pending.wait().unwrap();
            side.close().unwrap();
            (flags, v[0], v[v.len() - 1])
        })
        .unwrap();
    for (flags, first, last) in out {
        assert_eq!(flags, vec![true, false, true, false, true]);
        assert_eq!((first, last), (2.0, 2.0));
    }
}

#[test]
fn test_reports_completion_without_blocking() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut side = AsyncGroup::new(g.clone()).unwrap();
            let mut p = side.start_all_reduce(vec![1.0f32], ReduceOp::Sum).unwrap();
            // Both ranks eventually see it complete without waiting.
            let mut done = false;
            for _ in 0..10_000 {
                if p.test() {
                    done = true;
                    break;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            let v = p.wait().unwrap();
            side.close().unwrap();
            (done, v)
        })
        .unwrap();
    for (done, v) in out {
        assert!(done);
        assert_eq!(v, vec![2.0]);
    }
}

#[test]
fn disagreeing_ranks_get_a_mismatch_error_on_wait() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut side = AsyncGroup::new(g.clone()).unwrap();
            let len = 3 + g.rank();
            let p = side
                .start_all_reduce(vec![0.0f32; len], ReduceOp::Sum)
                .unwrap();
            let e = p.wait();
            side.close().unwrap();
            e
        })
        .unwrap();
    for r in out {
        match r {
            Err(CommError::Mismatch { calls, .. }) => {
                assert!(calls[0].1.contains('3'), "{calls:?}");
                assert!(calls[1].1.contains('4'), "{calls:?}");
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }
}

#[test]
fn a_rank_that_never_starts_it_is_named_by_a_timeout_not_a_hang() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .with_timeout(Duration::from_millis(300))
        .run(|g| {
            let mut side = AsyncGroup::new(g.clone()).unwrap();
            let r = if g.rank() == 0 {
                let p = side.start_all_reduce(vec![1.0f32], ReduceOp::Sum).unwrap();
                Some(p.wait())
            } else {
                None
            };
            // Rank 1 keeps its side group alive past rank 0's timeout, then closes it.
            std::thread::sleep(Duration::from_millis(600));
            let _ = side.close();
            r
        })
        .unwrap();
    match &out[0] {
        Some(Err(CommError::Timeout { missing, .. })) => assert_eq!(missing, &vec![1]),
        other => panic!("expected a timeout naming rank 1, got {other:?}"),
    }
}

#[test]
fn closing_with_a_collective_never_waited_for_is_an_error() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut side = AsyncGroup::new(g.clone()).unwrap();
            let waited = side.start_all_reduce(vec![1.0f32], ReduceOp::Sum).unwrap();
            let dropped = side.start_all_reduce(vec![2.0f32], ReduceOp::Sum).unwrap();
            waited.wait().unwrap();
            drop(dropped);
            side.close()
        })
        .unwrap();
    for r in out {
        assert_eq!(
            r,
            Err(CommError::LeftPending {
                count: 1,
                started: 2
            })
        );
    }
}

#[test]
fn traffic_is_charged_to_the_group_when_started() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut side = AsyncGroup::new(g.clone()).unwrap();
            let before = g.traffic();
            let p = side
                .start_all_reduce(vec![0.0f32; 25], ReduceOp::Sum)
                .unwrap();
            // Charged on the starting thread at once, whatever the helper is doing.
            let started = g.traffic() - before;
            p.wait().unwrap();
            let waited = g.traffic() - before;
            side.close().unwrap();
            (started, waited)
        })
        .unwrap();
    for (started, waited) in out {
        assert_eq!(
            (started.collectives, started.bytes, started.data_bytes),
            (1, 100, 100)
        );
        assert_eq!(waited, started);
    }
}
