//! The phase-ordered step pipeline.
//!
//! One iteration is the fixed sequence [`ITERATION_ORDER`]: fetch a batch (local) → agree that
//! every rank still has data (one small collective) → forward/backward (local) → gradient sync
//! (the comm hook) → optimizer step (local) → model averaging → metrics → checkpoint. The sequence
//! is run by [`Pipeline::run_iteration`] and nowhere else, so every rank issues the same
//! collectives in the same order — averaging can never race with another collective the way an
//! "average inside `optimizer.step()`" design can (the book's semantics §5).

mod error;
mod phase;
mod source;

pub use error::PipelineError;
pub use phase::{ITERATION_ORDER, Phase, PhaseTimes};
pub use source::{BatchSource, DataPosition, IterSource, SourceError};

use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::{ModuleLearningRate, ModuleLrScheduler};
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;
use localsgd_averagers::{
    AverageParameters, AveragerState, ModelAverager, OuterState, PendingAverage, average_in_group,
    broadcast_in_group,
};
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_grads, grads_from_flat};
use localsgd_comm::{Group, GroupExt, ReduceOp, Traffic};
use localsgd_hooks::{CommHook, GradientReducer, HookState, InFlightGrads};
use std::time::{Duration, Instant};

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
    /// hook's `iter`, the averager's step and the schedule count optimizer steps. An epoch whose
    /// shard has fewer than `accumulate` batches left ends there on every rank (the remainder is
    /// not stepped). The reported loss is the mean of the micro-batches' losses.
    pub accumulate: usize,
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

/// What one completed iteration did.
#[derive(Debug, Clone, PartialEq)]
pub struct IterationReport {
    /// 0-based index of the iteration.
    pub iteration: u64,
    /// This rank's loss on its batch.
    pub loss: f32,
    /// The mean loss over all ranks, on metrics iterations.
    pub global_loss: Option<f64>,
    /// Whether the optimizer step was skipped (non-finite gradients).
    pub skipped_step: bool,
    /// The learning rate of this iteration's optimizer step (the scheduler's, or the constant).
    pub lr: f64,
    /// Wall time per phase in this iteration.
    pub times: PhaseTimes,
    /// Communication issued by this rank in this iteration (all groups).
    pub traffic: Traffic,
}

/// Result of [`Pipeline::run_iteration`].
#[derive(Debug)]
pub enum Outcome<M> {
    /// An iteration ran.
    Trained(M, IterationReport),
    /// Some rank ran out of data: every rank ends the epoch here, together.
    EndOfData(M),
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
    optimizer: ModuleOptimizer,
    lr_scheduler: Option<ModuleLrScheduler>,
    sync: Option<GradientSync>,
    averager: Option<Box<dyn ModelAverager>>,
    options: PipelineOptions,
    iteration: u64,
    skipped_steps: u64,
    /// The start broadcast is still to run (fresh run with `broadcast_start`).
    start_pending: bool,
    times: PhaseTimes,
    checkpointer: Option<Checkpointer<M>>,
    observer: Option<PhaseObserver>,
}

impl<M: Module> Pipeline<M> {
    /// A pipeline on `group` with `optimizer`, no gradient sync and no averaging (add them with
    /// [`with_gradient_sync`](Self::with_gradient_sync) and [`with_averager`](Self::with_averager)).
    pub fn new(group: Group, optimizer: ModuleOptimizer, options: PipelineOptions) -> Self {
        let broadcast_start = options.broadcast_start;
        Self {
            group,
            optimizer,
            lr_scheduler: None,
            sync: None,
            averager: None,
            options,
            iteration: 0,
            skipped_steps: 0,
            start_pending: broadcast_start,
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
    /// step count alone, as all of burn's and ours do.
    pub fn with_lr_scheduler(mut self, mut scheduler: ModuleLrScheduler) -> Self {
        for _ in 0..self.iteration {
            scheduler.step();
        }
        self.lr_scheduler = Some(scheduler);
        self
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

    /// Accumulated wall time per phase.
    pub fn phase_times(&self) -> &PhaseTimes {
        &self.times
    }

    /// The world group.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &ModuleOptimizer {
        &self.optimizer
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
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        &mut self,
        iterations_done: u64,
        skipped_steps: u64,
        optimizer: ModuleOptimizer,
        averager: Option<&AveragerState>,
        hook: Option<&HookState>,
        pending_average: Option<PendingAverage>,
        outer: Option<&OuterState>,
    ) -> Result<(), PipelineError> {
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
        self.optimizer = optimizer;
        if let Some(scheduler) = &mut self.lr_scheduler {
            for _ in 0..iterations_done {
                scheduler.step();
            }
        }
        self.iteration = iterations_done;
        self.skipped_steps = skipped_steps;
        // A resumed run continues from each rank's own saved state (local SGD replicas differ
        // legitimately between averages): no start broadcast.
        self.start_pending = false;
        Ok(())
    }

    /// Run one iteration: every phase of [`ITERATION_ORDER`], in order.
    pub fn run_iteration<B>(
        &mut self,
        model: M,
        source: &mut dyn BatchSource<B>,
        loss_fn: &dyn Fn(&M, &B) -> Tensor<1>,
    ) -> Result<Outcome<M>, PipelineError> {
        // Setup, not part of iteration 0's counters (like creating subgroups).
        let model = if self.start_pending {
            let m = broadcast_in_group(
                settle_if_buffers(model),
                &ParamSelection::All,
                &self.group,
                0,
            )?;
            self.start_pending = false;
            m
        } else {
            model
        };
        let traffic_start = self.group.traffic();
        let mut times = PhaseTimes::default();
        let mut model = model;
        let micro = self.options.accumulate.max(1);
        let mut batches: Vec<B> = Vec::with_capacity(micro);
        let mut loss_value = 0f32;
        let mut grads: Option<GradientsParams> = None;
        let mut in_flight: Option<InFlightGrads> = None;
        let mut selection: Option<ParamSelection> = None;
        let mut skipped_step = false;
        let mut global_loss = None;
        let mut lr_used = self.options.lr;

        let mut waiting_total = Duration::ZERO;
        for phase in ITERATION_ORDER {
            let started = Instant::now();
            let collectives_before = self.group.traffic().collectives;
            // Each phase takes the model and hands it on (moved, so none can lose it).
            let m = model;
            let m = match phase {
                Phase::FetchBatch => {
                    while batches.len() < micro {
                        match source.next_batch().map_err(PipelineError::Data)? {
                            Some(b) => batches.push(b),
                            None => break,
                        }
                    }
                    m
                }
                Phase::AgreeHasData => {
                    let all = self
                        .group
                        .all_true(batches.len() == micro)
                        .map_err(PipelineError::comm(phase))?;
                    if !all {
                        self.observe(phase, collectives_before);
                        return Ok(Outcome::EndOfData(m));
                    }
                    if self.options.buffers == BufferPolicy::Broadcast {
                        broadcast_buffers(m, &self.group)?
                    } else {
                        m
                    }
                }
                Phase::ForwardBackward => {
                    if batches.len() != micro {
                        return Err(PipelineError::Config("no batch after agreement".into()));
                    }
                    if micro == 1 {
                        let loss = loss_fn(&m, &batches[0]);
                        loss_value = loss.clone().into_scalar::<f32>();
                        grads = Some(GradientsParams::from_grads(loss.backward(), &m));
                    } else {
                        let mut sum = GradientsAccumulator::<M>::new();
                        let mut total = 0f32;
                        for b in batches.drain(..) {
                            let loss = loss_fn(&m, &b);
                            total += loss.clone().into_scalar::<f32>();
                            let scaled = loss / micro as f32;
                            sum.accumulate(&m, GradientsParams::from_grads(scaled.backward(), &m));
                        }
                        loss_value = total / micro as f32;
                        grads = Some(sum.grads());
                    }
                    // An outer averager's θ: the model before the first optimizer step (equal
                    // on every rank after the start broadcast), over the parameters with a
                    // gradient (those it will synchronise). Resumed runs restore θ instead.
                    if let (Some(g), Some(outer)) =
                        (&grads, self.averager.as_mut().and_then(|a| a.outer_mut()))
                        && outer.global_params().is_none()
                    {
                        outer.reset_global(&m, &ParamSelection::with_grads(&m, g))?;
                    }
                    m
                }
                Phase::GradientSync => {
                    if let Some(sync) = &mut self.sync
                        && let Some(g) = grads.take()
                    {
                        in_flight = Some(sync.reducer.start(&m, g, &mut *sync.hook)?);
                    }
                    m
                }
                Phase::OptimizerStep => {
                    let lr = match &mut self.lr_scheduler {
                        Some(s) => s.step(),
                        None => ModuleLearningRate::from(self.options.lr),
                    };
                    lr_used = lr.base();
                    // SlowMo's slow step divides by the learning rate of the step just taken.
                    if let Some(outer) = self.averager.as_mut().and_then(|a| a.outer_mut()) {
                        outer.set_inner_lr(lr_used);
                    }
                    // The averager averages "parameters that had a gradient this step": note
                    // them before the optimizer consumes the gradients, but only when an
                    // averaging is due (the check is free otherwise).
                    let note_selection = self
                        .averager
                        .as_ref()
                        .is_some_and(|a| a.scheduled_group().is_some());
                    match in_flight.take() {
                        // Pipelined gradient sync: step each bucket's parameters as soon as its
                        // average arrives (the same result as one step over all of them). The
                        // time spent waiting for the wire is gradient-sync time.
                        Some(mut parts)
                            if parts.is_pipelined()
                                && !self.options.skip_non_finite
                                && self.options.clip_grad_norm.is_none() =>
                        {
                            if note_selection {
                                selection = Some(parts.selection(&m));
                            }
                            let mut m = m;
                            loop {
                                let waiting = Instant::now();
                                let Some(g) = parts.next_part(&m)? else {
                                    break;
                                };
                                let waited = waiting.elapsed();
                                times.add(Phase::GradientSync, waited);
                                waiting_total += waited;
                                m = self.optimizer.step(lr.clone(), m, g);
                            }
                            m
                        }
                        parts => {
                            let g = match parts {
                                Some(parts) => {
                                    let waiting = Instant::now();
                                    let g = parts.wait_all(&m)?;
                                    let waited = waiting.elapsed();
                                    times.add(Phase::GradientSync, waited);
                                    waiting_total += waited;
                                    g
                                }
                                None => grads.take().unwrap_or_default(),
                            };
                            if note_selection {
                                selection = Some(ParamSelection::with_grads(&m, &g));
                            }
                            if self.options.skip_non_finite && !grads_finite(&m, &g)? {
                                skipped_step = true;
                                self.skipped_steps += 1;
                                m
                            } else {
                                let g = match self.options.clip_grad_norm {
                                    Some(max_norm) => clip_grad_norm(&m, g, max_norm)?,
                                    None => g,
                                };
                                self.optimizer.step(lr, m, g)
                            }
                        }
                    }
                }
                Phase::ModelAveraging => match &mut self.averager {
                    Some(averager) => {
                        let sel = selection
                            .take()
                            .unwrap_or_else(|| ParamSelection::ids(std::iter::empty()));
                        let buffers_group = match self.options.buffers {
                            BufferPolicy::Average => averager.scheduled_group(),
                            _ => None,
                        };
                        let m = averager.average_parameters(m, &sel)?;
                        match buffers_group {
                            Some(group) => average_buffers(m, &group)?,
                            None => m,
                        }
                    }
                    None => m,
                },
                Phase::Metrics => {
                    let every = self.options.metrics_every;
                    if every > 0 && (self.iteration + 1).is_multiple_of(every) {
                        let mut v = [loss_value as f64];
                        self.group
                            .all_reduce_slice(&mut v, ReduceOp::Mean)
                            .map_err(PipelineError::comm(phase))?;
                        global_loss = Some(v[0]);
                    }
                    m
                }
                Phase::Checkpoint => {
                    let every = self.options.checkpoint_every;
                    let due = every > 0
                        && (self.iteration + 1).is_multiple_of(every)
                        && self.checkpointer.is_some();
                    // Buffers are saved with the last forward's update.
                    let m = if due { settle_if_buffers(m) } else { m };
                    if due {
                        // A pending overlapped average is completed (not applied) and saved.
                        let pending_average = self.pending_average()?;
                        let outer = self.outer_state()?;
                        let ctx = CheckpointContext {
                            pending_average,
                            outer,
                            iterations_done: self.iteration + 1,
                            skipped_steps: self.skipped_steps,
                            model: &m,
                            optimizer: &self.optimizer,
                            averager: self.averager.as_ref().map(|a| a.state()),
                            hook: self.sync.as_ref().map(|s| s.hook.state()),
                            data: source.position(),
                            group: &self.group,
                        };
                        if let Some(save) = &mut self.checkpointer {
                            save(&ctx)?;
                        }
                    }
                    m
                }
            };
            model = m;
            // Waiting for in-flight gradients inside the optimizer phase was booked as
            // gradient-sync time above.
            times.add(phase, started.elapsed().saturating_sub(waiting_total));
            waiting_total = Duration::ZERO;
            self.observe(phase, collectives_before);
        }

        let report = IterationReport {
            iteration: self.iteration,
            loss: loss_value,
            global_loss,
            skipped_step,
            lr: lr_used,
            times,
            traffic: self.group.traffic() - traffic_start,
        };
        self.times.accumulate(&times);
        self.iteration += 1;
        Ok(Outcome::Trained(model, report))
    }

    /// The overlapped average started and not yet applied, with its collective completed
    /// (waits for it if still in flight; it stays pending and is applied at its step). For
    /// checkpoints; `None` without overlap or when nothing is pending.
    pub fn pending_average(&mut self) -> Result<Option<PendingAverage>, PipelineError> {
        match self.averager.as_mut().and_then(|a| a.overlap_mut()) {
            Some(overlap) => Ok(overlap.settle()?),
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

    /// End training: apply an overlapped average still in flight (every rank, at the same
    /// iteration), so the returned model includes it, and stop the pipelined gradient sync's
    /// helper (an error if a collective was left pending). Call once after the last iteration.
    pub fn finish(&mut self, model: M) -> Result<M, PipelineError> {
        if let Some(sync) = &mut self.sync {
            sync.reducer.close()?;
        }
        let model = settle_if_buffers(model);
        match &mut self.averager {
            Some(averager) => Ok(averager.complete_pending(model)?),
            None => Ok(model),
        }
    }

    fn observe(&mut self, phase: Phase, collectives_before: u64) {
        if let Some(obs) = &mut self.observer {
            let issued = self.group.traffic().collectives - collectives_before;
            obs(phase, issued);
        }
    }
}

/// Make the buffers' latest values visible to visitors and mappers. burn's `RunningState`
/// (BatchNorm's running statistics) keeps a forward pass's update pending until the next
/// forward reads it, and a visitor sees the value from before that update; worse, a value
/// written by a mapper is then replaced by the pending update. `Module::train` applies pending
/// updates and starts each state afresh (same id); on a training module it changes nothing
/// else. A module without buffers is returned as is (callers check first).
fn settle_buffers<M: Module>(model: M) -> M {
    model.train()
}

/// When the module has buffers, apply their pending updates (burn's `RunningState` keeps a
/// forward pass's update pending until the next forward reads it): the buffers' latest values
/// become visible (call it before reading or saving a module that ran forward passes). Other
/// modules are returned as they are.
pub fn settle_if_buffers<M: Module>(model: M) -> M {
    if ParamSelection::buffers(&model).is_empty() {
        model
    } else {
        settle_buffers(model)
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
        settle_buffers(model),
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
    Ok(average_in_group(settle_buffers(model), &buffers, group)?)
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
