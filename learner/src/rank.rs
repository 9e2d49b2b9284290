//! One rank's training loop: burn-train's epoch loop with the pipeline's phase order in every
//! iteration (agree on data, forward/backward through the `Learner`, gradient sync through the
//! comm hook, the optimizer step, then model averaging as its own phase), rank 0 feeding
//! burn-train's events, validating and checkpointing, and every stop agreed by all ranks.

use std::path::Path;
use std::sync::{Arc, Mutex};

use burn::data::dataloader::Progress;
use burn::optim::GradientsAccumulator;
use burn::tensor::Device;
use burn_train::metric::store::EventStoreClient;
use burn_train::{
    EventProcessorTraining, InferenceStep, Interrupter, Learner, LearnerEvent, LearnerModel,
    LearningCheckpointer, TrainLoader, TrainingComponents, TrainingItem, ValidLoader,
};
use localsgd_averagers::{AverageParameters, ModelAverager, broadcast_in_group};
use localsgd_comm::params::ParamSelection;
use localsgd_comm::{Group, GroupExt};
use localsgd_hooks::{CommHook, GradientReducer};
use localsgd_pipeline::algorithm::{self, AlgorithmSpec};
use localsgd_pipeline::pipeline::{
    BufferPolicy, average_buffers, broadcast_buffers, settle_if_buffers,
};

use crate::config::StrategyConfig;
use crate::state::{RankState, StateDir};

/// What every rank reads; `components` is used by rank 0 only (events, checkpointer, early
/// stopping).
pub(crate) struct Shared<'a, M: LearnerModel> {
    pub config: &'a StrategyConfig,
    pub spec: &'a AlgorithmSpec,
    pub device: &'a Device,
    pub state_dir: Option<&'a StateDir>,
    pub train: &'a TrainLoader<M>,
    pub valid: &'a ValidLoader<M>,
    pub num_epochs: usize,
    pub starting_epoch: usize,
    pub accumulation: usize,
    pub interrupter: &'a Interrupter,
    pub event_store: &'a Arc<EventStoreClient>,
    pub components: &'a Mutex<TrainingComponents<M>>,
}

/// A rank's failure, as text (it is reported through burn-train's `Interrupter`).
type RankResult<T> = Result<T, String>;

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Run rank `group.rank()` of the strategy to its end; returns its final model, or the error
/// that stopped it together with the model it had.
pub(crate) fn run_rank<M: LearnerModel>(
    shared: &Shared<'_, M>,
    group: Group,
    mut learner: Learner<M>,
) -> (M, Option<String>) {
    learner.fork(shared.device);
    let mut rank = match RankLoop::new(shared, group, learner) {
        Ok(r) => r,
        Err(failed) => {
            let (learner, e) = *failed;
            return (learner.model(), Some(e));
        }
    };
    let outcome = rank.run();
    let closed = rank.close();
    let error = outcome.err().or(closed.err());
    (rank.learner.model(), error)
}

struct RankLoop<'a, 's, M: LearnerModel> {
    shared: &'s Shared<'a, M>,
    group: Group,
    rank: usize,
    world: usize,
    learner: Learner<M>,
    sync: Option<(Box<dyn CommHook>, GradientReducer)>,
    averager: Option<Box<dyn ModelAverager>>,
    checkpointer: Option<LearningCheckpointer<M>>,
    has_buffers: bool,
    iterations: u64,
}

impl<'a, 's, M: LearnerModel> RankLoop<'a, 's, M> {
    fn new(
        shared: &'s Shared<'a, M>,
        group: Group,
        learner: Learner<M>,
    ) -> Result<Self, Box<(Learner<M>, String)>> {
        let parts = match algorithm::build(shared.spec, &group) {
            Ok(p) => p,
            Err(e) => return Err(Box::new((learner, e.to_string()))),
        };
        let rank = group.rank();
        let world = group.size();
        let checkpointer = match (rank, shared.state_dir) {
            (0, _) | (_, None) => None,
            (r, Some(dir)) => Some(dir.checkpointer(r, shared.config.keep_rank_checkpoints)),
        };
        let has_buffers = !ParamSelection::buffers(&learner.model()).is_empty();
        let mut this = Self {
            shared,
            group,
            rank,
            world,
            learner,
            sync: parts.sync,
            averager: parts.averager,
            checkpointer,
            has_buffers,
            iterations: 0,
        };
        let started = if shared.starting_epoch > 1 {
            this.restore(shared.starting_epoch - 1)
        } else if shared.config.broadcast_start {
            this.start_broadcast()
        } else {
            Ok(())
        };
        match started {
            Ok(()) => Ok(this),
            Err(e) => Err(Box::new((this.learner, e))),
        }
    }

    /// DDP's construction-time broadcast: every rank takes rank 0's parameters and buffers.
    fn start_broadcast(&mut self) -> RankResult<()> {
        let m = broadcast_in_group(
            settle_if_buffers(self.learner.model()),
            &ParamSelection::All,
            &self.group,
            0,
        )
        .map_err(text)?;
        self.learner.load_model(m.into_record());
        Ok(())
    }

    /// Continue after `epoch`: the schedule from this rank's state file; for ranks other than 0
    /// the model, optimizer and scheduler from this rank's checkpoint (burn-train restored rank
    /// 0's before the strategy started).
    fn restore(&mut self, epoch: usize) -> RankResult<()> {
        let dir = self.shared.state_dir.ok_or_else(|| {
            format!(
                "resuming after epoch {epoch} needs the strategy's directory \
                 (`LocalSgdStrategy::with_directory`, the directory given to SupervisedTraining)"
            )
        })?;
        let state = dir.load(self.rank, epoch)?;
        if state.world != self.world || state.algorithm != self.shared.spec.identity() {
            return Err(format!(
                "cannot resume: the checkpoint after epoch {epoch} was written by a run on {} \
                 ranks with {}; this run has {} ranks with {}",
                state.world,
                state.algorithm,
                self.world,
                self.shared.spec.identity()
            ));
        }
        if let (Some(a), Some(s)) = (&mut self.averager, &state.averager) {
            a.load_state(s).map_err(text)?;
        }
        if let (Some((hook, _)), Some(s)) = (&mut self.sync, &state.hook) {
            hook.load_state(s).map_err(text)?;
        }
        self.iterations = state.iterations;
        if let Some(c) = &self.checkpointer {
            let model = dir.model_path(self.rank, epoch);
            if !model.exists() {
                return Err(format!(
                    "resuming after epoch {epoch} needs rank {}'s checkpoint {}; the strategy \
                     keeps the last `keep_rank_checkpoints` epochs",
                    self.rank,
                    model.display()
                ));
            }
            self.learner = c.load_checkpoint(self.learner.clone(), epoch);
        }
        Ok(())
    }

    /// Rank 0's view of the interrupter, agreed by every rank (one 1-byte collective).
    fn agree_to_continue(&self, rank0_wants: bool) -> RankResult<bool> {
        let mine = self.rank != 0 || rank0_wants;
        self.group.all_true(mine).map_err(text)
    }

    fn with_components<T>(&self, f: impl FnOnce(&mut TrainingComponents<M>) -> T) -> T {
        let mut guard = match self.shared.components.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    fn run(&mut self) -> RankResult<()> {
        let shared = self.shared;
        let n = shared.train.num_items();
        let shard = shared
            .train
            .slice(self.rank * n / self.world, (self.rank + 1) * n / self.world)
            .to_device(shared.device);
        let valid = shared.valid.to_device(&shared.device.clone().inner());
        let interrupter = shared.interrupter;
        for epoch in shared.starting_epoch..=shared.num_epochs {
            if self.rank == 0 {
                self.with_components(|c| {
                    interrupter.fail_on_error(c.event_processor.process_train(
                        LearnerEvent::StartSplit {
                            epoch_number: epoch,
                            total_items: n,
                        },
                    ))
                });
            }
            self.train_epoch(&*shard, n)?;
            if self.rank == 0 {
                self.with_components(|c| {
                    interrupter.fail_on_error(
                        c.event_processor
                            .process_train(LearnerEvent::EndSplit(epoch)),
                    )
                });
            }
            if !self.agree_to_continue(!interrupter.should_stop())? {
                break;
            }
            if self.rank == 0 {
                self.validate(&*valid, epoch);
            }
            if !self.agree_to_continue(!interrupter.should_stop())? {
                break;
            }
            self.checkpoint(epoch)?;
            let early_stop = self.rank == 0
                && self.with_components(|c| match &mut c.early_stopping {
                    Some(es) => es.should_stop(epoch, &c.event_store),
                    None => false,
                });
            if !self.agree_to_continue(!early_stop)? {
                break;
            }
        }
        Ok(())
    }

    /// One pass over this rank's shard; every iteration is one optimizer step over
    /// `accumulation` micro-batches. The epoch ends for every rank when any rank runs out of
    /// batches (an incomplete accumulation is not stepped) or rank 0 is interrupted.
    fn train_epoch(
        &mut self,
        shard: &dyn burn::data::dataloader::DataLoader<<M as burn_train::TrainStep>::Input>,
        total_items: usize,
    ) -> RankResult<()> {
        let shared = self.shared;
        let k = shared.accumulation.max(1);
        let mut iterator = shard.iter();
        let mut local_batches = 0usize;
        loop {
            // FetchBatch
            let mut items = Vec::with_capacity(k);
            let mut data_error = None;
            while items.len() < k {
                match iterator.next() {
                    Some(Ok(item)) => items.push(item),
                    Some(Err(e)) => {
                        data_error = Some(e);
                        break;
                    }
                    None => break,
                }
            }
            let failed = data_error.is_some();
            if let Some(e) = data_error {
                shared.interrupter.fail(e);
            }
            // AgreeHasData (with rank 0's interrupter)
            let ready = items.len() == k && !failed;
            let go = self
                .group
                .all_true(ready && (self.rank != 0 || !shared.interrupter.should_stop()))
                .map_err(text)?;
            if !go {
                return Ok(());
            }
            if self.has_buffers && shared.config.buffers == BufferPolicy::Broadcast {
                let m = broadcast_buffers(self.learner.model(), &self.group).map_err(text)?;
                self.learner.load_model(m.into_record());
            }
            // ForwardBackward (the user's TrainStep; burn-train sums accumulated gradients)
            let mut outputs = Vec::with_capacity(k);
            let mut grads = if k == 1 {
                let out = self.learner.train_step(items.remove(0));
                outputs.push(out.item);
                out.grads
            } else {
                let mut acc = GradientsAccumulator::<M>::new();
                for item in items {
                    let out = self.learner.train_step(item);
                    acc.accumulate(&self.learner.model(), out.grads);
                    outputs.push(out.item);
                }
                acc.grads()
            };
            // GradientSync
            let model = self.learner.model();
            if let Some((hook, reducer)) = &mut self.sync {
                grads = reducer
                    .start(&model, grads, &mut **hook)
                    .map_err(text)?
                    .wait_all(&model)
                    .map_err(text)?;
            }
            // The averager averages the parameters that had a gradient this step.
            let averaging = self.averager.as_ref().and_then(|a| a.scheduled_group());
            let selection = match averaging {
                Some(_) => ParamSelection::with_grads(&model, &grads),
                None => ParamSelection::ids(std::iter::empty()),
            };
            // OptimizerStep
            self.learner.lr_step();
            self.learner.optimizer_step(grads);
            // ModelAveraging
            if let Some(averager) = &mut self.averager {
                let m = averager
                    .average_parameters(self.learner.model(), &selection)
                    .map_err(text)?;
                if let Some(group) = averaging {
                    let m = match shared.config.buffers {
                        BufferPolicy::Average if self.has_buffers => {
                            average_buffers(m, &group).map_err(text)?
                        }
                        _ => m,
                    };
                    self.learner.load_model(m.into_record());
                }
            }
            self.iterations += 1;
            // Metrics: rank 0's items, counted over all ranks as burn-train's DDP does.
            if self.rank == 0 {
                let p = iterator.progress();
                let progress = Progress {
                    items_processed: (p.items_processed * self.world).min(total_items),
                    items_total: total_items,
                    unit: p.unit.clone(),
                };
                let lr = self.learner.lr_current();
                self.with_components(|c| {
                    for item in outputs {
                        local_batches += 1;
                        let item = TrainingItem::new(
                            item,
                            progress.clone(),
                            Some(local_batches * self.world),
                            Some(lr.clone()),
                        );
                        shared.interrupter.fail_on_error(
                            c.event_processor
                                .process_train(LearnerEvent::ProcessedItem(item)),
                        );
                    }
                });
            }
        }
    }

    /// Rank 0 validates its own model on the whole validation set (burn-train's loop).
    fn validate(
        &self,
        valid: &dyn burn::data::dataloader::DataLoader<<M as InferenceStep>::Input>,
        epoch: usize,
    ) {
        let interrupter = self.shared.interrupter;
        let model = self.learner.model().valid();
        self.with_components(|c| {
            let p = &mut c.event_processor;
            interrupter.fail_on_error(p.process_valid(LearnerEvent::StartSplit {
                epoch_number: epoch,
                total_items: valid.num_items(),
            }));
            let mut iterator = valid.iter();
            let mut iteration = 0;
            while let Some(item) = iterator.next() {
                let item = match item {
                    Ok(item) => item,
                    Err(e) => {
                        interrupter.fail(e);
                        break;
                    }
                };
                let progress = iterator.progress();
                iteration += 1;
                let out = InferenceStep::step(&model, item);
                let item = TrainingItem::new(out, progress, Some(iteration), None);
                interrupter.fail_on_error(p.process_valid(LearnerEvent::ProcessedItem(item)));
                if interrupter.should_stop() {
                    break;
                }
            }
            interrupter.fail_on_error(p.process_valid(LearnerEvent::EndSplit(epoch)));
            interrupter.fail_on_error(p.process_train(LearnerEvent::EndEpoch(epoch)));
            if c.checkpointer.is_some() || c.early_stopping.is_some() {
                interrupter.fail_on_error(p.flush());
            }
        });
    }

    /// Rank 0 through burn-train's checkpointer, the other ranks through their own; every rank
    /// writes its schedule state beside them.
    fn checkpoint(&mut self, epoch: usize) -> RankResult<()> {
        if self.has_buffers {
            let m = settle_if_buffers(self.learner.model());
            self.learner.load_model(m.into_record());
        }
        if self.rank == 0 {
            let learner = &self.learner;
            self.with_components(|c| {
                if let Some(ckpt) = &mut c.checkpointer {
                    ckpt.checkpoint(learner, epoch, &c.event_store);
                }
            });
        } else if let Some(ckpt) = &mut self.checkpointer {
            ckpt.checkpoint(&self.learner, epoch, self.shared.event_store);
        }
        if let Some(dir) = self.shared.state_dir {
            let state = RankState {
                rank: self.rank,
                world: self.world,
                algorithm: self.shared.spec.identity(),
                iterations: self.iterations,
                averager: self.averager.as_ref().map(|a| a.state()),
                hook: self.sync.as_ref().map(|(h, _)| h.state()),
            };
            dir.save(&state, epoch, self.shared.config.keep_rank_checkpoints)?;
        }
        Ok(())
    }

    /// Finish the reducer (a non-blocking helper communicator, if any).
    fn close(&mut self) -> RankResult<()> {
        if let Some((_, reducer)) = &mut self.sync {
            reducer.close().map_err(text)?;
        }
        Ok(())
    }
}

/// The directory a strategy keeps its files in, if any.
pub(crate) fn state_dir(directory: Option<&Path>) -> Option<StateDir> {
    directory.map(StateDir::new)
}
