//! Surviving a failed rank inside burn-train's `SupervisedTraining` (3 thread ranks, 15
//! optimizer steps per epoch, 3 epochs): rank 1 (or rank 0) panics in epoch 2, in an
//! optimizer step or while it saves its state after epoch 2. Under `Replace` a new thread takes
//! its place from its saved state after epoch 1, and every rank ends bit-identical to the run
//! without the failure, for every algorithm (DDP, local and post-local SGD, hierarchical
//! averaging, DiLoCo, Streaming DiLoCo, SlowMo; the loader does not shuffle: burn's loaders draw
//! each epoch's order from a generator that only moves forward). Under `Continue` the two
//! survivors end exactly as the pipeline does that resumes the same 3-rank state after epoch 1
//! on two ranks, the data dealt again over them.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use burn::lr_scheduler::{LrScheduler, LrSchedulerRecord};
use burn_train::checkpoint::KeepLastNCheckpoints;
use burn_train::{Learner, LearningResult, SupervisedTraining, TrainingStrategy};
use common::*;
use localsgd_learner::{AlgorithmSpec, LocalSgdStrategy, OnRankFailure, StrategyConfig};
use localsgd_pipeline::recovery::MEMBERSHIP_FILE;

/// Where a rank fails.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// In its `n`-th optimizer step (the learning-rate scheduler's step, 1-based).
    Step(usize),
    /// In its `n`-th record of the scheduler's state (two per epoch on rank 1: its own
    /// checkpoint and the recovery's saved state).
    Saving(usize),
}

/// The constant rate [`LR`] that panics once on the thread of job rank `rank` at `fault` (the
/// clones of one run share the counters: a replacement, on a thread of the same name, does not
/// fail again).
#[derive(Clone)]
struct FailingLr {
    rank: usize,
    fault: Fault,
    steps: Arc<AtomicUsize>,
    records: Arc<AtomicUsize>,
    fired: Arc<AtomicBool>,
}

impl FailingLr {
    fn new(rank: usize, fault: Fault) -> Self {
        Self {
            rank,
            fault,
            steps: Arc::default(),
            records: Arc::default(),
            fired: Arc::default(),
        }
    }

    fn on_rank(&self) -> bool {
        std::thread::current().name() == Some(format!("localsgd-rank-{}", self.rank).as_str())
    }

    fn fire(&self, what: &str) {
        if !self.fired.swap(true, Ordering::SeqCst) {
            panic!("rank {} fails on purpose {what}", self.rank);
        }
    }
}

impl LrScheduler for FailingLr {
    fn step(&mut self) -> f64 {
        if self.on_rank()
            && let Fault::Step(n) = self.fault
            && self.steps.fetch_add(1, Ordering::SeqCst) + 1 == n
        {
            self.fire("in an optimizer step");
        }
        LR
    }

    fn to_record(&self) -> LrSchedulerRecord {
        if self.on_rank()
            && let Fault::Saving(n) = self.fault
            && self.records.fetch_add(1, Ordering::SeqCst) + 1 == n
        {
            self.fire("while saving its state");
        }
        LrSchedulerRecord::new()
    }

    fn load_record(&mut self, _: LrSchedulerRecord) {}
}

const WORKERS: usize = 3;
const EPOCHS: usize = 3;

struct Run {
    result: LearningResult<Net>,
    /// Each rank's own final parameters, in the final world's rank order.
    ranks: Vec<Vec<f32>>,
}

fn run(
    dir: &Path,
    algorithm: AlgorithmSpec,
    policy: OnRankFailure,
    failure: Option<(usize, Fault)>,
) -> Run {
    let config = StrategyConfig::new(algorithm)
        .with_workers(WORKERS)
        .with_on_rank_failure(policy);
    let strategy = Arc::new(
        LocalSgdStrategy::new(config, device())
            .unwrap()
            .with_directory(dir),
    );
    let (train, valid) = loaders();
    let (rank, fault) = failure.unwrap_or((usize::MAX, Fault::Step(0)));
    let result = SupervisedTraining::new(dir, train, valid)
        .with_training_strategy(TrainingStrategy::Custom(strategy.clone()))
        .with_default_checkpointers()
        .with_checkpointing_strategy(KeepLastNCheckpoints::new(3))
        .with_application_logger(None)
        .num_epochs(EPOCHS)
        .launch(Learner::new(
            Net::new(&device()),
            optimizer(),
            FailingLr::new(rank, fault),
        ));
    let ranks = strategy
        .rank_models::<Net>()
        .expect("the ranks' models")
        .iter()
        .map(params)
        .collect();
    Run { result, ranks }
}

/// Under `Replace`, `rank` failing at `fault` ends every rank bit-identical to the run without
/// the failure; `membership.csv` records the change.
fn replaced(algorithm: AlgorithmSpec, rank: usize, fault: Fault) {
    let clean_dir = tempfile::tempdir().unwrap();
    let clean = run(
        clean_dir.path(),
        algorithm.clone(),
        OnRankFailure::Replace,
        None,
    );
    assert!(clean.result.error.is_none(), "{:?}", clean.result.error);
    assert_eq!(clean.ranks.len(), WORKERS);
    assert!(!clean_dir.path().join(MEMBERSHIP_FILE).exists());

    let dir = tempfile::tempdir().unwrap();
    let failed = run(
        dir.path(),
        algorithm.clone(),
        OnRankFailure::Replace,
        Some((rank, fault)),
    );
    assert!(failed.result.error.is_none(), "{:?}", failed.result.error);
    assert_eq!(failed.ranks.len(), WORKERS, "{algorithm:?}");
    for (r, (ours, theirs)) in failed.ranks.iter().zip(&clean.ranks).enumerate() {
        assert_eq!(ours, theirs, "rank {r}, {algorithm:?}, {fault:?}");
    }
    assert_eq!(
        params(&failed.result.model),
        params(&clean.result.model),
        "{algorithm:?}"
    );
    let record = std::fs::read_to_string(dir.path().join(MEMBERSHIP_FILE)).unwrap();
    let row: Vec<&str> = record.lines().nth(1).unwrap().split(',').collect();
    // iteration (the state after epoch 1: 15 steps), detected_at, left, joined, world, members
    let dying = rank.to_string();
    assert_eq!(row[0], "15", "{record}");
    assert_eq!(&row[2..6], [&dying, &dying, "3", "0 1 2"], "{record}");
}

#[test]
fn a_replaced_rank_ends_ddp_bit_identical() {
    replaced(AlgorithmSpec::ddp(), 1, Fault::Step(20));
}

#[test]
fn a_replaced_rank_ends_post_local_sgd_bit_identical() {
    replaced(AlgorithmSpec::post_local_sgd(5, 4), 1, Fault::Step(20));
}

#[test]
fn a_replaced_rank_ends_diloco_bit_identical() {
    replaced(AlgorithmSpec::diloco(8).with_warmup(2), 1, Fault::Step(22));
}

#[test]
fn a_replaced_rank_ends_streaming_diloco_bit_identical() {
    replaced(AlgorithmSpec::streaming_diloco(8, 2), 1, Fault::Step(25));
}

#[test]
fn a_replaced_rank_ends_slowmo_bit_identical() {
    replaced(AlgorithmSpec::slowmo(2, 6), 1, Fault::Step(19));
}

#[test]
fn a_replaced_rank_ends_local_sgd_bit_identical() {
    replaced(AlgorithmSpec::local_sgd(3), 1, Fault::Step(21));
}

/// One level over the 3 ranks every 2 steps after a warmup of 4.
#[test]
fn a_replaced_rank_ends_hierarchical_averaging_bit_identical() {
    replaced(
        AlgorithmSpec::hierarchical(4, "2:3".parse().unwrap()),
        2,
        Fault::Step(23),
    );
}

/// Rank 0 feeds burn-train's events and seals each saved epoch: its replacement does both.
#[test]
fn a_replaced_rank_0_ends_bit_identical() {
    replaced(AlgorithmSpec::diloco(8), 0, Fault::Step(20));
}

/// Rank 1 dies while it saves its state after epoch 2 (its third scheduler record): the world
/// goes back to epoch 1, the last every rank saved.
#[test]
fn a_rank_dying_while_saving_its_state_is_replaced_bit_identical() {
    replaced(AlgorithmSpec::post_local_sgd(5, 4), 1, Fault::Saving(3));
}

fn continued(algorithm: AlgorithmSpec, rank: usize, fault: Fault) {
    let dir = tempfile::tempdir().unwrap();
    let failed = run(
        dir.path(),
        algorithm.clone(),
        OnRankFailure::Continue,
        Some((rank, fault)),
    );
    assert!(failed.result.error.is_none(), "{:?}", failed.result.error);
    let record = std::fs::read_to_string(dir.path().join(MEMBERSHIP_FILE)).unwrap();
    let row: Vec<&str> = record.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(row[0], "15", "{record}");
    assert_eq!(row[2], rank.to_string(), "{record}");
    assert_eq!(&row[3..5], ["", "2"], "{record}");

    let reference = tempfile::tempdir().unwrap();
    let dir = Some(reference.path());
    run_pipeline_epochs(&algorithm, WORKERS, 1, (1, 1), dir);
    let resumed = run_pipeline_epochs(&algorithm, 2, 1, (2, EPOCHS), dir);
    assert_eq!(failed.ranks.len(), 2);
    // Survivor i took saved rank i's state when rank 2 failed (its own).
    assert_eq!(failed.ranks, resumed.ranks, "{algorithm:?}");
    assert_eq!(
        params(&failed.result.model),
        resumed.averaged,
        "{algorithm:?}"
    );
}

#[test]
fn the_survivors_of_post_local_sgd_continue_as_the_pipeline_resumes_on_two_ranks() {
    continued(AlgorithmSpec::post_local_sgd(5, 4), 2, Fault::Step(20));
}

#[test]
fn the_survivors_of_diloco_continue_as_the_pipeline_resumes_on_two_ranks() {
    continued(AlgorithmSpec::diloco(8), 2, Fault::Step(24));
}

/// `Continue` without the strategy's directory has nowhere to keep the ranks' states: `fit`
/// fails before training, naming the setting and the way out.
#[test]
fn surviving_without_a_directory_is_refused_before_training() {
    let config = StrategyConfig::new(AlgorithmSpec::post_local_sgd(5, 4))
        .with_on_rank_failure(OnRankFailure::Continue);
    let strategy = Arc::new(LocalSgdStrategy::new(config, device()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let result = run_with_strategy(dir.path(), strategy.clone(), 1, LR);
    let error = format!("{:?}", result.error.expect("refused"));
    for part in ["on_rank_failure", "Continue", "with_directory", "Abort"] {
        assert!(error.contains(part), "{error} lacks {part}");
    }
    assert!(strategy.report().is_none(), "nothing trained");
}
