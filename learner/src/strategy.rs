//! [`LocalSgdStrategy`]: the `SupervisedLearningStrategy` that runs the ranks.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use burn::tensor::Device;
use burn_train::train::WorkerFailure;
use burn_train::{
    Learner, LearnerModel, SupervisedLearningStrategy, SupervisedTrainingEventProcessor,
    TrainLoader, TrainingComponents, TrainingError, ValidLoader,
};
use localsgd_comm::{Group, ThreadWorld};

use crate::config::StrategyConfig;
use crate::error::StrategyError;
use crate::rank::{RankEnd, Shared, run_rank};
use crate::report::StrategyReport;
use crate::state::StateDir;

/// Every algorithm of the localsgd pipeline (DDP, local SGD, post-local SGD, hierarchical
/// averaging, DiLoCo, Streaming DiLoCo, SlowMo, with overlap, compression and pipelined
/// buckets) for burn-train's `SupervisedTraining`: pass it as
/// `TrainingStrategy::Custom(Arc::new(strategy))`.
///
/// By default the ranks are `workers` threads of this process (each with a fork of the
/// `Learner`, on `device`); [`LocalSgdStrategy::with_group`] runs one rank per process instead
/// (MPI, NCCL). Each rank trains on its contiguous share of the training loader's items (burn's
/// `DataLoader::slice`, as burn-train's own multi-device strategies split data), every
/// iteration through the same [`Pipeline`](localsgd_pipeline::pipeline::Pipeline) as the
/// `localsgd` binary. Rank 0 feeds burn-train's metrics and renderer, validates and
/// checkpoints; every stop (interrupter, early stopping, end of a rank's data) is agreed by all
/// ranks, so none is left waiting in a collective.
///
/// The model `fit` returns is the world average of the ranks' final models (DDP: the replicas,
/// which are equal); [`rank_models`](Self::rank_models) gives each rank's own, and
/// [`report`](Self::report) the steps and traffic of every rank. Keep an `Arc` of the strategy
/// to read them after `launch`.
#[derive(Debug, Clone)]
pub struct LocalSgdStrategy {
    config: StrategyConfig,
    device: Device,
    group: Option<Group>,
    directory: Option<PathBuf>,
    last: Arc<Mutex<Option<LastRun>>>,
}

/// What the last `fit` left behind.
struct LastRun {
    report: Option<StrategyReport>,
    /// This process's ranks' own final models (`Vec<M>`, boxed: the strategy is not generic).
    models: Box<dyn Any + Send>,
}

impl std::fmt::Debug for LastRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LastRun")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl LocalSgdStrategy {
    /// `config.workers` thread ranks on `device` (made an autodiff device if it is not one).
    /// Fails on settings the semantics refuse, before anything trains.
    pub fn new(config: StrategyConfig, device: Device) -> Result<Self, StrategyError> {
        config.validate(config.workers)?;
        Ok(Self::with(config, device, None))
    }

    /// This process is one rank of `group` (every rank runs the same `SupervisedTraining` with
    /// its own loaders; `config.workers` is ignored).
    pub fn with_group(
        config: StrategyConfig,
        group: Group,
        device: Device,
    ) -> Result<Self, StrategyError> {
        config.validate(group.size())?;
        Ok(Self::with(config, device, Some(group)))
    }

    fn with(config: StrategyConfig, device: Device, group: Option<Group>) -> Self {
        Self {
            config,
            device: autodiff(device),
            group,
            directory: None,
            last: Arc::new(Mutex::new(None)),
        }
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

    /// Steps and traffic of every rank in the last `fit` (`None` before one, or when it failed
    /// before the ranks could gather them).
    pub fn report(&self) -> Option<StrategyReport> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|l| l.report.clone())
    }

    /// Each rank's own final model of the last `fit`, in rank order: every rank's with thread
    /// ranks, this process's one with [`with_group`](Self::with_group). `None` before a `fit`
    /// or when `M` is not the model type that was trained.
    pub fn rank_models<M: LearnerModel>(&self) -> Option<Vec<M>> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|l| l.models.downcast_ref::<Vec<M>>().cloned())
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
        let checked = self.config.validate(world).and_then(|()| {
            match (self.config.on_rank_failure.survives(), &self.directory) {
                (true, None) => Err(self.config.without_directory()),
                _ => Ok(()),
            }
        });
        if let Err(e) = checked {
            interrupter.fail(failure(0, &e));
            return (fallback, components.event_processor);
        }
        let dir = self.directory.as_deref().map(StateDir::new);
        let components = Mutex::new(components);
        // Every rank's share, sliced here in rank order whether the ranks are threads or
        // processes: a slice forks the loader's shuffling generator, so the shards shuffle the
        // same way in every run and on every backend.
        let n = dataloader_train.num_items();
        let shards: Vec<Option<TrainLoader<M>>> = (0..world)
            .map(|r| Some(dataloader_train.slice(r * n / world, (r + 1) * n / world)))
            .collect();
        let shards = Mutex::new(shards);
        let shared = Shared {
            config: &self.config,
            device: &self.device,
            directory: self.directory.as_deref(),
            state_dir: dir.as_ref(),
            train_items: n,
            shards: &shards,
            train: &dataloader_train,
            valid: &dataloader_valid,
            num_epochs,
            starting_epoch,
            accumulation,
            interrupter: &interrupter,
            event_store: &event_store,
            components: &components,
        };
        let ends = match &self.group {
            Some(group) => vec![run_rank(&shared, group.clone(), learner)],
            None => self.run_threads(&shared, learner),
        };
        let model = self.keep(ends, fallback, &interrupter);
        let processor = match components.into_inner() {
            Ok(c) => c.event_processor,
            Err(poisoned) => poisoned.into_inner().event_processor,
        };
        (model, processor)
    }
}

impl LocalSgdStrategy {
    /// The thread ranks' ends, in rank order. Under `on_rank_failure = Continue | Replace`,
    /// when some rank finished: the final world's ranks only (a rank that failed left; a
    /// replacement, a thread with a fork of the `Learner`, took its place).
    fn run_threads<M: LearnerModel>(
        &self,
        shared: &Shared<'_, M>,
        learner: Learner<M>,
    ) -> Vec<RankEnd<M>> {
        // The learner a replacement forks, and the model a rank that never started reports
        // (behind a lock: the ranks' closure is shared by their threads).
        let spare = Mutex::new(learner.clone());
        let failed = |rank: usize, e: StrategyError| RankEnd {
            rank,
            own: spare.lock().unwrap_or_else(|p| p.into_inner()).model(),
            averaged: None,
            ranks: None,
            error: Some(e),
        };
        let world = match ThreadWorld::new(self.config.workers) {
            Ok(w) => w.with_timeout(self.config.timeout),
            Err(e) => return vec![failed(0, e.into())],
        };
        // One fork of the learner per rank, taken by its thread.
        let learners: Vec<Mutex<Option<Learner<M>>>> = (0..self.config.workers)
            .map(|_| Mutex::new(Some(learner.clone())))
            .collect();
        let results = world.run_each(|group| {
            let rank = group.rank();
            let taken = if group.joined() {
                Some(spare.lock().unwrap_or_else(|p| p.into_inner()).clone())
            } else {
                learners[rank].lock().ok().and_then(|mut l| l.take())
            };
            match taken {
                Some(learner) => run_rank(shared, group, learner),
                None => failed(
                    rank,
                    StrategyError::Config(format!("rank {rank}: no learner")),
                ),
            }
        });
        let finished = results
            .iter()
            .any(|r| r.as_ref().is_ok_and(|end| end.error.is_none()));
        if self.config.on_rank_failure.survives() && finished {
            let mut ends: Vec<RankEnd<M>> = Vec::new();
            for result in results {
                match result {
                    Ok(end) if end.error.is_none() => ends.push(end),
                    Ok(end) => {
                        if let Some(e) = &end.error {
                            tracing::warn!("rank {} left the run: {e}", end.rank);
                        }
                    }
                    Err(panicked) => tracing::warn!(
                        "rank {} left the run: it panicked: {}",
                        panicked.rank,
                        panicked.message
                    ),
                }
            }
            ends.sort_by_key(|end| end.rank);
            return ends;
        }
        let panicked = results.iter().find_map(|r| r.as_ref().err()).cloned();
        results
            .into_iter()
            .enumerate()
            .map(|(i, result)| match result {
                Ok(end) => end,
                Err(p) => failed(i, StrategyError::Panicked(p.message)),
            })
            .map(|mut end| {
                // A peer's "rank N failed" names the panic as its cause.
                if let (Some(p), Some(e)) = (&panicked, &end.error)
                    && e.is_peer_lost()
                {
                    end.error = Some(StrategyError::Panicked(format!(
                        "rank {} panicked: {}",
                        p.rank, p.message
                    )));
                }
                end
            })
            .collect()
    }

    /// Report the ranks' failures through the interrupter (root causes, not a peer's "rank N
    /// failed", first), remember the report and the ranks' own models, and return the model
    /// `fit` hands back: the world average, or the first rank's own after a failure.
    fn keep<M: LearnerModel>(
        &self,
        ends: Vec<RankEnd<M>>,
        fallback: M,
        interrupter: &burn_train::Interrupter,
    ) -> M {
        let first_rank = self.group.as_ref().map_or(0, |g| g.rank());
        let failures: Vec<WorkerFailure> = ends
            .iter()
            .enumerate()
            .filter_map(|(i, end)| {
                end.error.as_ref().map(|e| WorkerFailure {
                    device_id: first_rank + i,
                    message: e.to_string(),
                })
            })
            .collect();
        if !failures.is_empty() {
            interrupter.fail(TrainingError::Workers(failures));
        }
        let report = ends
            .first()
            .and_then(|e| e.ranks.clone())
            .map(|ranks| StrategyReport { ranks });
        let model = ends
            .first()
            .map(|e| e.averaged.clone().unwrap_or_else(|| e.own.clone()))
            .unwrap_or(fallback);
        let models: Vec<M> = ends.into_iter().map(|e| e.own).collect();
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(LastRun {
            report,
            models: Box::new(models),
        });
        model
    }
}

fn failure(rank: usize, error: &StrategyError) -> TrainingError {
    TrainingError::Workers(vec![WorkerFailure {
        device_id: rank,
        message: error.to_string(),
    }])
}
