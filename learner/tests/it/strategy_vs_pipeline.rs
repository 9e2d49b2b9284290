//! The strategy inside burn-train's `SupervisedTraining` trains exactly as the localsgd
//! `Pipeline` does on the same data, initial weights and settings: rank 0's final parameters
//! are bit-identical after 2 epochs of DDP and of post-local SGD (warmup 10, period 4) on 2
//! thread ranks; and with burn-train's gradient accumulation of 2 micro-batches, which sums the
//! gradients where the pipeline (as PyTorch) averages them: at half the learning rate the runs
//! are the same to the bit (scaling by 2 is exact in floating point, SGD with momentum is
//! linear in the gradient).

use crate::common;

use std::sync::Arc;

use common::*;
use localsgd_learner::{AlgorithmKind, LocalSgdStrategy};
use localsgd_learner::{AlgorithmSpec, StrategyConfig};

fn check(config: StrategyConfig) {
    let dir = tempfile::tempdir().unwrap();
    let strategy = Arc::new(LocalSgdStrategy::new(config.clone(), device()).unwrap());
    let result = run_with_strategy(dir.path(), strategy.clone(), 2, LR);
    let pipeline = run_pipeline(&config, 2);
    let initial = params(&Net::new(&device()));
    // Every rank's own model is the pipeline's, to the bit.
    let own: Vec<Vec<f32>> = strategy
        .rank_models::<Net>()
        .expect("the ranks' models")
        .iter()
        .map(params)
        .collect();
    assert_eq!(own.len(), pipeline.ranks.len());
    for (rank, (ours, theirs)) in own.iter().zip(&pipeline.ranks).enumerate() {
        assert_ne!(*ours, initial, "rank {rank} did not train");
        assert_eq!(ours, theirs, "rank {rank}, {:?}", config.algorithm.kind);
    }
    // The model `fit` returns is the world average (DDP: the replicas, all equal).
    let returned = params(&result.model);
    match config.algorithm.kind {
        AlgorithmKind::Ddp => assert_eq!(returned, pipeline.ranks[0]),
        _ => assert_eq!(returned, pipeline.averaged, "{:?}", config.algorithm.kind),
    }
    // Traffic is reported for every rank, and equals the pipeline's schedule: every rank sent
    // something, the same amount (the ranks run the same collectives).
    let report = strategy.report().expect("a report");
    assert_eq!(report.ranks.len(), config.workers);
    assert!(
        report
            .ranks
            .iter()
            .all(|r| r.traffic.bytes > 0 && r.iterations > 0)
    );
    assert!(
        report
            .ranks
            .windows(2)
            .all(|w| w[0].traffic == w[1].traffic)
    );
}

#[test]
fn ddp_equals_the_pipeline() {
    check(StrategyConfig::default());
}

#[test]
fn post_local_sgd_equals_the_pipeline() {
    check(StrategyConfig::new(AlgorithmSpec::post_local_sgd(10, 4)));
}

#[test]
fn accumulation_of_two_micro_batches_equals_the_pipeline_at_half_the_rate() {
    let config = StrategyConfig::new(AlgorithmSpec::post_local_sgd(6, 2));
    let dir = tempfile::tempdir().unwrap();
    let result = run_strategy_with_lr(dir.path(), config.clone(), 2, None, LR / 2.0, |t| {
        t.grads_accumulation(2)
    });
    assert!(result.error.is_none(), "{:?}", result.error);
    let ours = params(&result.model);
    assert_ne!(ours, params(&Net::new(&device())));
    assert_eq!(ours, run_pipeline_accumulating(&config, 2, 2).averaged);
}

#[test]
fn local_sgd_equals_the_pipeline() {
    check(StrategyConfig::new(AlgorithmSpec::local_sgd(3)));
}

#[test]
fn hierarchical_averaging_equals_the_pipeline() {
    check(
        StrategyConfig::new(AlgorithmSpec::hierarchical(4, "2:2,4:4".parse().unwrap()))
            .with_workers(4),
    );
}

#[test]
fn diloco_equals_the_pipeline() {
    check(StrategyConfig::new(AlgorithmSpec::diloco(8).with_warmup(2)));
}

#[test]
fn streaming_diloco_equals_the_pipeline() {
    check(StrategyConfig::new(AlgorithmSpec::streaming_diloco(8, 2)));
}

/// fairscale's two frequencies: plain averages every 2 steps, the slow step every 6.
#[test]
fn slowmo_equals_the_pipeline() {
    check(StrategyConfig::new(AlgorithmSpec::slowmo(2, 6)));
}

#[test]
fn overlapped_averaging_and_compression_equal_the_pipeline() {
    let mut spec = AlgorithmSpec::post_local_sgd(6, 4);
    spec.overlap = 2;
    spec.compression = localsgd_pipeline::settings::GradientCompression::Bf16;
    check(StrategyConfig::new(spec));
}
