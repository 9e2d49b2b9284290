//! DiLoCo with its default outer optimizer (Nesterov, lr 0.7, momentum 0.9) and rounds of
//! H = 50 local steps from the first step (no warmup), against our own DDP with the same inner
//! optimizer (SGD, lr 0.1, momentum 0.9), 2 thread workers, the digits MLP, 60 epochs (1,380
//! iterations): test accuracy within one point of DDP's, with at least 40 times fewer bytes on
//! the wire, both from the same runs; also with fp16 pseudo-gradients. (At 30 epochs seed 1's
//! DiLoCo was 2.2 points behind DDP: 13 outer steps are too few; with 27 they are enough.)

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
    c.period = 50;
    c.warmup = 0;
}

#[test]
fn diloco_every_50_steps_matches_ddp_with_40_times_fewer_bytes() {
    for seed in [0, 1, 2] {
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
                acc >= ddp - 0.01,
                "seed {seed}: {name} reached {acc}, ddp {ddp}"
            );
            assert!(
                bytes * 40 <= ddp_bytes,
                "seed {seed}: {name} sent {bytes} bytes, ddp {ddp_bytes}"
            );
        }
        assert!(fp16_bytes < plain_bytes, "fp16 sends fewer bytes");
    }
}
