//! DiLoCo with its default outer optimizer (Nesterov, lr 0.7, momentum 0.9) and rounds of
//! H = 50 local steps from the first step (no warmup), against our own DDP with the same inner
//! optimizer (SGD, lr 0.1, momentum 0.9), 2 thread workers, the digits MLP, 60 epochs (1,380
//! iterations): test accuracy over three seeds within one point of DDP's on average, and no
//! seed more than 2.5 points behind, with at least 40 times fewer bytes on the wire, both from
//! the same runs; also with fp16 pseudo-gradients. (At 30 epochs seed 1's DiLoCo was 2.2 points
//! behind DDP: 13 outer steps are too few; with 27 they are enough.)
//!
//! The test set has 360 images, so one image is 0.28 points, and the same code rounds
//! differently on different CPUs (burn's kernels pick their SIMD path at run time). Every seed
//! was within one point of DDP on the Intel machines this test was written on; on an AMD EPYC
//! machine seed 0's DiLoCo read 0.9000 against DDP's 0.9167 (6 images) and seed 2's fp16 run
//! 0.9028 against 0.9139 (4 images), while the three-seed means stayed 0.37 and 0.28 points
//! apart. A broken outer step costs far more than that (the book's Outer optimizers chapter).

use localsgd_trainer::config::{AlgorithmKind, Compression, TrainConfig};
use localsgd_trainer::run::{load_data, train_threads};

/// (world-averaged test accuracy, bytes over all ranks).
fn run(seed: u64, tweak: impl Fn(&mut TrainConfig)) -> (f64, u64) {
    let mut cfg = TrainConfig {
        seed,
        epochs: 60,
        progress: false,
        ..TrainConfig::default()
    };
    tweak(&mut cfg);
    let data = load_data(&cfg).unwrap();
    let results = train_threads(&cfg, &data, None, None).unwrap();
    let bytes = results[0].totals.bytes;
    (results[0].result.test_accuracy, bytes)
}

fn diloco(c: &mut TrainConfig) {
    c.algorithm = AlgorithmKind::Diloco;
    c.period = Some(50);
    c.warmup = 0;
}

#[test]
fn diloco_every_50_steps_matches_ddp_with_40_times_fewer_bytes() {
    let seeds = [0, 1, 2];
    // Sums of test accuracy over the seeds: DDP, DiLoCo, DiLoCo with fp16.
    let mut sums = [0.0f64; 3];
    for seed in seeds {
        let (ddp, ddp_bytes) = run(seed, |c| c.algorithm = AlgorithmKind::Ddp);
        let (plain, plain_bytes) = run(seed, diloco);
        let (fp16, fp16_bytes) = run(seed, |c| {
            diloco(c);
            c.outer_compression = Some(Compression::Fp16);
        });
        eprintln!(
            "seed {seed}: ddp {ddp:.4} ({ddp_bytes} B), diloco {plain:.4} ({plain_bytes} B, \
             {:.1}x fewer), fp16 {fp16:.4} ({fp16_bytes} B, {:.1}x fewer)",
            ddp_bytes as f64 / plain_bytes as f64,
            ddp_bytes as f64 / fp16_bytes as f64
        );
        for (name, acc, bytes) in [
            ("diloco", plain, plain_bytes),
            ("diloco fp16", fp16, fp16_bytes),
        ] {
            assert!(
                acc >= ddp - 0.025,
                "seed {seed}: {name} reached {acc}, ddp {ddp}"
            );
            assert!(
                bytes * 40 <= ddp_bytes,
                "seed {seed}: {name} sent {bytes} bytes, ddp {ddp_bytes}"
            );
        }
        assert!(fp16_bytes < plain_bytes, "fp16 sends fewer bytes");
        for (sum, acc) in sums.iter_mut().zip([ddp, plain, fp16]) {
            *sum += acc;
        }
    }
    let mean = sums.map(|s| s / seeds.len() as f64);
    for (name, acc) in [("diloco", mean[1]), ("diloco fp16", mean[2])] {
        assert!(
            acc >= mean[0] - 0.01,
            "mean over seeds: {name} reached {acc}, ddp {}",
            mean[0]
        );
    }
}
