//! fp16 / bf16 compression around a hook: the collective runs in half precision (half the
//! bytes), the result comes back in the bucket's original type, within half-precision tolerance.

use half::bf16;
use localsgd_comm::{Group, ThreadWorld};
use localsgd_hooks::{AllReduceHook, BucketData, CommHook, CompressHook, GradBucket};

fn run_compressed(fp16: bool, data: impl Fn(usize) -> BucketData + Sync) -> Vec<(BucketData, u64)> {
    ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| {
            let inner: Box<dyn CommHook> = Box::new(AllReduceHook::new(world.clone()));
            let mut hook = if fp16 {
                CompressHook::fp16(inner)
            } else {
                CompressHook::bf16(inner)
            };
            let mut bucket = GradBucket::new(0, true, data(world.rank()));
            let before = world.traffic();
            hook.run(&mut bucket).unwrap();
            (bucket.into_data(), (world.traffic() - before).bytes)
        })
        .unwrap()
}

#[test]
fn fp16_matches_spec_v3_rounding_and_keeps_the_type() {
    // V3: ws 4, value rank + 0.1 averaged in f16 (divide, then sum) -> 1.599609375.
    let out = run_compressed(true, |r| BucketData::F32(vec![r as f32 + 0.1; 5]));
    for (data, bytes) in out {
        assert_eq!(data, BucketData::F32(vec![1.599_609_4; 5]));
        assert_eq!(bytes, 5 * 2, "the all-reduce carries f16 elements");
    }
    let out = run_compressed(true, |r| BucketData::F64(vec![r as f64 + 0.1; 3]));
    for (data, _) in out {
        assert_eq!(data, BucketData::F64(vec![1.599609375; 3]));
    }
}

fn ragged(rank: usize, i: usize) -> f64 {
    ((i as f64) * 0.37).sin() * (rank as f64 + 1.0) * 3.0 + 0.01 * i as f64
}

#[test]
fn fp16_and_bf16_stay_within_half_precision_tolerance() {
    let n = 257;
    let exact: Vec<f64> = (0..n)
        .map(|i| (0..4).map(|r| ragged(r, i) as f32 as f64).sum::<f64>() / 4.0)
        .collect();
    // Relative precision: fp16 has 11 significant bits, bf16 8. Each input is rounded once,
    // divided and summed with a rounding per operation: allow a few ulps of the largest input
    // magnitude (|ragged| <= 12 + 2.6).
    for (fp16, ulp) in [(true, 2f64.powi(-11)), (false, 2f64.powi(-8))] {
        let out = run_compressed(fp16, |r| {
            BucketData::F32((0..n).map(|i| ragged(r, i) as f32).collect())
        });
        for (data, bytes) in out {
            assert_eq!(bytes, n as u64 * 2);
            let BucketData::F32(v) = data else {
                panic!("type changed: {data:?}")
            };
            for (i, (&got, want)) in v.iter().zip(&exact).enumerate() {
                let tol = 6.0 * ulp * 16.0;
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "fp16={fp16} element {i}: {got} vs {want} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn bf16_result_is_a_bf16_value_and_handles_fp16_overflow_range() {
    // 1e5 overflows fp16 (max 65504) but not bf16.
    let out = run_compressed(false, |r| BucketData::F32(vec![1e5 * (r as f32 + 1.0); 2]));
    for (data, _) in out {
        let BucketData::F32(v) = data else {
            panic!("type changed")
        };
        for x in v {
            assert_eq!(bf16::from_f32(x).to_f32(), x, "{x} is not a bf16 value");
            assert!((x - 2.5e5).abs() <= 2.5e5 * 2f32.powi(-7), "{x}");
        }
    }
    let out = run_compressed(true, |r| BucketData::F32(vec![1e5 * (r as f32 + 1.0); 2]));
    for (data, _) in out {
        assert_eq!(
            data,
            BucketData::F32(vec![f32::INFINITY; 2]),
            "fp16 overflows like PyTorch's"
        );
    }
}
