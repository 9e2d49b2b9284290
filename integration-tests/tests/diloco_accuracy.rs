//! DiLoCo with its default outer optimizer (Nesterov, lr 0.7, momentum 0.9) and rounds of 50
//! local steps, on the default `localsgd train` settings (2 thread workers, digits MLP, warmup
//! 50): it stays within one accuracy point of our own DDP while sending at least 8 times fewer
//! bytes (every 50th step instead of every step). Also with fp16 pseudo-gradients (fewer bytes
//! again) and as Streaming DiLoCo (2 fragments, a delay of 5 steps).

use localsgd_trainer::config::{AlgorithmKind, Compression, TrainConfig};
use localsgd_trainer::run::{load_data, train_threads};

/// (world-averaged test accuracy, bytes over all ranks).
fn run(seed: u64, tweak: impl Fn(&mut TrainConfig)) -> (f64, u64) {
    let mut cfg = TrainConfig {
        seed,
        progress: false,
        ..TrainConfig::default()
    };
    tweak(&mut cfg);
    let data = load_data(&cfg).unwrap();
    let results = train_threads(&cfg, &data, None, None).unwrap();
    let bytes = results.iter().map(|r| r.traffic.bytes).sum();
    (results[0].test_accuracy, bytes)
}

fn diloco(c: &mut TrainConfig) {
    c.algorithm = AlgorithmKind::Diloco;
    c.period = 50;
}

#[test]
fn diloco_every_50_steps_matches_ddp_with_a_fraction_of_the_bytes() {
    for seed in [0, 1] {
        let (ddp, ddp_bytes) = run(seed, |c| c.algorithm = AlgorithmKind::Ddp);
        let (plain, plain_bytes) = run(seed, diloco);
        let (fp16, fp16_bytes) = run(seed, |c| {
            diloco(c);
            c.outer_compression = Some(Compression::Fp16);
        });
        let (streamed, streamed_bytes) = run(seed, |c| {
            diloco(c);
            c.fragments = Some(2);
            c.fragment_sync_delay = Some(5);
        });
        eprintln!(
            "seed {seed}: ddp {ddp:.4} ({ddp_bytes} B), diloco {plain:.4} ({plain_bytes} B), \
             fp16 {fp16:.4} ({fp16_bytes} B), streaming {streamed:.4} ({streamed_bytes} B)"
        );
        for (name, acc, bytes) in [
            ("diloco", plain, plain_bytes),
            ("diloco fp16", fp16, fp16_bytes),
            ("streaming diloco", streamed, streamed_bytes),
        ] {
            assert!(
                acc >= ddp - 0.01,
                "seed {seed}: {name} reached {acc}, ddp {ddp}"
            );
            assert!(
                bytes * 8 <= ddp_bytes,
                "seed {seed}: {name} sent {bytes} bytes, ddp {ddp_bytes}"
            );
        }
        assert!(fp16_bytes < plain_bytes, "fp16 sends fewer bytes");
    }
}
