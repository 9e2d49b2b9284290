//! Correctness of all-reduce, broadcast, all-gather and barrier on the thread backend, for many
//! lengths and worker counts, and vectors V1 and V2 (the book's semantics §10).

use localsgd_comm::{CommError, GroupExt, ReduceOp, ThreadWorld};

const LENGTHS: [usize; 5] = [0, 1, 7, 1001, 1 << 20];

/// Value rank `r` holds at index `i`: small integers, so every sum is exact in f32.
fn value(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 13) % 17) as f32 - 8.0
}

#[test]
fn all_reduce_every_op_length_and_worker_count() {
    for workers in 1..=8 {
        for &len in &LENGTHS {
            if len == 1 << 20 && workers > 4 {
                continue; // the big case at 1..=4 workers keeps the test quick on 2 cores
            }
            let results = ThreadWorld::new(workers)
                .unwrap()
                .run(|g| {
                    let mut out = Vec::new();
                    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
                        let mut v: Vec<f32> = (0..len).map(|i| value(g.rank(), i)).collect();
                        g.all_reduce_slice(&mut v, op).unwrap();
                        out.push(v);
                    }
                    out
                })
                .unwrap();
            for (rank, per_op) in results.iter().enumerate() {
                for (k, v) in per_op.iter().enumerate() {
                    assert_eq!(v.len(), len);
                    for (i, &got) in v.iter().enumerate().step_by(97) {
                        let vals: Vec<f32> = (0..workers).map(|r| value(r, i)).collect();
                        let sum: f32 = vals.iter().sum();
                        let want = match k {
                            0 => sum,
                            1 => sum / workers as f32,
                            2 => vals.iter().cloned().fold(f32::MIN, f32::max),
                            _ => vals.iter().cloned().fold(f32::MAX, f32::min),
                        };
                        assert_eq!(
                            got, want,
                            "workers {workers} len {len} op {k} rank {rank} i {i}"
                        );
                    }
                }
            }
            // Every rank ends with bit-identical buffers.
            for r in 1..workers {
                assert_eq!(results[r], results[0]);
            }
        }
    }
}

#[test]
fn all_reduce_f64_and_half() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|g| {
            let mut d = vec![g.rank() as f64 + 0.1; 5];
            g.average_slice(&mut d).unwrap();
            let mut h = vec![half::f16::from_f64(g.rank() as f64 + 0.1); 3];
            g.average_slice(&mut h).unwrap();
            (d[0], h[0].to_f64())
        })
        .unwrap();
    for (d, h) in out {
        // Semantics V3: f64 -> 1.6; f16 -> 1.599609375 (divide-then-sum rounding).
        assert!((d - 1.6).abs() < 1e-12, "{d}");
        assert_eq!(h, 1.599609375);
    }
}

#[test]
fn broadcast_from_every_root() {
    for workers in 1..=8 {
        for &len in &LENGTHS[..4] {
            for root in 0..workers {
                let out = ThreadWorld::new(workers)
                    .unwrap()
                    .run(|g| {
                        let mut v: Vec<f64> =
                            (0..len).map(|i| (g.rank() * 1000 + i) as f64).collect();
                        g.broadcast_slice(&mut v, root).unwrap();
                        v
                    })
                    .unwrap();
                let want: Vec<f64> = (0..len).map(|i| (root * 1000 + i) as f64).collect();
                assert!(
                    out.iter().all(|v| *v == want),
                    "workers {workers} len {len} root {root}"
                );
            }
        }
    }
    let big = ThreadWorld::new(3)
        .unwrap()
        .run(|g| {
            let mut v = vec![g.rank() as f32; 1 << 20];
            g.broadcast_slice(&mut v, 2).unwrap();
            v.iter().all(|&x| x == 2.0)
        })
        .unwrap();
    assert_eq!(big, vec![true; 3]);
}

#[test]
fn broadcast_root_out_of_range_is_an_error() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| g.broadcast_slice(&mut [0f32; 2], 5))
        .unwrap();
    for r in out {
        assert_eq!(r, Err(CommError::InvalidRoot { root: 5, size: 2 }));
    }
}

#[test]
fn all_gather_and_barrier() {
    let out = ThreadWorld::new(5)
        .unwrap()
        .run(|g| {
            g.barrier().unwrap();
            g.all_gather_u64(&[g.rank() as u64, 10 + g.rank() as u64])
                .unwrap()
        })
        .unwrap();
    for v in out {
        assert_eq!(v, vec![0, 10, 1, 11, 2, 12, 3, 13, 4, 14]);
    }
}

#[test]
fn spec_v1_world_average_of_ones() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|g| {
            let mut v = vec![1.0f32; 10];
            g.average_slice(&mut v).unwrap();
            v
        })
        .unwrap();
    assert!(out.iter().flatten().all(|&x| x == 1.0));
}

#[test]
fn spec_v2_average_over_pair_leaves_others_unchanged() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|g| {
            // Group {0,1}: ranks 2 and 3 land in the other color and do not average.
            let sub = g.split(if g.rank() < 2 { 0 } else { 1 }).unwrap();
            let mut v = vec![g.rank() as f32; 3];
            if g.rank() < 2 {
                sub.average_slice(&mut v).unwrap();
            }
            v[0]
        })
        .unwrap();
    assert_eq!(out, vec![0.5, 0.5, 2.0, 3.0]);
}

#[test]
fn traffic_counts_collectives_and_bytes_including_subgroups() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let mut v = vec![0f32; 100];
            g.all_reduce_slice(&mut v, ReduceOp::Sum).unwrap();
            let mut d = vec![0f64; 10];
            g.broadcast_slice(&mut d, 0).unwrap();
            let before_split = g.traffic();
            let sub = g.new_subgroups(1).unwrap();
            sub.all_reduce_slice(&mut v, ReduceOp::Sum).unwrap();
            (before_split, sub.traffic(), g.traffic())
        })
        .unwrap();
    for (before, sub, world) in out {
        assert_eq!(before.collectives, 2);
        assert_eq!(before.bytes, 400 + 80);
        assert_eq!(sub.collectives, 1);
        assert_eq!(sub.bytes, 400);
        // split (1 all-gather of one u64) + the subgroup's all-reduce are charged to the world.
        assert_eq!(world.collectives, 4);
        assert_eq!(world.bytes, 480 + 8 + 400);
    }
}

/// More workers than the machine has threads for is an error naming the limit, not an abort
/// inside the allocator when the threads start.
#[test]
fn a_thread_world_larger_than_the_machine_allows_is_refused() {
    let max = ThreadWorld::max_workers();
    assert!(max >= 1);
    let Err(err) = ThreadWorld::new(max + 1) else {
        panic!("{} workers were accepted", max + 1);
    };
    assert!(
        err.to_string().contains(&format!("allows about {max}")),
        "{err}"
    );
}

#[test]
fn broadcast_bytes_hands_any_length_over_bit_for_bit() {
    // Lengths around the 8-byte packing, and bytes that are NaN patterns as f64 words
    // (0xff..: a signaling-NaN-like word must arrive unchanged).
    for len in [0usize, 1, 7, 8, 9, 13, 64, 1001] {
        let sent: Vec<u8> = (0..len)
            .map(|i| {
                if i % 5 == 0 {
                    0xff
                } else {
                    (i * 37 % 251) as u8
                }
            })
            .collect();
        let out = ThreadWorld::new(3)
            .unwrap()
            .run(|g| {
                let mut bytes = if g.rank() == 1 {
                    sent.clone()
                } else {
                    vec![0xaa; 5]
                };
                g.broadcast_bytes(&mut bytes, 1).map(|_| bytes)
            })
            .unwrap();
        for got in out {
            assert_eq!(got.unwrap(), sent, "length {len}");
        }
    }
}
