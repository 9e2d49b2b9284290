//! `all_gather_bytes` (and `AsyncGroup::start_all_gather_bytes`) on the thread backend: results
//! for 1 to 4 ranks and lengths 0 to 1 MiB, mismatched lengths, a wrong output length, traffic.

use localsgd_comm::{AsyncGroup, CallSignature, CommError, GroupExt, ReduceOp, ThreadWorld};

/// Byte `i` of rank `r`'s message: differs between ranks at every index and along the message.
fn byte(r: usize, i: usize) -> u8 {
    (r * 97 + i * 31 + i / 256) as u8
}

fn message(r: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte(r, i)).collect()
}

fn gathered(size: usize, len: usize) -> Vec<u8> {
    (0..size).flat_map(|r| message(r, len)).collect()
}

#[test]
fn every_rank_gets_every_message_in_rank_order() {
    for workers in 1..=4 {
        for len in [0, 1, 1000, 1 << 20] {
            let out = ThreadWorld::new(workers)
                .unwrap()
                .run(|g| {
                    let local = message(g.rank(), len);
                    let mut out = vec![0xAAu8; g.size() * len];
                    g.all_gather_bytes(&local, &mut out).map(|()| out)
                })
                .unwrap();
            let want = gathered(workers, len);
            for (rank, got) in out.into_iter().enumerate() {
                let got = got.unwrap_or_else(|e| panic!("workers {workers} len {len}: {e}"));
                assert!(
                    got == want,
                    "workers {workers} len {len} rank {rank}: wrong bytes"
                );
            }
        }
    }
}

#[test]
fn different_lengths_are_a_mismatch_on_every_rank() {
    let out = ThreadWorld::new(3)
        .unwrap()
        .run(|g| {
            let len = if g.rank() == 1 { 4 } else { 3 };
            let mut out = vec![0u8; g.size() * len];
            let r = g.all_gather_bytes(&message(g.rank(), len), &mut out);
            // The group still works afterwards.
            let mut after = vec![0u8; g.size() * 2];
            let ok = g.all_gather_bytes(&message(g.rank(), 2), &mut after);
            (r, ok.map(|()| after))
        })
        .unwrap();
    for (r, after) in out {
        match r {
            Err(CommError::Mismatch { calls, group }) => {
                assert_eq!(group, vec![0, 1, 2]);
                let want = [
                    "all_gather_bytes(u8 x 3)",
                    "all_gather_bytes(u8 x 4)",
                    "all_gather_bytes(u8 x 3)",
                ];
                for (r, call) in calls.iter().enumerate() {
                    assert_eq!(call, &(r, want[r].to_string()));
                }
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
        assert_eq!(after, Ok(gathered(3, 2)));
    }
}

#[test]
fn a_gather_and_another_collective_are_a_mismatch() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            if g.rank() == 0 {
                let mut out = vec![0u8; 2 * 8];
                g.all_gather_bytes(&[0u8; 8], &mut out).map(|_| ())
            } else {
                g.all_gather_u64(&[0]).map(|_| ())
            }
        })
        .unwrap();
    for r in out {
        assert!(
            matches!(&r, Err(CommError::Mismatch { calls, .. })
                if calls[0].1 == "all_gather_bytes(u8 x 8)" && calls[1].1 == "all_gather(u64 x 1)"),
            "{r:?}"
        );
    }
}

#[test]
fn a_wrong_output_length_is_refused_before_communicating() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|g| {
            let before = g.traffic();
            // Every rank passes room for 3 ranks' 10 bytes on a group of 4: nobody communicates.
            let mut short = vec![0u8; 30];
            let e = g.all_gather_bytes(&[1u8; 10], &mut short);
            let mut long = vec![0u8; 41];
            let e2 = g.all_gather_bytes(&[1u8; 10], &mut long);
            let charged = g.traffic() - before;
            // No rank entered the collective: the next one lines up on every rank.
            let flag = g.all_true(true);
            (e, e2, charged, flag)
        })
        .unwrap();
    for (e, e2, charged, flag) in out {
        assert_eq!(
            e,
            Err(CommError::OutputLength {
                call: "all_gather_bytes(u8 x 10) on 4 ranks".into(),
                expected: 40,
                actual: 30,
            })
        );
        let text = e.unwrap_err().to_string();
        assert!(text.contains("40") && text.contains("30"), "{text}");
        assert!(
            matches!(
                e2,
                Err(CommError::OutputLength {
                    expected: 40,
                    actual: 41,
                    ..
                })
            ),
            "{e2:?}"
        );
        assert_eq!(charged.collectives, 0);
        assert_eq!(flag, Ok(true));
    }
}

#[test]
fn traffic_counts_the_bytes_each_rank_contributes_as_data() {
    let out = ThreadWorld::new(3)
        .unwrap()
        .run(|g| {
            let before = g.traffic();
            let mut out = vec![0u8; 3 * 1000];
            g.all_gather_bytes(&message(g.rank(), 1000), &mut out)
                .unwrap();
            let world = g.traffic() - before;
            // A subgroup's gather is charged to its parent too.
            let sub = g.split(0).unwrap();
            let (w0, s0) = (g.traffic(), sub.traffic());
            let mut out = vec![0u8; 3 * 5];
            sub.all_gather_bytes(&[7u8; 5], &mut out).unwrap();
            (world, g.traffic() - w0, sub.traffic() - s0)
        })
        .unwrap();
    for (world, parent, sub) in out {
        assert_eq!(
            (world.collectives, world.bytes, world.data_bytes),
            (1, 1000, 1000)
        );
        assert_eq!((sub.collectives, sub.bytes, sub.data_bytes), (1, 5, 5));
        assert_eq!(parent, sub);
    }
}

#[test]
fn the_signature_counts_bytes() {
    let sig = CallSignature::all_gather_bytes(1000);
    assert_eq!(sig.payload_bytes(), 1000);
    assert_eq!(sig.to_string(), "all_gather_bytes(u8 x 1000)");
    assert_eq!(CallSignature::decode(sig.encode()), Some(sig));
}

#[test]
fn async_gather_overlaps_and_is_charged_at_start() {
    for workers in [1, 2, 4] {
        let out = ThreadWorld::new(workers)
            .unwrap()
            .run(|g| {
                let mut side = AsyncGroup::new(g.clone()).unwrap();
                let before = g.traffic();
                let big = side
                    .start_all_gather_bytes(message(g.rank(), 1 << 20))
                    .unwrap();
                let charged = g.traffic() - before;
                let sig = big.signature();
                let sum = side
                    .start_all_reduce(vec![g.rank() as f32], ReduceOp::Sum)
                    .unwrap();
                let empty = side.start_all_gather_bytes(Vec::new()).unwrap();
                // The group keeps working while they are pending.
                let flag = g.all_true(true).unwrap();
                let empty = empty.wait().unwrap();
                let sum = sum.wait().unwrap();
                let big = big.wait().unwrap();
                side.close().unwrap();
                (charged, sig, flag, big, sum, empty)
            })
            .unwrap();
        let want = gathered(workers, 1 << 20);
        for (charged, sig, flag, big, sum, empty) in out {
            assert_eq!(
                (charged.collectives, charged.bytes, charged.data_bytes),
                (1, 1 << 20, 1 << 20)
            );
            assert_eq!(sig, CallSignature::all_gather_bytes(1 << 20));
            assert!(flag);
            assert!(big == want, "{workers} workers: wrong bytes");
            assert_eq!(sum, vec![(workers * (workers - 1) / 2) as f32]);
            assert!(empty.is_empty());
        }
    }
}

#[test]
fn async_gather_of_different_lengths_is_a_mismatch_on_wait() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut side = AsyncGroup::new(g.clone()).unwrap();
            let p = side
                .start_all_gather_bytes(vec![1u8; 3 + g.rank()])
                .unwrap();
            let r = p.wait();
            side.close().unwrap();
            r
        })
        .unwrap();
    for r in out {
        assert!(
            matches!(&r, Err(CommError::Mismatch { calls, .. })
                if calls[0].1 == "all_gather_bytes(u8 x 3)" && calls[1].1 == "all_gather_bytes(u8 x 4)"),
            "{r:?}"
        );
    }
}
