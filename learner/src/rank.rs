//! One rank of the strategy: burn-train's epoch loop (events, validation, checkpoints, early
//! stopping, every stop agreed by all ranks) around the localsgd [`Pipeline`], which runs each
//! iteration's phases. This file adapts burn-train to the pipeline's override points: the
//! shard's data loader is the [`BatchSource`], the model's `TrainStep` the [`ForwardBackward`]
//! step, the `Learner`'s optimizer and scheduler the [`InnerOptimizer`], and burn-train's
//! event processor the [`IterationObserver`] of [`Pipeline::run_epoch`].

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};

use burn::data::dataloader::{DataLoader, DataLoaderIterator, Progress};
use burn::optim::GradientsParams;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::tensor::Device;
use burn_train::metric::store::EventStoreClient;
use burn_train::{
    EventProcessorTraining, InferenceStep, Interrupter, Learner, LearnerEvent, LearnerModel,
    LearningCheckpointer, TrainLoader, TrainStep, TrainingComponents, TrainingItem, ValidLoader,
};
use localsgd_comm::{Group, GroupExt, Traffic};
use localsgd_pipeline::algorithm;
use localsgd_pipeline::pipeline::{
    Accumulation, BatchSource, ForwardBackward, InnerOptimizer, IterationObserver, IterationReport,
    MicroBatch, ObserverError, Pipeline, PipelineOptions, SourceError, StepOutput, refresh_buffers,
};
use localsgd_pipeline::recovery::{Recovery, Start};
use localsgd_pipeline::settings::AlgorithmKind;

use crate::config::StrategyConfig;
use crate::error::StrategyError;
use crate::recovery::{Bundle, EpochStore, RecordCapture};
use crate::report::RankReport;
use crate::state::{RankState, StateDir};
use localsgd_pipeline::checkpoint::PipelineState;

/// What every rank reads; `components` is used by rank 0 only (events, checkpointer, early
/// stopping).
pub(crate) struct Shared<'a, M: LearnerModel> {
    pub config: &'a StrategyConfig,
    pub device: &'a Device,
    /// The strategy's directory (`with_directory`).
    pub directory: Option<&'a Path>,
    pub state_dir: Option<&'a StateDir>,
    /// The training loader's items (for progress).
    pub train_items: usize,
    /// Every rank's shard of the training loader, in rank order (sliced once, before the ranks
    /// start: each slice forks the loader's shuffling generator, so the order of the slices
    /// fixes each shard's shuffle).
    pub shards: &'a Mutex<Vec<Option<TrainLoader<M>>>>,
    /// The training loader, dealt again over the ranks of each world after a failure.
    pub train: &'a TrainLoader<M>,
    pub valid: &'a ValidLoader<M>,
    pub num_epochs: usize,
    pub starting_epoch: usize,
    pub accumulation: usize,
    pub interrupter: &'a Interrupter,
    pub event_store: &'a Arc<EventStoreClient>,
    pub components: &'a Mutex<TrainingComponents<M>>,
}

/// How a rank ended.
pub(crate) struct RankEnd<M> {
    /// Its rank in the final world.
    pub rank: usize,
    /// The rank's own final model.
    pub own: M,
    /// The world average of the final models (DDP: the rank's own); `None` when the rank
    /// failed.
    pub averaged: Option<M>,
    /// Every rank's counters (gathered; `None` when the rank failed).
    pub ranks: Option<Vec<RankReport>>,
    /// The error that stopped the rank.
    pub error: Option<StrategyError>,
}

/// Where a world's training begins.
enum Begin {
    /// From the initial `Learner` (a fresh run, or survivors with no saved epoch).
    Fresh,
    /// After epoch `.0`, resumed through burn-train (`.checkpoint(epoch)`): rank 0's learner
    /// was restored by burn-train, the other ranks' from their checkpoints, every rank's
    /// schedule from its state file.
    Resumed(usize),
    /// From a rank's saved state of an epoch (after a failure: the survivors' own, a
    /// replacement's handed over).
    Saved(Box<Bundle>),
}

/// Run rank `group.rank()` of the strategy to its end (through the worlds after failures,
/// under `on_rank_failure = Continue | Replace`).
pub(crate) fn run_rank<M: LearnerModel>(
    shared: &Shared<'_, M>,
    group: Group,
    mut learner: Learner<M>,
) -> RankEnd<M> {
    learner.fork(shared.device);
    let initial = learner.clone();
    let learner = Arc::new(Mutex::new(learner));
    let rank = group.rank();
    let ended = if shared.config.on_rank_failure.survives() {
        run_surviving(shared, group, &learner, &initial)
    } else {
        let begin = match shared.starting_epoch {
            0 | 1 => Begin::Fresh,
            e => Begin::Resumed(e - 1),
        };
        train_world(shared, &group, &learner, begin, true, None)
    };
    ended.unwrap_or_else(|e| RankEnd::failed(rank, lock(&learner).model(), e))
}

/// [`run_rank`] under `Continue` or `Replace`: the pipeline's [`Recovery`] trains world after
/// world, each from the latest epoch every rank saved ([`EpochStore`]).
fn run_surviving<M: LearnerModel>(
    shared: &Shared<'_, M>,
    group: Group,
    learner: &Arc<Mutex<Learner<M>>>,
    initial: &Learner<M>,
) -> Result<RankEnd<M>, StrategyError> {
    let config = shared.config;
    let policy = config.on_rank_failure;
    let directory = shared.directory.ok_or_else(|| config.without_directory())?;
    let store = EpochStore::new(directory);
    let spec = config.algorithm.clone();
    let (recovery, start) = if group.joined() {
        let (recovery, joined) = Recovery::join(policy, Some(directory), spec, &group)?;
        (recovery, joined.start)
    } else {
        let recovery = Recovery::new(policy, Some(directory), spec, group.size(), group.rank());
        let start = match shared.starting_epoch {
            0 | 1 => Start::Fresh,
            _ => Start::Resume,
        };
        (recovery, start)
    };
    let mut recovery = recovery.with_store(Box::new(store.clone()));
    let mut first = !group.joined();
    let (end, _) = recovery.run(
        group,
        start,
        StrategyError::is_peer_lost,
        |group, start, recovery| {
            let begin = match start {
                Start::Fresh => {
                    *lock(learner) = initial.clone();
                    Begin::Fresh
                }
                Start::Resume => Begin::Resumed(shared.starting_epoch.saturating_sub(1)),
                Start::ResumeFrom(saved) => Begin::Saved(Box::new(store.read(saved)?)),
                Start::Received { bytes, .. } => Begin::Saved(Box::new(Bundle::decode(
                    Path::new("(a rank's state received from a live rank)"),
                    &bytes,
                )?)),
            };
            let first = std::mem::replace(&mut first, false);
            train_world(shared, group, learner, begin, first, Some(recovery))
        },
    )?;
    Ok(end)
}

/// Train one world from `begin` to its end. `first`: the job's first world (whose shards
/// were sliced before the ranks started). A failure leaves the rank's current model in
/// `learner`.
fn train_world<M: LearnerModel>(
    shared: &Shared<'_, M>,
    group: &Group,
    learner: &Arc<Mutex<Learner<M>>>,
    begin: Begin,
    first: bool,
    recovery: Option<&mut Recovery>,
) -> Result<RankEnd<M>, StrategyError> {
    let mut rank = RankLoop::new(shared, group.clone(), learner.clone(), recovery)?;
    let from = rank.begin(begin)?;
    let trained = rank.run(from, first).and_then(|()| rank.finish());
    if trained.is_err() {
        let model = rank.current_model();
        lock(learner).load_model(model.into_record());
    }
    trained
}

impl<M> RankEnd<M> {
    fn failed(rank: usize, own: M, error: StrategyError) -> Self {
        Self {
            rank,
            own,
            averaged: None,
            ranks: None,
            error: Some(error),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `Learner`'s optimizer and learning-rate scheduler as the pipeline's inner optimizer
/// (burn-train keeps both private to the `Learner`).
struct LearnerOptimizer<M: LearnerModel> {
    learner: Arc<Mutex<Learner<M>>>,
}

impl<M: LearnerModel> InnerOptimizer<M> for LearnerOptimizer<M> {
    fn next_lr(&mut self) -> ModuleLearningRate {
        let mut learner = lock(&self.learner);
        learner.lr_step();
        learner.lr_current()
    }

    fn step(&mut self, _lr: ModuleLearningRate, model: M, grads: GradientsParams) -> M {
        // The learner steps at the rate `next_lr` just set: the same as `_lr`.
        let mut learner = lock(&self.learner);
        learner.load_model(model.into_record());
        learner.optimizer_step(grads);
        learner.model()
    }
}

/// The model's `TrainStep` as the pipeline's forward/backward step. burn-train sums the
/// gradients of accumulated micro-batches (its own `grads_accumulation`), so each pass's
/// gradients are taken as they are; the items' outputs are kept for burn-train's metrics.
struct LearnerStep<M: LearnerModel> {
    /// The micro-batches' outputs since the events observer last took them.
    outputs: Rc<RefCell<Vec<<M as TrainStep>::Output>>>,
}

impl<M: LearnerModel> ForwardBackward<M, <M as TrainStep>::Input> for LearnerStep<M> {
    fn forward_backward(
        &mut self,
        model: &M,
        batch: <M as TrainStep>::Input,
        _micro: MicroBatch,
    ) -> Result<StepOutput, SourceError> {
        let out = TrainStep::step(model, batch);
        self.outputs.borrow_mut().push(out.item);
        Ok(StepOutput {
            loss: None,
            grads: out.grads,
        })
    }
}

/// This rank's shard of the training loader as a batch source: a read error or rank 0's
/// interrupter ends the epoch (on every rank, through the has-data agreement), the error
/// reported through the interrupter.
struct LoaderSource<'a, I> {
    iter: Box<dyn DataLoaderIterator<I> + 'a>,
    interrupter: &'a Interrupter,
    watch_interrupter: bool,
    /// The loader's progress after the last batch it gave (for burn-train's events).
    progress: Rc<RefCell<Progress>>,
}

impl<I> BatchSource<I> for LoaderSource<'_, I> {
    fn next_batch(&mut self) -> Result<Option<I>, SourceError> {
        if self.watch_interrupter && self.interrupter.should_stop() {
            return Ok(None);
        }
        match self.iter.next() {
            Some(Ok(item)) => {
                *self.progress.borrow_mut() = self.iter.progress();
                Ok(Some(item))
            }
            Some(Err(e)) => {
                self.interrupter.fail(e);
                Ok(None)
            }
            None => Ok(None),
        }
    }
}

/// Rank 0 feeds burn-train's event processor with each micro-batch's output after every
/// iteration (metrics, renderer, loggers); its items are counted over all ranks, as
/// burn-train's DDP counts them. The other ranks observe nothing.
struct Events<'s, 'a, 'r, M: LearnerModel> {
    shared: &'s Shared<'a, M>,
    /// Told of every completed iteration (it times a recovery).
    recovery: Option<&'r mut Recovery>,
    learner: &'s Mutex<Learner<M>>,
    feeds: bool,
    world: usize,
    total_items: usize,
    progress: Rc<RefCell<Progress>>,
    outputs: Rc<RefCell<Vec<<M as TrainStep>::Output>>>,
    /// This rank's batches so far in the epoch.
    batches: usize,
}

impl<M: LearnerModel> IterationObserver<M> for Events<'_, '_, '_, M> {
    fn after_iteration(&mut self, report: &IterationReport, _: &M) -> Result<bool, ObserverError> {
        if let Some(recovery) = self.recovery.as_deref_mut() {
            recovery.completed(report.iteration + 1)?;
        }
        let outputs = std::mem::take(&mut *self.outputs.borrow_mut());
        if !self.feeds {
            return Ok(true);
        }
        let p = self.progress.borrow().clone();
        let progress = Progress {
            items_processed: (p.items_processed * self.world).min(self.total_items),
            items_total: self.total_items,
            unit: p.unit,
        };
        let lr = lock(self.learner).lr_current();
        let interrupter = self.shared.interrupter;
        let mut components = lock(self.shared.components);
        for item in outputs {
            self.batches += 1;
            let item = TrainingItem::new(
                item,
                progress.clone(),
                Some(self.batches * self.world),
                Some(lr.clone()),
            );
            interrupter.fail_on_error(
                components
                    .event_processor
                    .process_train(LearnerEvent::ProcessedItem(item)),
            );
        }
        Ok(true)
    }
}

struct RankLoop<'a, 's, 'r, M: LearnerModel> {
    shared: &'s Shared<'a, M>,
    /// The recovery of a run that survives failed ranks.
    recovery: Option<&'r mut Recovery>,
    /// The learner's records for the recovery's saved states.
    capture: Option<RecordCapture<M>>,
    group: Group,
    rank: usize,
    world: usize,
    learner: Arc<Mutex<Learner<M>>>,
    pipeline: Pipeline<M>,
    /// The model between iterations (taken by each iteration; `None` only after one failed).
    model: Option<M>,
    checkpointer: Option<LearningCheckpointer<M>>,
    traffic_start: Traffic,
}

impl<'a, 's, 'r, M: LearnerModel> RankLoop<'a, 's, 'r, M> {
    fn new(
        shared: &'s Shared<'a, M>,
        group: Group,
        learner: Arc<Mutex<Learner<M>>>,
        recovery: Option<&'r mut Recovery>,
    ) -> Result<Self, StrategyError> {
        let config = shared.config;
        config.validate(group.size())?;
        let parts = algorithm::build(&config.algorithm, &group)?;
        let rank = group.rank();
        let world = group.size();
        let options = PipelineOptions {
            // The learner's scheduler sets every step's rate.
            lr: 0.0,
            clip_grad_norm: config.clip_grad_norm,
            accumulate: shared.accumulation.max(1),
            // burn-train's epochs end with validation and checkpoints: each epoch's last step
            // takes the micro-batches left (Lightning's rule), none carries over.
            accumulation: Accumulation::EpochEnd,
            skip_non_finite: config.skip_non_finite,
            metrics_every: 0,
            checkpoint_every: 0,
            // A restored pipeline continues from each rank's own state (`begin`).
            broadcast_start: config.broadcast_start,
            buffers: config.buffers,
        };
        let optimizer = LearnerOptimizer {
            learner: learner.clone(),
        };
        let pipeline = Pipeline::with_inner_optimizer(group.clone(), Box::new(optimizer), options)
            .with_parts(parts);
        let checkpointer = match (rank, shared.state_dir) {
            (0, _) | (_, None) => None,
            (r, Some(dir)) => Some(dir.checkpointer(r, config.keep_rank_checkpoints)),
        };
        let model = lock(&learner).model();
        let traffic_start = group.traffic();
        Ok(Self {
            shared,
            capture: recovery.is_some().then(RecordCapture::new),
            recovery,
            group,
            rank,
            world,
            learner,
            pipeline,
            model: Some(model),
            checkpointer,
            traffic_start,
        })
    }

    /// Take up `begin`; returns the first epoch to train. A run that survives failed ranks
    /// saves the state a burn-train resume took up at once, so that the survivors of a failure
    /// before the next epoch's end go back to it.
    fn begin(&mut self, begin: Begin) -> Result<usize, StrategyError> {
        let (start, from) = match begin {
            Begin::Fresh => (Start::Fresh, 1),
            Begin::Resumed(epoch) => {
                self.restore(epoch)?;
                (Start::Resume, epoch + 1)
            }
            Begin::Saved(bundle) => {
                self.restore_saved(&bundle)?;
                (Start::ResumeFrom(bundle.state.rank), bundle.epoch + 1)
            }
        };
        let resumed = (from > 1).then(|| self.pipeline.iteration());
        if let Some(recovery) = self.recovery.as_deref_mut() {
            recovery.started(&start, self.rank, resumed);
        }
        if let Start::Resume = start
            && self.recovery.is_some()
        {
            let pipeline = PipelineState::capture(&mut self.pipeline)?;
            self.save_recovery(from - 1, &pipeline)?;
        }
        Ok(from)
    }

    /// Continue from a rank's saved state (written by a world of `bundle.state.world` ranks,
    /// perhaps another number): the learner's records and the pipeline's state.
    fn restore_saved(&mut self, bundle: &Bundle) -> Result<(), StrategyError> {
        let config = self.shared.config;
        let saved = &bundle.state;
        let identity = config.algorithm.for_world(saved.world).identity();
        if saved.algorithm != identity {
            return Err(StrategyError::Resume(format!(
                "the state saved after epoch {} was written by a run with {}; this run has \
                 {identity}",
                bundle.epoch, saved.algorithm
            )));
        }
        let now = crate::state::fixed_settings(config);
        if let Some(was) = &saved.settings
            && let Some((was, is)) = was.iter().zip(&now).find(|(a, b)| a != b)
        {
            return Err(StrategyError::Resume(format!(
                "the state saved after epoch {} was written with `{was}`, this run has `{is}`",
                bundle.epoch
            )));
        }
        let mut learner = lock(&self.learner);
        bundle.restore_learner(&mut learner)?;
        self.model = Some(learner.model());
        drop(learner);
        let source = Path::new("(a rank's saved state)");
        let state = PipelineState::from_bytes(source, &bundle.pipeline)?;
        self.pipeline.restore(state.into_restored())?;
        Ok(())
    }

    /// Save this rank's whole state after `epoch` (the pipeline's: `pipeline`) for a recovery,
    /// and once every rank has (collective), seal the epoch (rank 0). Nothing without one.
    fn save_recovery(
        &mut self,
        epoch: usize,
        pipeline: &PipelineState,
    ) -> Result<(), StrategyError> {
        let Some(directory) = self.shared.directory else {
            return Ok(());
        };
        self.sync_learner();
        let Some(capture) = self.capture.as_mut() else {
            return Ok(());
        };
        let [model, optim, scheduler] =
            capture.capture(&lock(&self.learner), self.shared.event_store)?;
        let iterations = pipeline.iterations_done;
        let bundle = Bundle {
            state: self.rank_state(iterations),
            epoch,
            pipeline: pipeline.to_bytes()?,
            model,
            optim,
            scheduler,
        };
        let store = EpochStore::new(directory);
        store.write(&bundle, self.shared.config.keep_rank_checkpoints.max(2))?;
        // Every rank's file is written before any rank counts the epoch as saved.
        self.group.all_true(true)?;
        if let Some(recovery) = self.recovery.as_deref_mut() {
            recovery.remember_checkpoint(iterations, self.rank);
        }
        if self.rank == 0 {
            store.seal(epoch, iterations, self.group.world_ranks())?;
        }
        Ok(())
    }

    fn rank_state(&self, iterations: u64) -> RankState {
        RankState {
            rank: self.rank,
            world: self.world,
            algorithm: self.shared.config.algorithm.identity(),
            iterations,
            settings: Some(crate::state::fixed_settings(self.shared.config)),
        }
    }

    /// Continue after `epoch`: the schedule from this rank's state file; for ranks other than 0
    /// the model, optimizer and scheduler from this rank's checkpoint (burn-train restored rank
    /// 0's before the strategy started).
    fn restore(&mut self, epoch: usize) -> Result<(), StrategyError> {
        let dir = self.shared.state_dir.ok_or_else(|| {
            StrategyError::Resume(format!(
                "resuming after epoch {epoch} needs the strategy's directory \
                 (`LocalSgdStrategy::with_directory`, the directory given to SupervisedTraining)"
            ))
        })?;
        let (state, pipeline_state) = dir.load(self.rank, epoch)?;
        let identity = self.shared.config.algorithm.identity();
        if state.world != self.world || state.algorithm != identity {
            return Err(StrategyError::Resume(format!(
                "the checkpoint after epoch {epoch} was written by a run on {} ranks with {}; \
                 this run has {} ranks with {identity}",
                state.world, state.algorithm, self.world,
            )));
        }
        // The strategy's other settings follow the binary's rule: those that change the step's
        // numbers are fixed by the checkpoint (`timeout` and `keep_rank_checkpoints` may
        // change).
        let now = crate::state::fixed_settings(self.shared.config);
        if let Some(saved) = &state.settings
            && let Some((was, is)) = saved.iter().zip(&now).find(|(a, b)| a != b)
        {
            return Err(StrategyError::Resume(format!(
                "the checkpoint after epoch {epoch} was written with `{was}`, this run has \
                 `{is}`: the step's numbers depend on it; resume with `{was}`, or start a new \
                 run in another directory"
            )));
        }
        if let Some(c) = &self.checkpointer {
            let model = dir.model_path(self.rank, epoch);
            if !model.exists() {
                return Err(StrategyError::Resume(format!(
                    "resuming after epoch {epoch} needs rank {}'s checkpoint {}; the strategy \
                     keeps the last `keep_rank_checkpoints` epochs",
                    self.rank,
                    model.display()
                )));
            }
            let mut learner = lock(&self.learner);
            *learner = c.load_checkpoint(learner.clone(), epoch);
            self.model = Some(learner.model());
        }
        self.pipeline.restore(pipeline_state.into_restored())?;
        Ok(())
    }

    /// Rank 0's view of the interrupter, agreed by every rank (one 1-byte collective).
    fn agree_to_continue(&self, rank0_wants: bool) -> Result<bool, StrategyError> {
        let mine = self.rank != 0 || rank0_wants;
        Ok(self.group.all_true(mine)?)
    }

    fn with_components<T>(&self, f: impl FnOnce(&mut TrainingComponents<M>) -> T) -> T {
        f(&mut lock(self.shared.components))
    }

    /// The current model: the pipeline's, or the learner's if an iteration failed with it.
    fn current_model(&self) -> M {
        match &self.model {
            Some(m) => m.clone(),
            None => lock(&self.learner).model(),
        }
    }

    /// Put the pipeline's model (averaged after the last step) into the learner, for
    /// validation and checkpoints (buffers with the last forward's update).
    fn sync_learner(&mut self) {
        if let Some(m) = self.model.take() {
            let m = refresh_buffers(m);
            lock(&self.learner).load_model(m.clone().into_record());
            self.model = Some(m);
        }
    }

    /// Train epochs `from..=num_epochs`. The job's `first` world takes the shards sliced
    /// before the ranks started; a world after a failure deals the training loader again over
    /// its ranks, in rank order.
    fn run(&mut self, from: usize, first: bool) -> Result<(), StrategyError> {
        let shared = self.shared;
        let n = shared.train_items;
        let shard = if first {
            lock(shared.shards)
                .get_mut(self.rank)
                .and_then(Option::take)
                .ok_or_else(|| {
                    StrategyError::Config(format!(
                        "rank {}: no shard of the training data",
                        self.rank
                    ))
                })?
        } else {
            let (r, w) = (self.rank, self.world);
            shared.train.slice(r * n / w, (r + 1) * n / w)
        }
        .to_device(shared.device);
        // Only rank 0 validates (and forks the validation loader's generator).
        let valid =
            (self.rank == 0).then(|| shared.valid.to_device(&shared.device.clone().inner()));
        // A shuffling loader draws each epoch's order from its generator when the epoch's
        // iterator is made (burn's `DataLoader::iter`): a resumed run draws, and drops, one per
        // epoch already trained, so that its epochs see the uninterrupted run's orders. (A
        // multi-threaded loader's workers may batch an item of each before they see the
        // iterator gone.)
        for _ in 1..from {
            drop(shard.iter());
            if let Some(valid) = &valid {
                drop(valid.iter());
            }
        }
        let interrupter = shared.interrupter;
        for epoch in from..=shared.num_epochs {
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
            self.sync_learner();
            if self.rank == 0 {
                // burn-train's application logger (`experiment.log`) records tracing events.
                let t = self.group.traffic() - self.traffic_start;
                tracing::info!(
                    epoch,
                    collectives = t.collectives,
                    bytes = t.bytes,
                    data_bytes = t.data_bytes,
                    "localsgd: rank 0 has sent {} bytes in {} collectives since the run started",
                    t.bytes,
                    t.collectives
                );
            }
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
            if let Some(valid) = &valid {
                self.validate(&**valid, epoch);
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

    /// One pass over this rank's shard, one pipeline iteration per optimizer step; rank 0 feeds
    /// each micro-batch's output to burn-train's event processor.
    fn train_epoch(
        &mut self,
        shard: &dyn DataLoader<<M as TrainStep>::Input>,
        total_items: usize,
    ) -> Result<(), StrategyError> {
        let shared = self.shared;
        let progress = Rc::new(RefCell::new(Progress::new(0, total_items, None)));
        let outputs = Rc::new(RefCell::new(Vec::new()));
        let mut source = LoaderSource {
            iter: shard.iter(),
            interrupter: shared.interrupter,
            watch_interrupter: self.rank == 0,
            progress: progress.clone(),
        };
        let mut step = LearnerStep::<M> {
            outputs: outputs.clone(),
        };
        let mut events = Events {
            shared,
            recovery: self.recovery.as_deref_mut(),
            learner: &self.learner,
            feeds: self.rank == 0,
            world: self.world,
            total_items,
            progress,
            outputs,
            batches: 0,
        };
        let model = self
            .model
            .take()
            .unwrap_or_else(|| lock(&self.learner).model());
        // The epoch ends when any rank's shard runs dry or rank 0 is interrupted (its source
        // then reports no batch): every rank ends it together.
        let (model, _) =
            self.pipeline
                .run_epoch(model, &mut source, &mut step, &mut events, None)?;
        self.model = Some(model);
        Ok(())
    }

    /// Rank 0 validates its own model on the whole validation set (burn-train's loop).
    fn validate(&self, valid: &dyn DataLoader<<M as InferenceStep>::Input>, epoch: usize) {
        let interrupter = self.shared.interrupter;
        let model = self.current_model().valid();
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
    /// writes the pipeline's state beside them (an overlapped average or a Streaming DiLoCo
    /// fragment in flight completes its collective, and stays pending).
    fn checkpoint(&mut self, epoch: usize) -> Result<(), StrategyError> {
        self.sync_learner();
        {
            let learner = lock(&self.learner);
            if self.rank == 0 {
                self.with_components(|c| {
                    if let Some(ckpt) = &mut c.checkpointer {
                        ckpt.checkpoint(&learner, epoch, &c.event_store);
                    }
                });
            } else if let Some(ckpt) = &mut self.checkpointer {
                ckpt.checkpoint(&learner, epoch, self.shared.event_store);
            }
        }
        if let Some(dir) = self.shared.state_dir {
            let pipeline = PipelineState::capture(&mut self.pipeline)?;
            let state = self.rank_state(pipeline.iterations_done);
            dir.save(
                &state,
                &pipeline,
                epoch,
                self.shared.config.keep_rank_checkpoints,
            )?;
            self.save_recovery(epoch, &pipeline)?;
        }
        Ok(())
    }

    /// After the last epoch: a pending overlapped average applied, the helper communicator
    /// closed, the world average of the final models and every rank's counters (collective).
    fn finish(&mut self) -> Result<RankEnd<M>, StrategyError> {
        let model = self.current_model();
        let own = self.pipeline.finish(model)?;
        lock(&self.learner).load_model(own.clone().into_record());
        self.model = Some(own.clone());
        let traffic = self.group.traffic() - self.traffic_start;
        let averaged = match self.shared.config.algorithm.kind {
            // DDP's replicas are equal: their mean is any of them.
            AlgorithmKind::Ddp => own.clone(),
            _ => self.pipeline.world_average(own.clone())?,
        };
        let mine = RankReport {
            rank: self.rank,
            iterations: self.pipeline.iteration(),
            skipped_steps: self.pipeline.skipped_steps(),
            traffic,
        };
        let ranks = RankReport::gather(&self.group, &mine)?;
        if let Some(recovery) = self.recovery.as_deref_mut() {
            recovery.finished()?;
        }
        Ok(RankEnd {
            rank: self.rank,
            own,
            averaged: Some(averaged),
            ranks: Some(ranks),
            error: None,
        })
    }
}
