//! `LocalSgdStrategy::with_group`: each rank runs its own `SupervisedTraining` with its own
//! `Learner` and loaders, as one process per rank under MPI or NCCL would; here each "process"
//! is a thread of a `ThreadWorld`, handed its group. Every rank's own final parameters and the
//! world average each returns equal the strategy's own thread ranks' run (post-local SGD, 2
//! epochs, a shuffled loader), to the bit.

use crate::common;

use std::sync::Arc;

use burn_train::{Learner, SupervisedTraining, TrainingStrategy};
use common::*;
use localsgd_comm::ThreadWorld;
use localsgd_learner::{AlgorithmSpec, LocalSgdStrategy, StrategyConfig};

#[test]
fn a_rank_per_group_member_equals_the_thread_ranks() {
    let config = StrategyConfig::new(AlgorithmSpec::post_local_sgd(10, 4));
    let threads_dir = tempfile::tempdir().unwrap();
    let threads_strategy = Arc::new(LocalSgdStrategy::new(config.clone(), device()).unwrap());
    // A shuffled loader: every rank's shard is sliced in rank order in every process, so the
    // shards shuffle alike on both backends (a slice forks the loader's generator).
    let threads = run_with_strategy_on(
        threads_dir.path(),
        threads_strategy.clone(),
        2,
        LR,
        loaders_shuffled(Some(7)),
    );
    assert!(threads.error.is_none(), "{:?}", threads.error);
    let threads_own: Vec<Vec<f32>> = threads_strategy
        .rank_models::<Net>()
        .unwrap()
        .iter()
        .map(params)
        .collect();

    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let models = ThreadWorld::new(2)
        .unwrap()
        .run(|group| {
            let dir = dirs[group.rank()].path();
            let (train, valid) = loaders_shuffled(Some(7));
            let strategy =
                Arc::new(LocalSgdStrategy::with_group(config.clone(), group, device()).unwrap());
            let result = SupervisedTraining::new(dir, train, valid)
                .with_training_strategy(TrainingStrategy::Custom(strategy.clone()))
                .with_application_logger(None)
                .num_epochs(2)
                .launch(Learner::new(Net::new(&device()), optimizer(), LR));
            assert!(result.error.is_none(), "{:?}", result.error);
            let own = strategy.rank_models::<Net>().unwrap();
            assert_eq!(own.len(), 1, "one rank per process");
            (params(&result.model), params(&own[0]))
        })
        .unwrap();
    for (rank, (averaged, own)) in models.iter().enumerate() {
        assert_eq!(
            *averaged,
            params(&threads.model),
            "rank {rank}'s world average"
        );
        assert_eq!(*own, threads_own[rank], "rank {rank}'s own model");
    }
    // Rank 1 trained a replica of its own (local steps since the last average).
    assert_ne!(models[1].1, models[0].1);
}
