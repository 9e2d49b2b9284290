//! The strategy inside burn-train's `SupervisedTraining` trains exactly as the localsgd
//! `Pipeline` does on the same data, initial weights and settings: rank 0's final parameters
//! are bit-identical after 2 epochs of DDP and of post-local SGD (warmup 10, period 4) on 2
//! thread ranks; and with burn-train's gradient accumulation of 2 micro-batches, which sums the
//! gradients where the pipeline (as PyTorch) averages them: at half the learning rate the runs
//! are the same to the bit (scaling by 2 is exact in floating point, SGD with momentum is
//! linear in the gradient).

use crate::common;

use common::*;
use localsgd_learner::StrategyConfig;

fn check(config: StrategyConfig) {
    let dir = tempfile::tempdir().unwrap();
    let result = run_strategy(dir.path(), config.clone(), 2, None, |t| t);
    assert!(result.error.is_none(), "{:?}", result.error);
    let ours = params(&result.model);
    let pipeline = run_pipeline(&config, 2);
    assert_eq!(ours.len(), pipeline.len());
    let initial = params(&Net::new(&device()));
    assert_ne!(ours, initial, "the strategy did not train");
    assert_eq!(ours, pipeline, "{:?}", config.algorithm);
}

#[test]
fn ddp_equals_the_pipeline() {
    check(StrategyConfig::default());
}

#[test]
fn post_local_sgd_equals_the_pipeline() {
    check(StrategyConfig::post_local_sgd(10, 4));
}

#[test]
fn accumulation_of_two_micro_batches_equals_the_pipeline_at_half_the_rate() {
    let config = StrategyConfig::post_local_sgd(6, 2);
    let dir = tempfile::tempdir().unwrap();
    let result = run_strategy_with_lr(dir.path(), config.clone(), 2, None, LR / 2.0, |t| {
        t.grads_accumulation(2)
    });
    assert!(result.error.is_none(), "{:?}", result.error);
    let ours = params(&result.model);
    assert_ne!(ours, params(&Net::new(&device())));
    assert_eq!(ours, run_pipeline_accumulating(&config, 2, 2));
}
