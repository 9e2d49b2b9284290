//! Resume and stopping through `SupervisedTraining` with the strategy (2 thread ranks, 23
//! optimizer steps per epoch): a run stopped by early stopping after epoch 2 and resumed from
//! burn-train's checkpoint 2 ends with the parameters of the uninterrupted 3-epoch run, to the
//! bit, for post-local SGD (warmup 10, period 4) and every algorithm with state of its own
//! (DiLoCo's `θ` and outer momentum, Streaming DiLoCo's fragments, an overlapped average in
//! flight, SlowMo's slow momentum; ranks whose replicas differ between averages resume from
//! their own checkpoints); early stopping after epoch 1 stops every rank there (the
//! parameters of a 1-epoch run); an interrupter stop mid-run returns promptly on all ranks.

use crate::common;

use std::time::{Duration, Instant};

use burn_train::EarlyStoppingStrategy;
use burn_train::metric::store::EventStoreClient;
use common::*;
use localsgd_learner::{AlgorithmSpec, StrategyConfig};

/// Stops after the given epoch.
#[derive(Clone)]
struct StopAfter(usize);

impl EarlyStoppingStrategy for StopAfter {
    fn should_stop(&mut self, epoch: usize, _store: &EventStoreClient) -> bool {
        epoch >= self.0
    }
}

fn config() -> StrategyConfig {
    StrategyConfig::new(AlgorithmSpec::post_local_sgd(10, 4))
}

/// Stopped by early stopping after epoch 2, resumed from burn-train's checkpoint 2: the
/// parameters of the uninterrupted 3-epoch run, to the bit.
fn check_resume(config: StrategyConfig) {
    let full_dir = tempfile::tempdir().unwrap();
    let full = run_strategy(full_dir.path(), config.clone(), 3, None, |t| t);
    assert!(full.error.is_none(), "{:?}", full.error);

    let dir = tempfile::tempdir().unwrap();
    let first = run_strategy(dir.path(), config.clone(), 3, None, |t| {
        t.early_stopping(StopAfter(2))
    });
    assert!(first.error.is_none(), "{:?}", first.error);
    assert_ne!(params(&first.model), params(&full.model));
    // Rank 1's own checkpoint and both ranks' states are beside burn-train's.
    let state = dir.path().join("checkpoint/localsgd");
    for file in [
        "rank-0-epoch-2.json",
        "rank-0-epoch-2.pipeline",
        "rank-1-epoch-2.json",
        "rank-1-epoch-2.pipeline",
        "rank-1/model-2.bpk",
    ] {
        assert!(state.join(file).exists(), "{file}");
    }
    let resumed = run_strategy(dir.path(), config.clone(), 3, Some(2), |t| t);
    assert!(resumed.error.is_none(), "{:?}", resumed.error);
    assert_eq!(
        params(&resumed.model),
        params(&full.model),
        "{:?}",
        config.algorithm.kind
    );
}

#[test]
fn a_stopped_and_resumed_run_equals_the_uninterrupted_one() {
    check_resume(config());
}

/// With a shuffled training loader (burn's `DataLoaderBuilder::shuffle`), the resumed epoch 3
/// shuffles as the uninterrupted run's epoch 3 did: the parameters are equal to the bit.
#[test]
fn a_shuffled_run_resumes_with_the_uninterrupted_runs_order() {
    let shuffled = || loaders_shuffled(Some(7));
    let full_dir = tempfile::tempdir().unwrap();
    let full = run_strategy_on(full_dir.path(), config(), 3, None, LR, shuffled(), |t| t);
    assert!(full.error.is_none(), "{:?}", full.error);
    // Shuffling changes the run (else the test would prove nothing).
    let plain_dir = tempfile::tempdir().unwrap();
    let plain = run_strategy(plain_dir.path(), config(), 3, None, |t| t);
    assert_ne!(params(&plain.model), params(&full.model));

    let dir = tempfile::tempdir().unwrap();
    let first = run_strategy_on(dir.path(), config(), 3, None, LR, shuffled(), |t| {
        t.early_stopping(StopAfter(2))
    });
    assert!(first.error.is_none(), "{:?}", first.error);
    let resumed = run_strategy_on(dir.path(), config(), 3, Some(2), LR, shuffled(), |t| t);
    assert!(resumed.error.is_none(), "{:?}", resumed.error);
    assert_eq!(params(&resumed.model), params(&full.model));
}

/// DiLoCo's `θ` and outer momentum come back from the pipeline state file.
#[test]
fn diloco_resumes_with_theta_and_outer_momentum() {
    check_resume(StrategyConfig::new(AlgorithmSpec::diloco(4).with_warmup(2)));
}

/// Streaming DiLoCo (2 fragments, each all-reduce started a step early, 1 warmup step): the
/// fragments' `θ`, momentum and the pseudo-gradient started at step 45, in flight at the end of
/// epoch 2 (46 steps).
#[test]
fn streaming_diloco_resumes_with_its_fragments() {
    let mut spec = AlgorithmSpec::streaming_diloco(4, 2).with_warmup(1);
    if let Some(outer) = &mut spec.outer {
        outer.streaming = outer.streaming.map(|s| s.with_delay(1));
    }
    check_resume(StrategyConfig::new(spec));
}

/// Overlapped averaging (warmup 4, period 4, applied 2 steps later): epoch 2 ends (46 steps)
/// with the average started at step 44 in flight, saved pending and applied at step 46 after
/// the resume.
#[test]
fn overlapped_averaging_resumes_with_its_average_pending() {
    let mut spec = AlgorithmSpec::post_local_sgd(4, 4);
    spec.overlap = 2;
    check_resume(StrategyConfig::new(spec));
}

/// SlowMo with fairscale's two frequencies (plain averages every 2 steps, slow step every 6).
#[test]
fn slowmo_resumes_with_its_slow_momentum() {
    check_resume(StrategyConfig::new(AlgorithmSpec::slowmo(2, 6)));
}

#[test]
fn early_stopping_stops_every_rank_at_the_same_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let stopped = run_strategy(dir.path(), config(), 3, None, |t| {
        t.early_stopping(StopAfter(1))
    });
    assert!(stopped.error.is_none(), "{:?}", stopped.error);
    let one_dir = tempfile::tempdir().unwrap();
    let one = run_strategy(one_dir.path(), config(), 1, None, |t| t);
    assert_eq!(params(&stopped.model), params(&one.model));
}

#[test]
fn an_interrupter_stop_ends_every_rank_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let result = run_strategy(dir.path(), config(), 10_000, None, |t| {
        let interrupter = t.interrupter();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            interrupter.stop(Some("test"));
        });
        t
    });
    // Without agreement a rank would wait in a collective for the 300 s timeout.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(result.error.is_none(), "{:?}", result.error);
    assert!(result.interrupted.is_some());
}

/// A resume with a strategy setting the checkpoint fixes (here `clip_grad_norm`) is refused,
/// naming the saved and the given value; `timeout` may change.
#[test]
fn a_resume_with_another_fixed_setting_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = run_strategy(dir.path(), config(), 3, None, |t| {
        t.early_stopping(StopAfter(1))
    });
    assert!(first.error.is_none(), "{:?}", first.error);
    let mut clipped = config();
    clipped.clip_grad_norm = Some(1.0);
    let refused = run_strategy(dir.path(), clipped, 3, Some(1), |t| t);
    let error = format!("{:?}", refused.error.expect("the resume is refused"));
    assert!(
        error.contains("written with `clip_grad_norm = None`")
            && error.contains("this run has `clip_grad_norm = Some(1.0)`"),
        "{error}"
    );
    let mut patient = config();
    patient.timeout = Duration::from_secs(120);
    let resumed = run_strategy(dir.path(), patient, 3, Some(1), |t| t);
    assert!(resumed.error.is_none(), "{:?}", resumed.error);
}
