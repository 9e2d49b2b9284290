//! [`LocalSgdStrategy`]: the `SupervisedLearningStrategy` that runs the ranks.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use burn::tensor::Device;
use burn_train::train::WorkerFailure;
use burn_train::{
    Learner, LearnerModel, SupervisedLearningStrategy, SupervisedTrainingEventProcessor,
    TrainLoader, TrainingComponents, TrainingError, ValidLoader,
};
use localsgd_comm::{Group, ThreadWorld};

use crate::config::{StrategyConfig, StrategyError};
use crate::rank::{Shared, run_rank, state_dir};

/// Post-local SGD, local SGD, hierarchical averaging or DDP for burn-train's
/// `SupervisedTraining`: pass it as `TrainingStrategy::Custom(Arc::new(strategy))`.
///
/// By default the ranks are `workers` threads of this process (each with a fork of the
/// `Learner`, on `device`); [`LocalSgdStrategy::with_group`] runs one rank per process instead
/// (MPI, NCCL). Each rank trains on its contiguous share of the training loader's items (burn's
/// `DataLoader::slice`, as burn-train's own multi-device strategies split data). Rank 0 feeds
/// burn-train's metrics and renderer, validates its own model and checkpoints; every stop
/// (interrupter, early stopping, end of a rank's data) is agreed by all ranks, so none is left
/// waiting in a collective.
#[derive(Debug, Clone)]
pub struct LocalSgdStrategy {
    config: StrategyConfig,
    device: Device,
    group: Option<Group>,
    directory: Option<PathBuf>,
}

impl LocalSgdStrategy {
    /// `config.workers` thread ranks on `device` (made an autodiff device if it is not one).
    /// Fails on settings the semantics refuse, before anything trains.
    pub fn new(config: StrategyConfig, device: Device) -> Result<Self, StrategyError> {
        config.spec(config.workers)?;
        Ok(Self {
            config,
            device: autodiff(device),
            group: None,
            directory: None,
        })
    }

    /// This process is one rank of `group` (every rank runs the same `SupervisedTraining` with
    /// its own loaders; `config.workers` is ignored).
    pub fn with_group(
        config: StrategyConfig,
        group: Group,
        device: Device,
    ) -> Result<Self, StrategyError> {
        config.spec(group.size())?;
        Ok(Self {
            config,
            device: autodiff(device),
            group: Some(group),
            directory: None,
        })
    }

    /// Keep the strategy's resume state in `directory` (give it the directory passed to
    /// `SupervisedTraining::new`): each rank's schedule (optimizer steps, averager and hook
    /// state) after every epoch, and the models and optimizer states of ranks other than 0,
    /// under `directory/checkpoint/localsgd/`. Needed to resume (`.checkpoint(epoch)`).
    pub fn with_directory(mut self, directory: impl AsRef<Path>) -> Self {
        self.directory = Some(directory.as_ref().to_path_buf());
        self
    }

    /// The settings.
    pub fn config(&self) -> &StrategyConfig {
        &self.config
    }
}

fn autodiff(device: Device) -> Device {
    if device.is_autodiff() {
        device
    } else {
        device.autodiff()
    }
}

impl<M: LearnerModel> SupervisedLearningStrategy<M> for LocalSgdStrategy {
    fn fit(
        &self,
        components: TrainingComponents<M>,
        learner: Learner<M>,
        dataloader_train: TrainLoader<M>,
        dataloader_valid: ValidLoader<M>,
        starting_epoch: usize,
    ) -> (M, SupervisedTrainingEventProcessor<M>) {
        let interrupter = components.interrupter.clone();
        let event_store = components.event_store.clone();
        let num_epochs = components.num_epochs;
        let accumulation = components.grad_accumulation.unwrap_or(1);
        let fallback = learner.model();
        let world = self
            .group
            .as_ref()
            .map_or(self.config.workers, |g| g.size());
        let spec = match self.config.spec(world) {
            Ok(spec) => spec,
            Err(e) => {
                interrupter.fail(failure(0, e.to_string()));
                return (fallback, components.event_processor);
            }
        };
        let dir = state_dir(self.directory.as_deref());
        let components = Mutex::new(components);
        let shared = Shared {
            config: &self.config,
            spec: &spec,
            device: &self.device,
            state_dir: dir.as_ref(),
            train: &dataloader_train,
            valid: &dataloader_valid,
            num_epochs,
            starting_epoch,
            accumulation,
            interrupter: &interrupter,
            event_store: &event_store,
            components: &components,
        };
        let model = match &self.group {
            Some(group) => {
                let rank = group.rank();
                let (model, error) = run_rank(&shared, group.clone(), learner);
                if let Some(e) = error {
                    interrupter.fail(failure(rank, e));
                }
                model
            }
            None => self.run_threads(&shared, learner, fallback),
        };
        let processor = match components.into_inner() {
            Ok(c) => c.event_processor,
            Err(poisoned) => poisoned.into_inner().event_processor,
        };
        (model, processor)
    }
}

impl LocalSgdStrategy {
    /// The thread ranks; rank 0's final model. A failed rank is reported through the
    /// interrupter, the root cause (not a peer's "rank N failed") first.
    fn run_threads<M: LearnerModel>(
        &self,
        shared: &Shared<'_, M>,
        learner: Learner<M>,
        fallback: M,
    ) -> M {
        let world = match ThreadWorld::new(self.config.workers) {
            Ok(w) => w.with_timeout(self.config.timeout),
            Err(e) => {
                shared.interrupter.fail(failure(0, e.to_string()));
                return fallback;
            }
        };
        // One fork of the learner per rank, taken by its thread.
        let learners: Vec<Mutex<Option<Learner<M>>>> = (0..self.config.workers)
            .map(|_| Mutex::new(Some(learner.clone())))
            .collect();
        let spare = Mutex::new(fallback);
        let results = world.run(|group| {
            let rank = group.rank();
            let taken = learners[rank].lock().ok().and_then(|mut l| l.take());
            match taken {
                Some(learner) => run_rank(shared, group, learner),
                None => {
                    let model = match spare.lock() {
                        Ok(m) => m.clone(),
                        Err(poisoned) => poisoned.into_inner().clone(),
                    };
                    (model, Some(format!("rank {rank}: no learner")))
                }
            }
        });
        match results {
            Ok(results) => {
                let failures: Vec<WorkerFailure> = results
                    .iter()
                    .enumerate()
                    .filter_map(|(rank, (_, e))| {
                        e.as_ref().map(|message| WorkerFailure {
                            device_id: rank,
                            message: message.clone(),
                        })
                    })
                    .collect();
                if !failures.is_empty() {
                    shared.interrupter.fail(TrainingError::Workers(failures));
                }
                let fallback = spare.into_inner().unwrap_or_else(|p| p.into_inner());
                results.into_iter().next().map_or(fallback, |(m, _)| m)
            }
            Err(panicked) => {
                shared.interrupter.fail(failure(
                    panicked.rank,
                    format!("panicked: {}", panicked.message),
                ));
                spare.into_inner().unwrap_or_else(|p| p.into_inner())
            }
        }
    }
}

fn failure(rank: usize, message: String) -> TrainingError {
    TrainingError::Workers(vec![WorkerFailure {
        device_id: rank,
        message,
    }])
}
