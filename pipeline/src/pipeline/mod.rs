//! The phase-ordered step pipeline.
//!
//! One iteration is the fixed sequence [`ITERATION_ORDER`]: fetch a batch (local) → agree that
//! every rank still has data (one small collective) → forward/backward (local) → gradient sync
//! (the comm hook) → optimizer step (local) → model averaging → metrics → checkpoint. The sequence
//! is run by [`Pipeline::run_iteration`] and nowhere else, so every rank issues the same
//! collectives in the same order — averaging can never race with another collective the way an
//! "average inside `optimizer.step()`" design can (the book's semantics §5).
//!
//! A fresh run broadcasts rank 0's parameters and buffers before its first
//! iteration (as DDP does at construction); the buffer policy broadcasts rank 0's buffers in the
//! has-data phase or averages them in the averaging phase. Gradient accumulation at an epoch's end
//! (semantics §5.1) is decided in the fetch and has-data phases. With an outer averager, `θ` is taken
//! in iteration 0's forward/backward phase, SlowMo gets the inner learning rate in the optimizer
//! phase, and the outer step runs in the averaging phase. A pending overlapped average is completed
//! (not applied) and saved by the checkpoint phase, and applied by `Pipeline::finish` after the last
//! iteration.

pub(crate) mod error;
mod inner;
mod iteration;
mod observer;
mod phase;
mod source;
mod step;

pub use error::{PipelineError, is_peer_lost};
pub use inner::InnerOptimizer;
pub use observer::{EpochEnd, IterationObserver, IterationReport, NoObserver, ObserverError};
pub use phase::{ITERATION_ORDER, Phase, PhaseTimes};
pub use source::{BatchSource, DataPosition, IterSource, SourceError};
pub use step::{ForwardBackward, LossFn, MicroBatch, StepOutput};

use inner::Inner;
use iteration::Iteration;

use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;
use localsgd_averagers::{
    AverageParameters, AveragerState, ModelAverager, OuterState, PendingAverage, average_in_group,
    broadcast_in_group,
};
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_grads, grads_from_flat};
use localsgd_comm::{Group, GroupExt, ReduceOp, Traffic};
use localsgd_hooks::{CommHook, GradientReducer, HookState};
use std::time::Instant;

/// Knobs of the pipeline itself (the algorithm lives in the hook and averager).
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineOptions {
    /// Learning rate passed to the optimizer (without a scheduler; see
    /// [`Pipeline::with_lr_scheduler`]).
    pub lr: f64,
    /// Clip the gradients' global L2 norm (over all parameters, after gradient sync, before
    /// the optimizer) to this value, as `torch.nn.utils.clip_grad_norm_(params, max_norm)`:
    /// every gradient is multiplied by `min(1, max_norm / (norm + 1e-6))`. `None`: no clipping.
    /// (burn's own `GradientClippingConfig::Norm` clips each tensor separately, which PyTorch
    /// does not.)
    pub clip_grad_norm: Option<f64>,
    /// Micro-batches per optimizer step (gradient accumulation; 1: none). Each iteration fetches
    /// this many batches, runs `loss / accumulate` backward on each and sums the gradients (what
    /// PyTorch's usual accumulation loop computes), then syncs, steps and averages once: the
    /// hook's `iter`, the averager's step and the schedule count optimizer steps. Every
    /// micro-batch is trained: what happens at an epoch's end is [`accumulation`]'s rule. The
    /// reported loss is the mean of the micro-batches' losses.
    ///
    /// [`accumulation`]: Self::accumulation
    pub accumulate: usize,
    /// How a step's micro-batches meet an epoch's end (semantics §5.1). Default
    /// [`Accumulation::Stream`], PyTorch's iteration-based loops.
    pub accumulation: Accumulation,
    /// Skip the optimizer step when a gradient is NaN or infinite (counted and reported). Model
    /// averaging still runs, so counters stay aligned on all ranks.
    pub skip_non_finite: bool,
    /// All-reduce the loss across ranks every this many iterations (0: never).
    pub metrics_every: u64,
    /// Call the checkpointer every this many iterations (0: never).
    pub checkpoint_every: u64,
    /// Before the first iteration of a fresh run (not a resumed one), give every rank rank 0's
    /// parameters and buffers, as PyTorch's `DistributedDataParallel(model)` does at
    /// construction: replicas initialised differently (burn draws fresh weights per process)
    /// start equal. Default `true`.
    pub broadcast_start: bool,
    /// What happens to buffers (float tensors without gradients, e.g. BatchNorm's running
    /// statistics) during training. Default [`BufferPolicy::Broadcast`], DDP's.
    pub buffers: BufferPolicy,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            lr: 0.1,
            skip_non_finite: false,
            metrics_every: 0,
            checkpoint_every: 0,
            broadcast_start: true,
            buffers: BufferPolicy::Broadcast,
            clip_grad_norm: None,
            accumulate: 1,
            accumulation: Accumulation::Stream,
        }
    }
}

/// The buffer policy of [`PipelineOptions::buffers`]. Buffers are the float tensors that do not
/// require a gradient ([`ParamSelection::buffers`]): burn's `RunningState` (BatchNorm's running
/// mean and variance) and frozen parameters. A model without any costs nothing whatever the
/// policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum BufferPolicy {
    /// Every iteration, before the forward pass, every rank takes rank 0's buffers (one fused
    /// broadcast in the `AgreeHasData` phase): PyTorch DDP's default `broadcast_buffers=True`.
    #[default]
    Broadcast,
    /// At every averaging step, after the parameters, the buffers are averaged over the same
    /// group (one fused all-reduce in the `ModelAveraging` phase). PyTorch's averagers average
    /// parameters only: this is ours, for local SGD with BatchNorm.
    Average,
    /// Never communicated: each rank keeps its own statistics.
    Local,
}

/// What a step's micro-batches do at an epoch's end ([`PipelineOptions::accumulation`]). Both
/// rules train on every micro-batch; each micro-batch's loss is divided by `accumulate` (also
/// in a step of fewer), as PyTorch's accumulation loops and Lightning do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Accumulation {
    /// One stream of micro-batches across epochs, as an iteration-based PyTorch loop draws
    /// them: a step whose source runs dry asks it for its next epoch
    /// (`BatchSource::next_epoch`) and goes on filling there. Where the source has no next
    /// epoch (the end of the run's data) the micro-batches fetched make a last step of fewer.
    #[default]
    Stream,
    /// Lightning's rule: the last step of every epoch takes the micro-batches left, fewer than
    /// `accumulate` when the epoch's batches are not a multiple of it; the next epoch starts a
    /// fresh step.
    EpochEnd,
}

/// Result of [`Pipeline::run_iteration`].
#[derive(Debug)]
// One value per iteration, moved once: boxing the report would cost an allocation each time.
#[allow(clippy::large_enum_variant)]
pub enum Outcome<M> {
    /// An iteration ran.
    Trained(M, IterationReport),
    /// Some rank ran out of data: every rank ends the epoch here, together.
    EndOfData(M),
}

/// What a checkpoint gives back to a pipeline ([`Pipeline::restore`]).
#[derive(Default)]
pub struct RestoredState {
    /// Iterations completed before the checkpoint.
    pub iterations_done: u64,
    /// Optimizer steps skipped for non-finite gradients before the checkpoint.
    pub skipped_steps: u64,
    /// The optimizer with its saved state (momentum, Adam moments); `None` keeps the pipeline's
    /// own (an inner optimizer that restores itself, as burn-train's `Learner` does).
    pub optimizer: Option<ModuleOptimizer>,
    /// The averager's state (its step counter), if the run averages.
    pub averager: Option<AveragerState>,
    /// The hook's state (the post-local SGD `iter`), if the run syncs gradients.
    pub hook: Option<HookState>,
    /// An overlapped average started and not yet applied.
    pub pending_average: Option<PendingAverage>,
    /// The outer averager's `θ`, outer momentum and outer-step count.
    pub outer: Option<OuterState>,
}

/// Everything a checkpoint needs from the pipeline at the end of an iteration.
pub struct CheckpointContext<'a, M> {
    /// Iterations completed so far.
    pub iterations_done: u64,
    /// Optimizer steps skipped so far.
    pub skipped_steps: u64,
    /// The model after this iteration.
    pub model: &'a M,
    /// The optimizer (its record holds momentum/Adam state).
    pub optimizer: &'a ModuleOptimizer,
    /// Averager state (its step counter), if an averager is configured.
    pub averager: Option<AveragerState>,
    /// An overlapped average started and not yet applied (its collective completed for the
    /// checkpoint), to be restored with [`Pipeline::restore`].
    pub pending_average: Option<PendingAverage>,
    /// The outer averager's `θ`, outer momentum and outer-step count (`diloco`, `slowmo`), to
    /// be restored with [`Pipeline::restore`].
    pub outer: Option<OuterState>,
    /// Hook state (e.g. the post-local SGD `iter`), if a hook is configured.
    pub hook: Option<HookState>,
    /// Where the batch source stands.
    pub data: Option<DataPosition>,
    /// The world group (checkpointers may synchronize on it).
    pub group: &'a Group,
}

/// Called by the checkpoint phase.
pub type Checkpointer<M> =
    Box<dyn FnMut(&CheckpointContext<'_, M>) -> Result<(), PipelineError> + Send>;

/// Called after each phase with the phase and the number of collectives it issued (tests and
/// tracing use it to observe the iteration order).
pub type PhaseObserver = Box<dyn FnMut(Phase, u64) + Send>;

/// Gradient synchronization: a comm hook plus the bucketing reducer that feeds it.
#[derive(Debug)]
pub struct GradientSync {
    /// The hook run on every bucket.
    pub hook: Box<dyn CommHook>,
    /// Buckets the gradients in reverse traversal order.
    pub reducer: GradientReducer,
}

/// The distributed part of a training loop. Users bring the model, loss, optimizer and data;
/// the pipeline runs the phases.
pub struct Pipeline<M> {
    group: Group,
    inner: Inner<M>,
    sync: Option<GradientSync>,
    averager: Option<Box<dyn ModelAverager>>,
    options: PipelineOptions,
    iteration: u64,
    skipped_steps: u64,
    /// The start broadcast is still to run (fresh run with `broadcast_start`).
    start_pending: bool,
    /// What the start broadcast sent (nothing until it ran).
    start_traffic: Traffic,
    /// The group's traffic when the pipeline was built.
    traffic_origin: Traffic,
    times: PhaseTimes,
    checkpointer: Option<Checkpointer<M>>,
    observer: Option<PhaseObserver>,
}

impl<M: Module> Pipeline<M> {
    /// A pipeline on `group` with `optimizer`, no gradient sync and no averaging (add them with
    /// [`with_gradient_sync`](Self::with_gradient_sync) and [`with_averager`](Self::with_averager)).
    pub fn new(group: Group, optimizer: ModuleOptimizer, options: PipelineOptions) -> Self {
        let lr = options.lr;
        Self::with_inner(
            group,
            Inner::Module {
                optimizer,
                scheduler: None,
                lr,
            },
            options,
        )
    }

    /// A pipeline that steps through `optimizer`, whose state (and learning-rate schedule) the
    /// pipeline does not own: burn-train's `Learner` (the `localsgd-learner` strategy). Its
    /// `options.lr` and [`with_lr_scheduler`](Self::with_lr_scheduler) are unused; its
    /// checkpoint phase cannot save the optimizer ([`PipelineError::Config`] if one is due).
    pub fn with_inner_optimizer(
        group: Group,
        optimizer: Box<dyn InnerOptimizer<M>>,
        options: PipelineOptions,
    ) -> Self {
        Self::with_inner(group, Inner::Custom(optimizer), options)
    }

    fn with_inner(group: Group, inner: Inner<M>, options: PipelineOptions) -> Self {
        let broadcast_start = options.broadcast_start;
        let traffic_origin = group.traffic();
        Self {
            group,
            inner,
            sync: None,
            averager: None,
            options,
            iteration: 0,
            skipped_steps: 0,
            start_pending: broadcast_start,
            start_traffic: Traffic::default(),
            traffic_origin,
            times: PhaseTimes::default(),
            checkpointer: None,
            observer: None,
        }
    }

    /// Communicate gradients through `hook` (bucketed by `reducer`).
    pub fn with_gradient_sync(mut self, hook: Box<dyn CommHook>, reducer: GradientReducer) -> Self {
        self.sync = Some(GradientSync { hook, reducer });
        self
    }

    /// Take each optimizer step's learning rate from `scheduler` (any burn scheduler, or a
    /// [`LrSchedule`](crate::lr_schedule::LrSchedule)), stepped once per iteration, also when
    /// the step is skipped for non-finite gradients, so the schedule follows the iteration count
    /// on every rank. On a resumed pipeline (before or after [`restore`](Self::restore)) the
    /// scheduler is replayed to the restored iteration: exact for schedules that depend on the
    /// step count alone, as all of burn's and ours do. Unused with an
    /// [`InnerOptimizer`], which schedules its own rate.
    pub fn with_lr_scheduler(mut self, scheduler: ModuleLrScheduler) -> Self {
        if let Inner::Module {
            scheduler: slot, ..
        } = &mut self.inner
        {
            *slot = Some(scheduler);
            let done = self.iteration;
            self.inner.replay_schedule(done);
        }
        self
    }

    /// Sync gradients and average models as `parts` says (what
    /// [`algorithm::build`](crate::algorithm::build) made for an algorithm): its hook and reducer
    /// through [`with_gradient_sync`](Self::with_gradient_sync), its averager through
    /// [`with_averager`](Self::with_averager), each when there is one.
    pub fn with_parts(self, parts: crate::algorithm::AlgorithmParts) -> Self {
        let mut pipeline = self;
        if let Some((hook, reducer)) = parts.sync {
            pipeline = pipeline.with_gradient_sync(hook, reducer);
        }
        match parts.averager {
            Some(averager) => pipeline.with_averager(averager),
            None => pipeline,
        }
    }

    /// Average models with `averager` after every optimizer step.
    pub fn with_averager(mut self, averager: Box<dyn ModelAverager>) -> Self {
        self.averager = Some(averager);
        self
    }

    /// Save checkpoints with `checkpointer` every `options.checkpoint_every` iterations.
    pub fn with_checkpointer(mut self, checkpointer: Checkpointer<M>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// Observe every phase as it completes.
    pub fn with_observer(mut self, observer: PhaseObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Iterations completed.
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// Optimizer steps skipped for non-finite gradients.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped_steps
    }

    /// What this rank has sent since the pipeline was built: every phase of every iteration,
    /// the start broadcast, and the collectives of the checkpoint phase, on the pipeline's
    /// group and the groups made from it (the running total that
    /// [`IterationReport::traffic`] adds up, plus the start broadcast).
    pub fn traffic(&self) -> Traffic {
        self.group.traffic() - self.traffic_origin
    }

    /// What this rank's start broadcast sent (rank 0's parameters and buffers before the first
    /// iteration of a fresh run, with [`PipelineOptions::broadcast_start`]): counted by the
    /// group's [`traffic`](localsgd_comm::ProcessGroup::traffic), not by any iteration's
    /// [`IterationReport::traffic`]. Zero before it ran, and on a resumed run.
    pub fn start_traffic(&self) -> Traffic {
        self.start_traffic
    }

    /// Accumulated wall time per phase.
    pub fn phase_times(&self) -> &PhaseTimes {
        &self.times
    }

    /// The world group.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// burn's optimizer (its record holds momentum and Adam state); `None` for a pipeline built
    /// [`with_inner_optimizer`](Self::with_inner_optimizer).
    pub fn optimizer(&self) -> Option<&ModuleOptimizer> {
        self.inner.module_optimizer()
    }

    /// The averager, if any.
    pub fn averager(&self) -> Option<&dyn ModelAverager> {
        self.averager.as_deref()
    }

    /// The hook, if any.
    pub fn hook(&self) -> Option<&dyn CommHook> {
        self.sync.as_ref().map(|s| &*s.hook)
    }

    /// Restore the counters and component states saved in a checkpoint, including an
    /// overlapped average that was pending and an outer averager's `θ` and momentum (which an
    /// outer averager requires). The caller restores the model parameters and the data
    /// position. Fails, before changing the averager, when the saved states do not fit it.
    pub fn restore(&mut self, state: RestoredState) -> Result<(), PipelineError> {
        let RestoredState {
            iterations_done,
            skipped_steps,
            optimizer,
            averager,
            hook,
            pending_average,
            outer,
        } = state;
        let (averager, hook, outer) = (averager.as_ref(), hook.as_ref(), outer.as_ref());
        match (self.averager.as_mut().and_then(|a| a.outer_mut()), outer) {
            (Some(o), Some(state)) => o.load_global_state(state)?,
            (None, None) => {}
            (Some(_), None) => {
                return Err(PipelineError::Config(
                    "the checkpoint holds no outer-optimizer state (θ, outer momentum), which \
                     this run's outer averager needs to continue exactly"
                        .into(),
                ));
            }
            (None, Some(_)) => {
                return Err(PipelineError::Config(
                    "the checkpoint holds an outer-optimizer state but this run has no outer \
                     averager"
                        .into(),
                ));
            }
        }
        match (&mut self.averager, averager) {
            (Some(a), Some(s)) => {
                a.load_state(s)?;
                match (a.overlap_mut(), pending_average) {
                    (Some(overlap), Some(p)) => overlap.restore(p)?,
                    (_, None) => {}
                    (None, Some(p)) => {
                        return Err(PipelineError::Config(format!(
                            "the checkpoint holds an overlapped average started at step {} but \
                             this run averages without overlap",
                            p.started_at
                        )));
                    }
                }
            }
            (None, None) => {}
            (a, s) => {
                return Err(PipelineError::Config(format!(
                    "checkpoint {} averager state but the pipeline {} an averager",
                    if s.is_some() { "has" } else { "has no" },
                    if a.is_some() { "has" } else { "has no" }
                )));
            }
        }
        match (&mut self.sync, hook) {
            (Some(sync), Some(s)) => sync.hook.load_state(s)?,
            (None, None) => {}
            (a, s) => {
                return Err(PipelineError::Config(format!(
                    "checkpoint {} hook state but the pipeline {} a gradient hook",
                    if s.is_some() { "has" } else { "has no" },
                    if a.is_some() { "has" } else { "has no" }
                )));
            }
        }
        match (&mut self.inner, optimizer) {
            (
                Inner::Module {
                    optimizer: slot, ..
                },
                Some(optimizer),
            ) => *slot = optimizer,
            (Inner::Custom(_), Some(_)) => {
                return Err(PipelineError::Config(
                    "a restored burn optimizer was given to a pipeline whose inner optimizer \
                     keeps its own state (`with_inner_optimizer`): restore that optimizer \
                     instead"
                        .into(),
                ));
            }
            (_, None) => {}
        }
        self.inner.replay_schedule(iterations_done);
        self.iteration = iterations_done;
        self.skipped_steps = skipped_steps;
        // A resumed run continues from each rank's own saved state (local SGD replicas differ
        // legitimately between averages): no start broadcast.
        self.start_pending = false;
        Ok(())
    }

    /// Run one iteration, every phase of [`ITERATION_ORDER`] in order, with `loss_fn` as the
    /// forward/backward phase (`loss_fn(model, batch)` is the batch's mean loss; see
    /// [`LossFn`]).
    pub fn run_iteration<B>(
        &mut self,
        model: M,
        source: &mut dyn BatchSource<B>,
        loss_fn: &dyn Fn(&M, &B) -> Tensor<1>,
    ) -> Result<Outcome<M>, PipelineError> {
        self.run_iteration_with(model, source, &mut LossFn(loss_fn))
    }

    /// Run one iteration, every phase of [`ITERATION_ORDER`] in order, with `step` as the
    /// forward/backward phase. Each phase is one method; the order below is the only place the
    /// phases are sequenced.
    pub fn run_iteration_with<B>(
        &mut self,
        model: M,
        source: &mut dyn BatchSource<B>,
        step: &mut dyn ForwardBackward<M, B>,
    ) -> Result<Outcome<M>, PipelineError> {
        // Setup, not part of iteration 0's counters (like creating subgroups).
        let model = self.start(model)?;
        let mut it = Iteration::new(self.group.traffic());
        self.phase(Phase::FetchBatch, &mut it, |p, it| {
            p.fetch_batch(source, it)
        })?;
        let (model, go) = self.phase(Phase::AgreeHasData, &mut it, |p, it| {
            p.agree_has_data(model, it)
        })?;
        if !go {
            return Ok(Outcome::EndOfData(model));
        }
        let model = self.phase(Phase::ForwardBackward, &mut it, |p, it| {
            p.forward_backward(model, step, it)
        })?;
        self.phase(Phase::GradientSync, &mut it, |p, it| {
            p.gradient_sync(&model, it)
        })?;
        let model = self.phase(Phase::OptimizerStep, &mut it, |p, it| {
            p.optimizer_step(model, it)
        })?;
        let model = self.phase(Phase::ModelAveraging, &mut it, |p, it| {
            p.model_averaging(model, it)
        })?;
        self.phase(Phase::Metrics, &mut it, |p, it| p.metrics(it))?;
        let model = self.phase(Phase::Checkpoint, &mut it, |p, _| {
            p.checkpoint(model, &*source)
        })?;
        Ok(Outcome::Trained(
            model,
            self.complete(it, source.position()),
        ))
    }

    /// Run iterations of `step` on `source` until the epoch ends (every rank out of data
    /// together), `budget` iterations are done in all (counted as [`iteration`](Self::iteration)
    /// counts, resumed ones included) or `observer` stops; `observer` sees every completed
    /// iteration. Returns the model and why it stopped. The loop of a training run is this call
    /// once per epoch, moving the source to its next epoch after [`EpochEnd::EndOfData`].
    pub fn run_epoch<B>(
        &mut self,
        model: M,
        source: &mut dyn BatchSource<B>,
        step: &mut dyn ForwardBackward<M, B>,
        observer: &mut dyn IterationObserver<M>,
        budget: Option<u64>,
    ) -> Result<(M, EpochEnd), PipelineError> {
        let mut model = model;
        loop {
            if budget.is_some_and(|b| self.iteration >= b) {
                return Ok((model, EpochEnd::Budget));
            }
            observer
                .before_iteration(self.iteration)
                .map_err(PipelineError::Observer)?;
            match self.run_iteration_with(model, source, step)? {
                Outcome::EndOfData(m) => return Ok((m, EpochEnd::EndOfData)),
                Outcome::Trained(m, report) => {
                    let go_on = observer
                        .after_iteration(&report, &m)
                        .map_err(PipelineError::Observer)?;
                    model = m;
                    if !go_on {
                        return Ok((model, EpochEnd::Stopped));
                    }
                }
            }
        }
    }

    /// Run `f` as `phase`: its wall time (less the gradient-sync wait booked inside it) and the
    /// collectives it issued go to the phase's counters and the observer.
    fn phase<B, T>(
        &mut self,
        phase: Phase,
        it: &mut Iteration<B>,
        f: impl FnOnce(&mut Self, &mut Iteration<B>) -> Result<T, PipelineError>,
    ) -> Result<T, PipelineError> {
        let started = Instant::now();
        let collectives_before = self.group.traffic().collectives;
        let out = f(self, it)?;
        let waited = std::mem::take(&mut it.waited);
        it.times
            .add(phase, started.elapsed().saturating_sub(waited));
        it.times.add(Phase::GradientSync, waited);
        if let Some(obs) = &mut self.observer {
            obs(phase, self.group.traffic().collectives - collectives_before);
        }
        Ok(out)
    }

    /// The run's start: DDP's construction-time broadcast of rank 0's parameters and buffers
    /// (with [`PipelineOptions::broadcast_start`], on a fresh run; a restored one continues
    /// from each rank's own state), once; afterwards, and when nothing is pending, the model
    /// is returned as it is. The first iteration does it if it was not called; call it to have
    /// the ranks agree on the start before anything else happens (its traffic:
    /// [`start_traffic`](Self::start_traffic)). Collective.
    pub fn start(&mut self, model: M) -> Result<M, PipelineError> {
        if !self.start_pending {
            return Ok(model);
        }
        let before = self.group.traffic();
        let m = broadcast_in_group(refresh_buffers(model), &ParamSelection::All, &self.group, 0)?;
        self.start_traffic = self.group.traffic() - before;
        self.start_pending = false;
        Ok(m)
    }

    /// [`Phase::FetchBatch`]: this step's micro-batches from the local source, across an
    /// epoch's end under [`Accumulation::Stream`].
    fn fetch_batch<B>(
        &mut self,
        source: &mut dyn BatchSource<B>,
        it: &mut Iteration<B>,
    ) -> Result<(), PipelineError> {
        let micro = self.options.accumulate.max(1);
        while it.batches.len() < micro {
            match source.next_batch().map_err(PipelineError::Data)? {
                Some(b) => it.batches.push(b),
                None if !it.batches.is_empty()
                    && self.options.accumulation == Accumulation::Stream
                    && source.next_epoch().map_err(PipelineError::Data)? => {}
                None => break,
            }
        }
        Ok(())
    }

    /// [`Phase::AgreeHasData`]: how many micro-batches every rank has for this step (one small
    /// all-gather; none on some rank, or counts that differ, end the epoch on every rank
    /// together, the fetched ones untrained), then [`BufferPolicy::Broadcast`]'s buffers from
    /// rank 0. A full step on every rank is the rule; a step of fewer is the end of an epoch
    /// (or of the data) under [`Accumulation`]'s rules.
    fn agree_has_data<B>(
        &mut self,
        model: M,
        it: &mut Iteration<B>,
    ) -> Result<(M, bool), PipelineError> {
        let counts = self
            .group
            .all_gather_u64(&[it.batches.len() as u64])
            .map_err(PipelineError::comm(Phase::AgreeHasData))?;
        let mine = it.batches.len() as u64;
        if mine == 0 || counts.iter().any(|&c| c != mine) {
            return Ok((model, false));
        }
        let model = match self.options.buffers {
            BufferPolicy::Broadcast => broadcast_buffers(model, &self.group)?,
            _ => model,
        };
        Ok((model, true))
    }

    /// [`Phase::ForwardBackward`]: `step` on every micro-batch, gradients summed; an outer
    /// averager takes `θ` here before the first optimizer step.
    fn forward_backward<B>(
        &mut self,
        model: M,
        step: &mut dyn ForwardBackward<M, B>,
        it: &mut Iteration<B>,
    ) -> Result<M, PipelineError> {
        let batches = std::mem::take(&mut it.batches);
        let fetched = batches.len();
        it.micro_batches = fetched;
        // Each micro-batch's loss is divided by the nominal count, also in a step of fewer.
        let count = self.options.accumulate.max(1);
        let mut losses = Vec::with_capacity(count);
        let grads = if fetched == 1 {
            let Some(batch) = batches.into_iter().next() else {
                return Err(PipelineError::Config("no batch after agreement".into()));
            };
            let out = step
                .forward_backward(&model, batch, MicroBatch { index: 0, count })
                .map_err(PipelineError::Data)?;
            losses.extend(out.loss);
            out.grads
        } else {
            let mut sum = GradientsAccumulator::<M>::new();
            for (index, batch) in batches.into_iter().enumerate() {
                let out = step
                    .forward_backward(&model, batch, MicroBatch { index, count })
                    .map_err(PipelineError::Data)?;
                losses.extend(out.loss);
                sum.accumulate(&model, out.grads);
            }
            sum.grads()
        };
        // The step's loss: the mean over the micro-batches it took.
        it.loss = (losses.len() == fetched && fetched > 0)
            .then(|| losses.iter().sum::<f32>() / fetched as f32);
        // An outer averager's θ: the model before the first optimizer step (equal on every
        // rank after the start broadcast), over the parameters with a gradient (those it will
        // synchronise). Resumed runs restore θ instead.
        if let Some(outer) = self.averager.as_mut().and_then(|a| a.outer_mut())
            && outer.global_params().is_none()
        {
            outer.reset_global(&model, &ParamSelection::with_grads(&model, &grads))?;
        }
        it.grads = Some(grads);
        Ok(model)
    }

    /// [`Phase::GradientSync`]: start every bucket's collective through the hook (blocking
    /// reducers finish here; pipelined ones in the optimizer phase).
    fn gradient_sync<B>(&mut self, model: &M, it: &mut Iteration<B>) -> Result<(), PipelineError> {
        if let Some(sync) = &mut self.sync
            && let Some(g) = it.grads.take()
        {
            it.in_flight = Some(sync.reducer.start(model, g, &mut *sync.hook)?);
        }
        Ok(())
    }

    /// [`Phase::OptimizerStep`]: the learning rate of this step (also when it is skipped), then
    /// the step: bucket by bucket as a pipelined sync's averages arrive, or once over all
    /// gradients (skipped for non-finite ones, clipped first when set).
    fn optimizer_step<B>(&mut self, model: M, it: &mut Iteration<B>) -> Result<M, PipelineError> {
        let lr = self.inner.next_lr();
        it.lr = lr.base();
        // SlowMo's slow step divides by the learning rate of the step just taken.
        if let Some(outer) = self.averager.as_mut().and_then(|a| a.outer_mut()) {
            outer.set_inner_lr(it.lr);
        }
        // The averager averages "parameters that had a gradient this step": note them before
        // the optimizer consumes the gradients, only when an averaging is due.
        let note_selection = self
            .averager
            .as_ref()
            .is_some_and(|a| a.scheduled_group().is_some());
        match it.in_flight.take() {
            Some(mut parts)
                if parts.is_pipelined()
                    && !self.options.skip_non_finite
                    && self.options.clip_grad_norm.is_none() =>
            {
                if note_selection {
                    it.selection = Some(parts.selection(&model));
                }
                let mut model = model;
                loop {
                    let waiting = Instant::now();
                    let Some(g) = parts.next_part(&model)? else {
                        break;
                    };
                    it.waited += waiting.elapsed();
                    model = self.inner.step(lr.clone(), model, g);
                }
                Ok(model)
            }
            parts => {
                let g = match parts {
                    Some(parts) => {
                        let waiting = Instant::now();
                        let g = parts.wait_all(&model)?;
                        it.waited += waiting.elapsed();
                        g
                    }
                    None => it.grads.take().unwrap_or_default(),
                };
                if note_selection {
                    it.selection = Some(ParamSelection::with_grads(&model, &g));
                }
                if self.options.skip_non_finite && !grads_finite(&model, &g)? {
                    it.skipped_step = true;
                    self.skipped_steps += 1;
                    return Ok(model);
                }
                let g = match self.options.clip_grad_norm {
                    Some(max_norm) => clip_grad_norm(&model, g, max_norm)?,
                    None => g,
                };
                Ok(self.inner.step(lr, model, g))
            }
        }
    }

    /// [`Phase::ModelAveraging`]: the averager, once per iteration (also after a skipped step),
    /// with [`BufferPolicy::Average`]'s buffers on an averaging step.
    fn model_averaging<B>(&mut self, model: M, it: &mut Iteration<B>) -> Result<M, PipelineError> {
        let Some(averager) = &mut self.averager else {
            return Ok(model);
        };
        let selection = it
            .selection
            .take()
            .unwrap_or_else(|| ParamSelection::ids(std::iter::empty()));
        let buffers_group = match self.options.buffers {
            BufferPolicy::Average => averager.scheduled_group(),
            _ => None,
        };
        let model = averager.average_parameters(model, &selection)?;
        match buffers_group {
            Some(group) => average_buffers(model, &group),
            None => Ok(model),
        }
    }

    /// [`Phase::Metrics`]: every `metrics_every` iterations the loss averaged over the ranks.
    fn metrics<B>(&mut self, it: &mut Iteration<B>) -> Result<(), PipelineError> {
        let every = self.options.metrics_every;
        if every > 0 && (self.iteration + 1).is_multiple_of(every) {
            let mut v = [it.loss.map_or(f64::NAN, f64::from)];
            self.group
                .all_reduce_slice(&mut v, ReduceOp::Mean)
                .map_err(PipelineError::comm(Phase::Metrics))?;
            it.global_loss = Some(v[0]);
        }
        Ok(())
    }

    /// [`Phase::Checkpoint`]: every `checkpoint_every` iterations, the checkpointer with the
    /// state after this iteration (a pending overlapped average completed, not applied).
    fn checkpoint<B>(&mut self, model: M, source: &dyn BatchSource<B>) -> Result<M, PipelineError> {
        let every = self.options.checkpoint_every;
        let due =
            every > 0 && (self.iteration + 1).is_multiple_of(every) && self.checkpointer.is_some();
        if !due {
            return Ok(model);
        }
        // Buffers are saved with the last forward's update.
        let model = refresh_buffers(model);
        let pending_average = self.pending_average()?;
        let outer = self.outer_state()?;
        let optimizer = self.inner.module_optimizer().ok_or_else(|| {
            PipelineError::Config(
                "the checkpoint phase saves burn's optimizer, but this pipeline steps an inner \
                 optimizer that keeps its own state (`with_inner_optimizer`): save it with that \
                 optimizer's owner and set `checkpoint_every` to 0"
                    .into(),
            )
        })?;
        let ctx = CheckpointContext {
            pending_average,
            outer,
            iterations_done: self.iteration + 1,
            skipped_steps: self.skipped_steps,
            model: &model,
            optimizer,
            averager: self.averager.as_ref().map(|a| a.state()),
            hook: self.sync.as_ref().map(|s| s.hook.state()),
            data: source.position(),
            group: &self.group,
        };
        if let Some(save) = &mut self.checkpointer {
            save(&ctx)?;
        }
        Ok(model)
    }

    /// Count the iteration and report it.
    fn complete<B>(&mut self, it: Iteration<B>, data: Option<DataPosition>) -> IterationReport {
        let report = IterationReport {
            iteration: self.iteration,
            loss: it.loss.unwrap_or(f32::NAN),
            global_loss: it.global_loss,
            skipped_step: it.skipped_step,
            lr: it.lr,
            times: it.times,
            traffic: self.group.traffic() - it.traffic_start,
            micro_batches: it.micro_batches,
            data,
        };
        self.times.accumulate(&it.times);
        self.iteration += 1;
        report
    }

    /// The overlapped average started and not yet applied, with its collective completed
    /// (waits for it if still in flight; it stays pending and is applied at its step). For
    /// checkpoints; `None` without overlap or when nothing is pending.
    pub fn pending_average(&mut self) -> Result<Option<PendingAverage>, PipelineError> {
        match self.averager.as_mut().and_then(|a| a.overlap_mut()) {
            Some(overlap) => Ok(overlap.wait_pending()?),
            None => Ok(None),
        }
    }

    /// The outer averager's state to checkpoint (`None` without one, or before `θ` was taken).
    /// A Streaming DiLoCo pseudo-gradient still on its way is waited for (every rank calls this
    /// at the same iteration) and included, not applied.
    pub fn outer_state(&mut self) -> Result<Option<OuterState>, PipelineError> {
        match self.averager.as_mut().and_then(|a| a.outer_mut()) {
            Some(outer) => Ok(outer.global_state()?),
            None => Ok(None),
        }
    }

    /// The mean of every rank's `model` over the world group, parameters and buffers (one
    /// fused all-reduce; collective: every rank calls it, with its own model). After local
    /// steps the replicas differ: this is the model a run of local SGD, DiLoCo or SlowMo
    /// leaves (the binary evaluates and exports it; the burn-train strategy returns it). The
    /// ranks' own models are unchanged. Call it after [`finish`](Self::finish).
    pub fn world_average(&self, model: M) -> Result<M, PipelineError> {
        let model = refresh_buffers(model);
        Ok(average_in_group(model, &ParamSelection::All, &self.group)?)
    }

    /// End training: apply an overlapped average still in flight (every rank, at the same
    /// iteration), so the returned model includes it, and stop the pipelined gradient sync's
    /// helper (an error if a collective was left pending). Call once after the last iteration.
    pub fn finish(&mut self, model: M) -> Result<M, PipelineError> {
        if let Some(sync) = &mut self.sync {
            sync.reducer.close()?;
        }
        let model = refresh_buffers(model);
        match &mut self.averager {
            Some(averager) => Ok(averager.complete_pending(model)?),
            None => Ok(model),
        }
    }
}

/// Make the buffers' latest values visible to visitors and mappers. burn's `RunningState`
/// (BatchNorm's running statistics) keeps a forward pass's update pending until the next
/// forward reads it, and a visitor sees the value from before that update; worse, a value
/// written by a mapper is then replaced by the pending update. `Module::train` applies pending
/// updates and starts each state afresh (same id); on a training module it changes nothing
/// else. A module without buffers is returned as is (callers check first).
fn apply_buffer_updates<M: Module>(model: M) -> M {
    model.train()
}

/// When the module has buffers, apply their pending updates (burn's `RunningState` keeps a
/// forward pass's update pending until the next forward reads it): the buffers' latest values
/// become visible (call it before reading or saving a module that ran forward passes). Other
/// modules are returned as they are.
pub fn refresh_buffers<M: Module>(model: M) -> M {
    if ParamSelection::buffers(&model).is_empty() {
        model
    } else {
        apply_buffer_updates(model)
    }
}

/// [`BufferPolicy::Broadcast`]'s step: every rank of `group` takes rank 0's buffers (pending
/// updates applied first). Collective; nothing is sent for a module without buffers.
pub fn broadcast_buffers<M: Module>(model: M, group: &Group) -> Result<M, PipelineError> {
    let buffers = ParamSelection::buffers(&model);
    if buffers.is_empty() {
        return Ok(model);
    }
    Ok(broadcast_in_group(
        apply_buffer_updates(model),
        &buffers,
        group,
        0,
    )?)
}

/// [`BufferPolicy::Average`]'s step: the buffers averaged over `group` (the averaging step's
/// group; pending updates applied first). Collective; nothing is sent for a module without
/// buffers.
pub fn average_buffers<M: Module>(model: M, group: &Group) -> Result<M, PipelineError> {
    let buffers = ParamSelection::buffers(&model);
    if buffers.is_empty() {
        return Ok(model);
    }
    Ok(average_in_group(
        apply_buffer_updates(model),
        &buffers,
        group,
    )?)
}

/// PyTorch's `clip_grad_norm_`: the L2 norm over every gradient in `grads` (one flattened read,
/// accumulated in `f64`), and every gradient multiplied by `min(1, max_norm / (norm + 1e-6))`
/// when that is below 1. Returns the gradients unchanged otherwise.
fn clip_grad_norm<M: Module>(
    model: &M,
    grads: GradientsParams,
    max_norm: f64,
) -> Result<GradientsParams, PipelineError> {
    let selection = ParamSelection::with_grads(model, &grads);
    let mut flat = flatten_grads(model, &grads, &selection)
        .map_err(PipelineError::comm(Phase::OptimizerStep))?;
    let norm = match &flat.buffer {
        FlatBuffer::F32(v) => v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>(),
        FlatBuffer::F64(v) => v.iter().map(|&x| x * x).sum::<f64>(),
    }
    .sqrt();
    let coef = max_norm / (norm + 1e-6);
    if coef >= 1.0 {
        return Ok(grads);
    }
    match &mut flat.buffer {
        FlatBuffer::F32(v) => {
            let c = coef as f32;
            v.iter_mut().for_each(|x| *x *= c);
        }
        FlatBuffer::F64(v) => v.iter_mut().for_each(|x| *x *= coef),
    }
    grads_from_flat(model, &flat).map_err(PipelineError::comm(Phase::OptimizerStep))
}

/// Whether every gradient in `grads` is finite (one flattened read).
fn grads_finite<M: Module>(model: &M, grads: &GradientsParams) -> Result<bool, PipelineError> {
    let selection = ParamSelection::with_grads(model, grads);
    let flat = flatten_grads(model, grads, &selection)
        .map_err(PipelineError::comm(Phase::OptimizerStep))?;
    Ok(match &flat.buffer {
        FlatBuffer::F32(v) => v.iter().all(|x| x.is_finite()),
        FlatBuffer::F64(v) => v.iter().all(|x| x.is_finite()),
    })
}
