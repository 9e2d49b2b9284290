//! `LocalSgdStrategy::with_group`: each rank runs its own `SupervisedTraining` with its own
//! `Learner` and loaders, as one process per rank under MPI or NCCL would; here each "process"
//! is a thread of a `ThreadWorld`, handed its group. Rank 0's final parameters equal the
//! strategy's own thread ranks' run (post-local SGD, 2 epochs), to the bit.

use crate::common;

use std::sync::Arc;

use burn_train::{Learner, SupervisedTraining, TrainingStrategy};
use common::*;
use localsgd_comm::ThreadWorld;
use localsgd_learner::{LocalSgdStrategy, StrategyConfig};

#[test]
fn a_rank_per_group_member_equals_the_thread_ranks() {
    let config = StrategyConfig::post_local_sgd(10, 4);
    let threads_dir = tempfile::tempdir().unwrap();
    let threads = run_strategy(threads_dir.path(), config.clone(), 2, None, |t| t);
    assert!(threads.error.is_none(), "{:?}", threads.error);

    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let models = ThreadWorld::new(2)
        .unwrap()
        .run(|group| {
            let dir = dirs[group.rank()].path();
            let (train, valid) = loaders();
            let strategy = LocalSgdStrategy::with_group(config.clone(), group, device()).unwrap();
            let result = SupervisedTraining::new(dir, train, valid)
                .with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))
                .with_application_logger(None)
                .num_epochs(2)
                .launch(Learner::new(Net::new(&device()), optimizer(), LR));
            assert!(result.error.is_none(), "{:?}", result.error);
            params(&result.model)
        })
        .unwrap();
    assert_eq!(models[0], params(&threads.model));
    // Rank 1 trained a replica of its own (local steps since the last average).
    assert_ne!(models[1], models[0]);
}
