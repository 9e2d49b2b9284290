//! Outer-optimizer model averaging (the book's semantics §8): DiLoCo, SlowMo and
//! Streaming DiLoCo.
//!
//! Instead of replacing every replica by the average, an [`OuterAverager`] keeps the global
//! parameters `θ` (the model as it was right after the last synchronisation) and, at each
//! synchronisation over the whole group, takes an optimizer step on `θ` with the
//! *pseudo-gradient* `Δ = θ − mean_r(x_r)`; every replica then adopts the new `θ`.
//!
//! - **DiLoCo**: [`OuterOptimizer::Sgd`] with [`OuterSgdConfig::diloco`] (Nesterov, lr 0.7,
//!   momentum 0.9), `torch.optim.SGD` arithmetic including the first-step buffer rule.
//!   Outer SGD with lr 1 and no momentum is periodic averaging (E1).
//! - **SlowMo**: [`OuterOptimizer::SlowMo`], fairscale's arithmetic
//!   (`u ← βu + Δ/γ; θ ← θ − αγu`, γ the inner learning rate of the step, set with
//!   [`OuterAverager::set_inner_lr`]). `θ` and `u` are taken *eagerly* (no lazy
//!   initialisation after the first inner step: fairscale's quirk 1 is not reproduced), every
//!   rank computes the same slow step on the average (fairscale's memory-efficient result,
//!   without its sharding: each rank holds `θ` and `u`, twice the parameters). `(α, β) = (1, 0)`
//!   skips the slow step, as fairscale does, so it is bitwise periodic averaging.
//!   [`OuterAverager::periodic`] takes the slow step at every sync (fairscale with
//!   `localsgd_frequency = slowmo_frequency`); [`OuterAverager::slowmo`] has fairscale's two
//!   frequencies ([`SlowMoConfig`]): plain averages over the world every `localsgd_frequency`
//!   local steps and the slow step every `slowmo_frequency` local steps (defaults 3 and 48).
//!
//! The schedule is any [`ModelAverager`] without overlap: the outer step runs on the steps where
//! it averages over the whole group; steps where it averages a smaller group (the lower levels of
//! a [`HierarchicalModelAverager`](crate::HierarchicalModelAverager)) stay plain averaging.
//! [`OuterAverager::periodic`] builds the cadence of semantics §8.1: after a warm-up of `W` steps, sync
//! after local steps `H, 2H, ...` (0-based steps `W+H−1, W+2H−1, ...`).
//!
//! `θ` is taken by [`OuterAverager::reset_global`] (call it before the first optimizer step,
//! when the replicas are identical) and refreshed automatically after the last warm-up step
//! `W − 1` (the replicas, synchronised by gradient all-reduce during the warm-up, are identical
//! but have moved). A synchronisation without `θ` is an error, never a lazy snapshot.
//!
//! - **Streaming DiLoCo**: [`OuterAverager::streaming`] syncs one fragment of the parameters
//!   at a time on torchft's schedule, each fragment with its own outer optimizer, optionally
//!   starting a fragment's all-reduce `τ` steps early (non-blocking) and mixing the local values
//!   back in with α ([`StreamingConfig`]).
//! - **Compression**: [`OuterAverager::with_compression`] sends the pseudo-gradients in fp16 or
//!   bf16, or quantized (int8, int4) and sparsified (top-k) with error feedback
//!   ([`AverageCompression`]).
//!
//! Four workers (threads) with targets 0..3 fit `w` by SGD; DiLoCo syncs every 3 steps. The
//! numbers are the outer-optimizer vector V2 (semantics §10):
//!
//! ```
//! use burn::module::{Module, Param};
//! use burn::prelude::*;
//! use burn::tensor::DType;
//! use localsgd_averagers::comm::ThreadWorld;
//! use localsgd_averagers::comm::params::{FlatBuffer, ParamSelection, flatten_params, write_params};
//! use localsgd_averagers::{AverageParameters, AveragerError, OuterAverager, OuterSgdConfig};
//!
//! #[derive(Module, Debug)]
//! struct Scalar { w: Param<Tensor<1>> }
//!
//! let out = ThreadWorld::new(4)?.run(|world| -> Result<f64, AveragerError> {
//!     let device = Device::flex();
//!     let target = world.rank() as f64;
//!     let w = Tensor::<1>::from_data(TensorData::from([1.0f64]), (&device, DType::F64));
//!     let mut model = Scalar { w: Param::from_tensor(w) };
//!     let all = ParamSelection::All;
//!     let mut diloco =
//!         OuterAverager::periodic(3, 0, OuterSgdConfig::diloco().into(), world.clone())?;
//!     diloco.reset_global(&model, &all)?;
//!     for _ in 0..6 {
//!         // One inner SGD step, lr 0.1, on loss (w - target)^2 / 2.
//!         let mut flat = flatten_params(&model, &all)?;
//!         if let FlatBuffer::F64(v) = &mut flat.buffer {
//!             v[0] -= 0.1 * (v[0] - target);
//!         }
//!         model = write_params(model, &flat)?;
//!         model = diloco.average_parameters(model, &all)?;
//!     }
//!     match flatten_params(&model, &all)?.buffer {
//!         FlatBuffer::F64(v) => Ok(v[0]),
//!         FlatBuffer::F32(v) => Ok(v[0] as f64),
//!     }
//! })?;
//! for w in out {
//!     assert!((w? - 1.37230360755).abs() < 1e-12);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod compression;
mod optimizer;
mod sgd;
mod slowmo;
mod state;
mod streaming;
mod wire;

pub use compression::{AverageCompression, DEFAULT_CHUNK, LossyExchange};
pub use optimizer::{OuterOptimizer, PseudoGradient};
pub use sgd::{OuterSgd, OuterSgdConfig};
pub use slowmo::SlowMoConfig;
pub use state::{FragmentState, OuterState, PendingDelta};
pub use streaming::StreamingConfig;

use crate::average::{average_in_group, check_agreement};
use crate::averager::{ModelAverager, check_state_config};
use crate::error::AveragerError;
use crate::overlap::selection_of_indices;
use crate::periodic::PeriodicModelAverager;
use crate::schedule::Scheduled;
use crate::state::{AveragerConfig, AveragerState};
use burn::module::Module;
use localsgd_comm::codec::ErrorFeedback;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params, write_params};
use localsgd_comm::{AsyncGroup, Group};
use sgd::{Real, slow_step, type_name};
use slowmo::{SlowMoCadence, SlowMoEvent, SlowMoSchedule};
use streaming::{Cadence, StreamingSchedule};
use wire::{
    Lossy, Transfer, feedback_of, group_mean, mean_delta, owned_of, side_group, type_changed,
};

/// `θ` and the outer optimizer's state.
#[derive(Debug, Clone, PartialEq)]
struct Global {
    /// (traversal index, element count) of every parameter in `θ`.
    entries: Vec<(usize, usize)>,
    theta: FlatBuffer,
    /// torch's momentum buffer (SGD) or fairscale's `global_momentum_buffer` (SlowMo, zeros
    /// from the start).
    sgd: Option<OuterSgd>,
    slow_momentum: Option<FlatBuffer>,
    /// What the lossy codec's messages did not carry yet (error feedback); `None` until the
    /// first lossy sync, or without error feedback.
    feedback: Option<ErrorFeedback>,
    /// What the reduced shard this rank owns in the quantized all-reduce did not carry yet
    /// (the vector's length; only the owned shard is used); `None` until its first use.
    owned: Option<ErrorFeedback>,
}

/// Streaming DiLoCo's moving parts: the cadence, the non-blocking communicator (created at the
/// first delayed prepare) and the fragment whose pseudo-gradient is on its way.
struct Streaming {
    cadence: Cadence,
    side: Option<AsyncGroup>,
    in_flight: Option<(usize, Transfer)>,
}

impl std::fmt::Debug for Streaming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming")
            .field("config", self.cadence.config())
            .field("in_flight", &self.in_flight.as_ref().map(|p| p.0))
            .finish()
    }
}

/// Model averaging with an outer optimizer (DiLoCo, SlowMo, Streaming DiLoCo); see the
/// [module docs](self).
#[derive(Debug)]
pub struct OuterAverager {
    world: Group,
    schedule: Box<dyn ModelAverager>,
    optimizer: OuterOptimizer,
    reduce: PseudoGradient,
    local_start: u64,
    inner_lr: Option<f64>,
    /// `θ` and the outer optimizer's state per fragment (one unless streaming); empty until
    /// taken.
    global: Vec<Global>,
    outer_steps: u64,
    compression: Option<AverageCompression>,
    streaming: Option<Streaming>,
    /// SlowMo's two frequencies (built by [`slowmo`](Self::slowmo)).
    slowmo: Option<SlowMoCadence>,
}

impl OuterAverager {
    /// An outer averager on `schedule` (any averager without overlap whose largest group is
    /// `world`), taking outer steps with `optimizer`. Not collective.
    ///
    /// Errors: invalid optimizer settings (torch's and fairscale's rules, naming the value); a
    /// schedule with overlapped averaging.
    pub fn new(
        schedule: Box<dyn ModelAverager>,
        optimizer: OuterOptimizer,
        world: Group,
    ) -> Result<Self, AveragerError> {
        optimizer.validate()?;
        if let Some(overlap) = schedule.overlap() {
            return Err(AveragerError::Outer(format!(
                "the schedule overlaps its averages ({} steps): an outer step needs the \
                 synchronised average at its own step (valid: overlap 0)",
                overlap.delay()
            )));
        }
        Ok(Self {
            world,
            schedule,
            reduce: optimizer.default_reduce(),
            optimizer,
            local_start: 0,
            inner_lr: None,
            global: Vec::new(),
            outer_steps: 0,
            compression: None,
            streaming: None,
            slowmo: None,
        })
    }

    /// The cadence of semantics §8.1: `warmup` steps of synchronous training (0-based steps
    /// `0..warmup`, e.g. the post-local SGD hook's), then a sync over `world` after every
    /// `period` local steps, i.e. at steps `warmup + period − 1`, `warmup + 2·period − 1`, ...
    /// (`PeriodicModelAverager(period, warmup + period − 1)`); `θ` is refreshed after step
    /// `warmup − 1`.
    pub fn periodic(
        period: u64,
        warmup: u64,
        optimizer: OuterOptimizer,
        world: Group,
    ) -> Result<Self, AveragerError> {
        if period == 0 {
            return Err(AveragerError::NonPositivePeriod(period));
        }
        let first = warmup
            .checked_add(period - 1)
            .and_then(|s| i64::try_from(s).ok())
            .ok_or_else(|| {
                AveragerError::Outer(format!(
                    "warmup {warmup} + period {period} is too large (valid: below 2^63)"
                ))
            })?;
        let schedule = PeriodicModelAverager::new(period, first, world.clone())?;
        Ok(Self::new(Box::new(schedule), optimizer, world)?.with_local_start(warmup))
    }

    /// Streaming DiLoCo (torchft's `DiLoCo` with fragments, semantics §8.4) with `optimizer` as
    /// every fragment's own outer optimizer (one state per fragment: torchft's shared-optimizer
    /// hazard of semantics §8.5 cannot happen). After `warmup` synchronous steps (`θ` refreshed after step
    /// `warmup − 1`), local step `L = (step − warmup) mod P + 1`, `P = sync_every / fragments`:
    ///
    /// - at `L = P − τ` the fragment `f = M mod F` (`M` the outer steps so far) measures
    ///   `θ_f − x_f` and starts its average over `world` (non-blocking when `τ > 0`: the
    ///   all-reduce runs behind the next `τ` steps' compute);
    /// - at `L = P` it waits for that average `Δ_f`, keeps its local values `X_f`, takes the
    ///   outer step `θ_f ← OuterOpt_f(θ_f, Δ_f)` and sets `x_f ← θ_f + α·(X_f − θ_f)`.
    ///
    /// The fragments are contiguous runs of whole parameter tensors in traversal order (the
    /// first `n mod F` fragments one tensor longer), fixed when `θ` is taken. The
    /// pseudo-gradient is always the mean of deltas (torchft's). Every commit succeeds: a failed
    /// collective is an error, never a silent retry. With one fragment, no delay and no mixing
    /// this is DiLoCo (E8).
    pub fn streaming(
        config: StreamingConfig,
        warmup: u64,
        optimizer: OuterSgdConfig,
        world: Group,
    ) -> Result<Self, AveragerError> {
        let cadence = Cadence::new(config, warmup)?;
        let schedule = Scheduled::from_schedule(StreamingSchedule::new(cadence, world.clone()));
        let mut averager =
            Self::new(Box::new(schedule), optimizer.into(), world)?.with_local_start(warmup);
        averager.streaming = Some(Streaming {
            cadence,
            side: None,
            in_flight: None,
        });
        Ok(averager)
    }

    /// SlowMo with fairscale's two frequencies (`SlowMoDistributedDataParallel` with
    /// `localsgd_frequency` lf, `slowmo_frequency` sf, in its default memory-efficient mode,
    /// semantics §8 of the book). After `warmup` synchronous steps (`θ` refreshed after step
    /// `warmup − 1`, as [`periodic`](Self::periodic)), local step `n = step − warmup + 1`
    /// (fairscale's `num_updates + 1`) does, after its optimizer step:
    ///
    /// - `n mod sf = 0`: the slow step on the world's average (delta of mean):
    ///   `u ← βu + (θ − x̄)/γ; θ ← θ − αγu`, every replica adopts `θ`. The plain average due at
    ///   the same step is skipped (fairscale's memory-efficient mode: the slow step's gather
    ///   averages anyway);
    /// - otherwise `n mod lf = 0`: a plain average over the world; `θ` and `u` are untouched
    ///   (fairscale's `old_params` only move at slow steps);
    /// - otherwise nothing.
    ///
    /// Any positive pair of frequencies is valid. fairscale recommends sf a multiple of lf; when it
    /// is not (lf 3, sf 4: averages after local steps 3, 6, 9, slow steps after 4, 8, 12) the
    /// replicas still agree after every slow step, because the slow step averages first. With
    /// `(α, β) = (1, 0)` no slow step ever runs (fairscale's shortcut): the averages every lf
    /// steps are the syncs, `θ` follows them and [`outer_steps`](Self::outer_steps) counts them.
    /// With lf = sf = H this is exactly `periodic(H, warmup, config.optimizer(), world)` (the
    /// same numbers, `θ`, momentum and outer-step count; the saved schedule configuration
    /// differs, so their checkpoints do not mix).
    ///
    /// `θ` and the slow momentum `u` are taken eagerly ([`reset_global`](Self::reset_global)),
    /// never lazily after the first inner step (fairscale's quirk 1). γ is the inner learning
    /// rate of the slow step's own optimizer step ([`set_inner_lr`](Self::set_inner_lr)). The
    /// checkpoint state is that of [`periodic`](Self::periodic): the step counter,
    /// `θ`, `u` and the outer-step count (the plain averages keep nothing).
    ///
    /// Errors: a frequency of 0 or invalid slow-optimizer settings ([`SlowMoConfig::validate`],
    /// naming the value and what is valid).
    pub fn slowmo(config: SlowMoConfig, warmup: u64, world: Group) -> Result<Self, AveragerError> {
        let cadence = SlowMoCadence::new(config, warmup)?;
        if config.localsgd_frequency == 1 {
            tracing::warn!(
                localsgd_frequency = 1,
                "SlowMo with localsgd_frequency 1 averages the parameters after every step, \
                 which costs at least as much as all-reducing gradients"
            );
        }
        let schedule = Scheduled::from_schedule(SlowMoSchedule::new(cadence, world.clone()));
        let mut averager =
            Self::new(Box::new(schedule), config.optimizer(), world)?.with_local_start(warmup);
        averager.slowmo = Some(cadence);
        Ok(averager)
    }

    /// SlowMo's frequencies and slow optimizer (`None` unless built by
    /// [`slowmo`](Self::slowmo)).
    pub fn slowmo_config(&self) -> Option<&SlowMoConfig> {
        self.slowmo.as_ref().map(SlowMoCadence::config)
    }

    /// Streaming DiLoCo's settings (`None` for DiLoCo and SlowMo on a schedule).
    pub fn streaming_config(&self) -> Option<&StreamingConfig> {
        self.streaming.as_ref().map(|s| s.cadence.config())
    }

    /// Refresh `θ` after step `local_start − 1`, the last step of a synchronous warm-up (`0`:
    /// never; `θ` then comes from [`reset_global`](Self::reset_global) alone). Give the
    /// warm-up of the post-local SGD hook the replicas train under.
    pub fn with_local_start(mut self, local_start: u64) -> Self {
        self.local_start = local_start;
        self
    }

    /// Reduce the pseudo-gradient with `reduce` (default: mean of deltas for SGD, delta of mean
    /// for SlowMo, which averages the parameters as fairscale does and refuses the other).
    pub fn with_reduce(mut self, reduce: PseudoGradient) -> Result<Self, AveragerError> {
        if self.streaming.is_some() && reduce == PseudoGradient::DeltaOfMean {
            return Err(AveragerError::Outer(
                "Streaming DiLoCo averages the fragments' pseudo-gradients θ_f − x_f (torchft): \
                 the reduction must be mean-of-deltas"
                    .into(),
            ));
        }
        if matches!(self.optimizer, OuterOptimizer::SlowMo { .. })
            && reduce == PseudoGradient::MeanOfDeltas
        {
            return Err(AveragerError::Outer(
                "SlowMo averages the parameters (fairscale's gather) and computes its slow step \
                 from the average: the pseudo-gradient reduction must be delta-of-mean"
                    .into(),
            ));
        }
        if reduce == PseudoGradient::DeltaOfMean && self.compression.is_some() {
            return Err(compression_needs_deltas(self.compression));
        }
        self.reduce = reduce;
        Ok(self)
    }

    /// Send the pseudo-gradients compressed (`None`: full precision).
    ///
    /// [`AverageCompression::Half`]: OpenDiLoCo all-reduces them in fp16 "without any performance
    /// degradation"; each rank's `θ − x_r` is rounded to the precision once, divided by the
    /// group size and summed there (the hooks' compressed average), half the bytes of an f32
    /// sync. [`AverageCompression::Lossy`]: int8, int4 or top-k messages (INTELLECT-1, Streaming
    /// DiLoCo, SparseLoCo), all-gathered and summed in rank order (semantics §11), with error
    /// feedback keeping per fragment what a message did not carry; f32 parameters only.
    ///
    /// Needs [`PseudoGradient::MeanOfDeltas`]: the deltas are small numbers; the parameters that
    /// delta-of-mean averages are not, and rounding them would move the model itself. Errors
    /// also on invalid codec settings.
    pub fn with_compression(
        mut self,
        compression: Option<AverageCompression>,
    ) -> Result<Self, AveragerError> {
        if let Some(c) = &compression {
            c.validate()?;
        }
        if compression.is_some() && self.reduce == PseudoGradient::DeltaOfMean {
            return Err(compression_needs_deltas(compression));
        }
        self.compression = compression;
        Ok(self)
    }

    /// The pseudo-gradients' wire format (`None`: the parameters' own precision).
    pub fn compression(&self) -> Option<AverageCompression> {
        self.compression
    }

    /// The outer optimizer.
    pub fn optimizer(&self) -> &OuterOptimizer {
        &self.optimizer
    }

    /// How the pseudo-gradient is reduced.
    pub fn reduce(&self) -> PseudoGradient {
        self.reduce
    }

    /// The schedule.
    pub fn schedule(&self) -> &dyn ModelAverager {
        &*self.schedule
    }

    /// The inner learning rate SlowMo's slow step uses (γ). Set it to the learning rate of the
    /// optimizer step just taken, every step or whenever it changes; DiLoCo ignores it.
    pub fn set_inner_lr(&mut self, lr: f64) {
        self.inner_lr = Some(lr);
    }

    /// Outer steps taken so far.
    pub fn outer_steps(&self) -> u64 {
        self.outer_steps
    }

    /// `θ`, once taken (Streaming DiLoCo: fragment 0's; see
    /// [`fragment_params`](Self::fragment_params)).
    pub fn global_params(&self) -> Option<&FlatBuffer> {
        self.fragment_params(0)
    }

    /// Fragment `f`'s `θ_f`, once taken.
    pub fn fragment_params(&self, f: usize) -> Option<&FlatBuffer> {
        self.global.get(f).map(|g| &g.theta)
    }

    /// The outer momentum (torch's `momentum_buffer` for SGD, fairscale's
    /// `global_momentum_buffer` for SlowMo), if any (Streaming DiLoCo: fragment 0's).
    pub fn outer_momentum(&self) -> Option<&FlatBuffer> {
        self.fragment_momentum(0)
    }

    /// Fragment `f`'s outer momentum, if any.
    pub fn fragment_momentum(&self, f: usize) -> Option<&FlatBuffer> {
        let g = self.global.get(f)?;
        match &g.sgd {
            Some(sgd) => sgd.momentum_buffer(),
            None => g.slow_momentum.as_ref(),
        }
    }

    /// The number of fragments `θ` is kept in (1 unless streaming).
    pub fn fragment_count(&self) -> usize {
        self.streaming
            .as_ref()
            .map_or(1, |s| s.cadence.config().fragments)
    }

    /// Take `θ` from `selection`'s parameters of `module` (call on every rank with identical
    /// models before the first optimizer step, and whenever the global model is replaced). The
    /// outer optimizer's state is kept when `θ` keeps its layout and element type, and starts
    /// fresh otherwise. Not collective.
    pub fn reset_global<M: Module>(
        &mut self,
        module: &M,
        selection: &ParamSelection,
    ) -> Result<(), AveragerError> {
        let flat = flatten_params(module, selection)?;
        let parts = split_fragments(entries_of(&flat), &flat.buffer, self.fragment_count())?;
        let keep = self.global.len() == parts.len()
            && self.global.iter().zip(&parts).all(|(g, (entries, theta))| {
                &g.entries == entries && type_name(&g.theta) == type_name(theta)
            });
        if keep {
            for (g, (_, theta)) in self.global.iter_mut().zip(parts) {
                g.theta = theta;
            }
            return Ok(());
        }
        let mut global = Vec::with_capacity(parts.len());
        for (entries, theta) in parts {
            let (sgd, slow_momentum) = match self.optimizer {
                OuterOptimizer::Sgd(c) => (Some(OuterSgd::new(c)?), None),
                OuterOptimizer::SlowMo { .. } => (None, Some(zeros_like(&theta))),
            };
            global.push(Global {
                entries,
                theta,
                sgd,
                slow_momentum,
                feedback: None,
                owned: None,
            });
        }
        self.global = global;
        Ok(())
    }

    /// Wait for a pseudo-gradient average still on its way (Streaming DiLoCo with a delay) and
    /// keep it, not applied, for its perform step. Every rank calls it at the same step (a
    /// checkpoint, the end of training); a no-op when nothing is in flight.
    pub fn wait_in_flight(&mut self) -> Result<(), AveragerError> {
        if let Some(s) = &mut self.streaming
            && let Some((f, transfer)) = s.in_flight.take()
        {
            s.in_flight = Some((f, Transfer::Ready(transfer.into_ready()?)));
        }
        Ok(())
    }

    /// End of training: [`wait_in_flight`](Self::wait_in_flight) a pseudo-gradient in flight (it stays
    /// unapplied: the run ended before its perform step, and a checkpoint saved it) and close
    /// the non-blocking communicator (an error if a collective was left pending).
    pub fn finish(&mut self) -> Result<(), AveragerError> {
        self.wait_in_flight()?;
        if let Some(s) = &mut self.streaming
            && let Some(side) = s.side.take()
        {
            side.close()?;
        }
        Ok(())
    }

    /// The state to checkpoint beside [`state`](ModelAverager::state): per fragment `θ` and
    /// the outer momentum, the outer-step count, and a pending averaged pseudo-gradient (its
    /// collective completed first, see [`wait_in_flight`](Self::wait_in_flight)). `None` before `θ` was taken.
    pub fn global_state(&mut self) -> Result<Option<OuterState>, AveragerError> {
        if self.global.is_empty() {
            return Ok(None);
        }
        self.wait_in_flight()?;
        let pending = match self.streaming.as_ref().and_then(|s| s.in_flight.as_ref()) {
            Some((fragment, Transfer::Ready(delta))) => Some(PendingDelta {
                fragment: *fragment,
                delta: delta.clone(),
            }),
            _ => None,
        };
        Ok(Some(OuterState {
            outer_steps: self.outer_steps,
            fragments: (0..self.global.len())
                .map(|f| FragmentState {
                    entries: self.global[f].entries.clone(),
                    theta: self.global[f].theta.clone(),
                    momentum: self.fragment_momentum(f).cloned(),
                    residual: self.global[f]
                        .feedback
                        .as_ref()
                        .map(|fb| fb.residual().to_vec()),
                    owned_residual: self.global[f]
                        .owned
                        .as_ref()
                        .map(|fb| fb.residual().to_vec()),
                })
                .collect(),
            pending,
        }))
    }

    /// Restore a state from [`global_state`](Self::global_state). Fails, changing nothing, when
    /// its momentum does not fit this optimizer or its buffers disagree in type or length.
    pub fn load_global_state(&mut self, state: &OuterState) -> Result<(), AveragerError> {
        state.check()?;
        if state.fragments.len() != self.fragment_count() {
            return Err(AveragerError::Outer(format!(
                "the saved outer state has {} fragment(s), this averager keeps {}",
                state.fragments.len(),
                self.fragment_count()
            )));
        }
        if state.pending.is_some() && self.streaming.is_none() {
            return Err(AveragerError::Outer(
                "the saved outer state holds a pending pseudo-gradient, which only Streaming \
                 DiLoCo has"
                    .into(),
            ));
        }
        let mut global = Vec::with_capacity(state.fragments.len());
        for frag in &state.fragments {
            let (sgd, slow_momentum) = match self.optimizer {
                OuterOptimizer::Sgd(c) => {
                    if c.momentum == 0.0 && frag.momentum.is_some() {
                        return Err(AveragerError::Outer(
                            "the saved outer state has a momentum buffer but this outer SGD \
                             has momentum 0"
                                .into(),
                        ));
                    }
                    let mut sgd = OuterSgd::new(c)?;
                    sgd.set_momentum_buffer(frag.momentum.clone());
                    (Some(sgd), None)
                }
                OuterOptimizer::SlowMo { .. } => match &frag.momentum {
                    Some(m) => (None, Some(m.clone())),
                    None => {
                        return Err(AveragerError::Outer(
                            "the saved outer state has no slow momentum buffer, which SlowMo \
                             needs"
                                .into(),
                        ));
                    }
                },
            };
            let residual = |r: &Option<Vec<f32>>, what: &str| match r {
                Some(r) if r.len() != frag.theta.len() => Err(AveragerError::Outer(format!(
                    "the saved {what} has {} elements, its fragment {}",
                    r.len(),
                    frag.theta.len()
                ))),
                Some(r) => Ok(Some(ErrorFeedback::from_residual(r.clone()))),
                None => Ok(None),
            };
            let feedback = residual(&frag.residual, "error-feedback residual")?;
            let owned = residual(&frag.owned_residual, "owner's error-feedback residual")?;
            global.push(Global {
                entries: frag.entries.clone(),
                theta: frag.theta.clone(),
                sgd,
                slow_momentum,
                feedback,
                owned,
            });
        }
        self.global = global;
        self.outer_steps = state.outer_steps;
        if let Some(s) = &mut self.streaming {
            s.in_flight = state
                .pending
                .as_ref()
                .map(|p| (p.fragment, Transfer::Ready(p.delta.clone())));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        // Compression appears only when on, so states of full-precision runs keep their text.
        let compression = match self.compression {
            Some(p) => format!(", compression {p}"),
            None => String::new(),
        };
        let alpha = match &self.streaming {
            Some(s) => format!(", alpha {}", s.cadence.config().alpha),
            None => String::new(),
        };
        format!(
            "outer({:?}, reduce {:?}, local_start {}{compression}{alpha})",
            self.optimizer, self.reduce, self.local_start
        )
    }

    /// One training iteration's averaging (the body of
    /// [`average_parameters`](crate::AverageParameters::average_parameters) for this averager).
    pub(crate) fn average_module<M: Module>(
        &mut self,
        module: M,
        selection: &ParamSelection,
    ) -> Result<M, AveragerError> {
        let step = self.schedule.step();
        let module = match (&self.streaming, self.slowmo) {
            (_, Some(c)) => match c.event(step) {
                SlowMoEvent::Sync => self.outer_sync(module, selection)?,
                SlowMoEvent::Average => {
                    // θ is not needed yet, but a missing one fails now, not at the slow step.
                    if self.global.is_empty() {
                        return Err(not_taken());
                    }
                    average_in_group(module, selection, &self.world)?
                }
                SlowMoEvent::Local => module,
            },
            (Some(s), None) => {
                let event = s.cadence.event(step);
                if let Some(f) = event.prepare {
                    self.start_delta(&module, f)?;
                }
                match event.perform {
                    Some(f) => self.apply_delta(module, f)?,
                    None => module,
                }
            }
            (None, None) => match self.schedule.scheduled_group() {
                Some(g) if g.size() == self.world.size() => self.outer_sync(module, selection)?,
                Some(g) => average_in_group(module, selection, &g)?,
                None => module,
            },
        };
        if self.local_start > 0 && step + 1 == self.local_start {
            self.refresh_global(&module)?;
        }
        self.schedule.advance();
        Ok(module)
    }

    /// `θ ← x` over `θ`'s own parameters (the warm-up's end).
    fn refresh_global<M: Module>(&mut self, module: &M) -> Result<(), AveragerError> {
        if self.global.is_empty() {
            return Err(not_taken());
        }
        let indices: Vec<usize> = self
            .global
            .iter()
            .flat_map(|g| g.entries.iter().map(|e| e.0))
            .collect();
        self.reset_global(module, &selection_of_indices(module, &indices))
    }

    /// Fragment `f`'s parameters of `module`, checked against `θ_f`.
    fn fragment_flat<M: Module>(
        &self,
        module: &M,
        f: usize,
    ) -> Result<localsgd_comm::params::FlatParams, AveragerError> {
        let g = self.global.get(f).ok_or_else(not_taken)?;
        let indices: Vec<usize> = g.entries.iter().map(|e| e.0).collect();
        let flat = flatten_params(module, &selection_of_indices(module, &indices))?;
        if entries_of(&flat) != g.entries || type_name(&flat.buffer) != type_name(&g.theta) {
            return Err(AveragerError::Outer(format!(
                "fragment {f}'s parameters ({} {} elements) are not those θ_{f} was taken from \
                 ({} {} elements): take θ again with reset_global",
                flat.buffer.len(),
                type_name(&flat.buffer),
                g.theta.len(),
                type_name(&g.theta)
            )));
        }
        Ok(flat)
    }

    /// Streaming prepare: `θ_f − x_f` and its average over the world, started (blocking when
    /// the delay is 0).
    fn start_delta<M: Module>(&mut self, module: &M, f: usize) -> Result<(), AveragerError> {
        let flat = self.fragment_flat(module, f)?;
        let world = self.world.clone();
        if world.size() > 1 {
            check_agreement(&world, &flat)?;
        }
        let compression = self.compression;
        let round = self.outer_steps;
        let g = &mut self.global[f];
        let theta = &g.theta;
        let feedback = feedback_of(&mut g.feedback, compression, theta.len());
        let owned = owned_of(&mut g.owned, compression, theta.len(), world.size());
        let Some(s) = self.streaming.as_mut() else {
            return Err(AveragerError::Outer("not a streaming averager".into()));
        };
        if let Some((pending, _)) = &s.in_flight {
            return Err(AveragerError::Outer(format!(
                "fragment {f}'s pseudo-gradient cannot start while fragment {pending}'s is still \
                 pending (the delay must be below sync_every / fragments)"
            )));
        }
        let delayed = s.cadence.config().delay > 0 && world.size() > 1;
        let side = if delayed {
            Some(side_group(&mut s.side, &world)?)
        } else {
            None
        };
        let transfer = match (&flat.buffer, theta) {
            (FlatBuffer::F32(x), FlatBuffer::F32(t)) => {
                let codec = Lossy::new(compression, feedback, owned, round);
                mean_delta(difference(t, x), side, &world, codec)?
            }
            (FlatBuffer::F64(x), FlatBuffer::F64(t)) => {
                let codec = Lossy::new(compression, feedback, owned, round);
                mean_delta(difference(t, x), side, &world, codec)?
            }
            _ => return Err(type_changed()),
        };
        s.in_flight = Some((f, transfer));
        Ok(())
    }

    /// Streaming perform: wait for fragment `f`'s averaged pseudo-gradient, take the outer step
    /// on `θ_f`, and mix: `x_f ← θ_f + α·(X_f − θ_f)`.
    fn apply_delta<M: Module>(&mut self, module: M, f: usize) -> Result<M, AveragerError> {
        let Some(s) = self.streaming.as_mut() else {
            return Err(AveragerError::Outer("not a streaming averager".into()));
        };
        let alpha = s.cadence.config().alpha;
        let delta = match s.in_flight.take() {
            Some((g, transfer)) if g == f => transfer.into_ready()?,
            other => {
                return Err(AveragerError::Outer(format!(
                    "fragment {f} is due for its outer step but {} (a checkpoint taken between \
                     its prepare and perform steps must carry the pending pseudo-gradient)",
                    match other {
                        Some((g, _)) => format!("the pending pseudo-gradient is fragment {g}'s"),
                        None => "no pseudo-gradient is pending".to_string(),
                    }
                )));
            }
        };
        let mut flat = self.fragment_flat(&module, f)?;
        let g = &mut self.global[f];
        let sgd = g.sgd.as_mut().ok_or_else(type_changed)?;
        sgd.step(&mut g.theta, &delta)?;
        match (&mut flat.buffer, &g.theta) {
            (FlatBuffer::F32(x), FlatBuffer::F32(t)) => mix(x, t, alpha),
            (FlatBuffer::F64(x), FlatBuffer::F64(t)) => mix(x, t, alpha),
            _ => return Err(type_changed()),
        }
        self.outer_steps += 1;
        Ok(write_params(module, &flat)?)
    }

    fn outer_sync<M: Module>(
        &mut self,
        module: M,
        selection: &ParamSelection,
    ) -> Result<M, AveragerError> {
        let world = self.world.clone();
        let reduce = self.reduce;
        let compression = self.compression;
        let optimizer = self.optimizer;
        let inner_lr = self.inner_lr;
        let round = self.outer_steps;
        let Some(g) = self.global.first_mut() else {
            return Err(not_taken());
        };
        let mut flat = flatten_params(&module, selection)?;
        let entries = entries_of(&flat);
        if entries != g.entries || type_name(&flat.buffer) != type_name(&g.theta) {
            return Err(AveragerError::Outer(format!(
                "the parameters to synchronise ({} {} tensors, {} elements) are not those θ was \
                 taken from ({} {} tensors, {} elements): take θ again with reset_global",
                entries.len(),
                type_name(&flat.buffer),
                flat.buffer.len(),
                g.entries.len(),
                type_name(&g.theta),
                g.theta.len()
            )));
        }
        if world.size() > 1 {
            check_agreement(&world, &flat)?;
        }
        match optimizer {
            OuterOptimizer::Sgd(_) => {
                let delta = match (reduce, &mut flat.buffer, &g.theta) {
                    (PseudoGradient::MeanOfDeltas, FlatBuffer::F32(x), FlatBuffer::F32(t)) => {
                        let mut d = difference(t, x);
                        let n = d.len();
                        let feedback = feedback_of(&mut g.feedback, compression, n);
                        let owned = owned_of(&mut g.owned, compression, n, world.size());
                        let codec = Lossy::new(compression, feedback, owned, round);
                        group_mean(&world, &mut d, codec)?;
                        FlatBuffer::F32(d)
                    }
                    (PseudoGradient::MeanOfDeltas, FlatBuffer::F64(x), FlatBuffer::F64(t)) => {
                        let mut d = difference(t, x);
                        let n = d.len();
                        let feedback = feedback_of(&mut g.feedback, compression, n);
                        let owned = owned_of(&mut g.owned, compression, n, world.size());
                        let codec = Lossy::new(compression, feedback, owned, round);
                        group_mean(&world, &mut d, codec)?;
                        FlatBuffer::F64(d)
                    }
                    (PseudoGradient::DeltaOfMean, FlatBuffer::F32(x), FlatBuffer::F32(t)) => {
                        group_mean(&world, x, Lossy::none())?;
                        FlatBuffer::F32(difference(t, x))
                    }
                    (PseudoGradient::DeltaOfMean, FlatBuffer::F64(x), FlatBuffer::F64(t)) => {
                        group_mean(&world, x, Lossy::none())?;
                        FlatBuffer::F64(difference(t, x))
                    }
                    _ => return Err(type_changed()),
                };
                let sgd = g.sgd.as_mut().ok_or_else(type_changed)?;
                sgd.step(&mut g.theta, &delta)?;
                flat.buffer = g.theta.clone();
            }
            OuterOptimizer::SlowMo { lr, momentum } => {
                match &mut flat.buffer {
                    FlatBuffer::F32(x) => group_mean(&world, x, Lossy::none())?,
                    FlatBuffer::F64(x) => group_mean(&world, x, Lossy::none())?,
                }
                if lr == 1.0 && momentum == 0.0 {
                    // fairscale's shortcut: the slow step is never computed.
                    g.theta = flat.buffer.clone();
                } else {
                    let gamma = match inner_lr {
                        Some(l) if l.is_finite() && l > 0.0 => l,
                        other => {
                            return Err(AveragerError::Outer(format!(
                                "SlowMo's slow step divides by the inner learning rate, which \
                                 is {}: set it with set_inner_lr to the step's finite \
                                 learning rate > 0",
                                other.map_or("not set".to_string(), |l| l.to_string())
                            )));
                        }
                    };
                    let u = g.slow_momentum.as_mut().ok_or_else(type_changed)?;
                    match (&mut flat.buffer, &mut g.theta, u) {
                        (FlatBuffer::F32(x), FlatBuffer::F32(t), FlatBuffer::F32(u)) => {
                            slow_step(lr, momentum, gamma, x, t, u)
                        }
                        (FlatBuffer::F64(x), FlatBuffer::F64(t), FlatBuffer::F64(u)) => {
                            slow_step(lr, momentum, gamma, x, t, u)
                        }
                        _ => return Err(type_changed()),
                    }
                }
            }
        }
        self.outer_steps += 1;
        Ok(write_params(module, &flat)?)
    }
}

/// `x ← t + α·(x − t)` element by element (torchft's `lerp_`); `x ← t` exactly when `α = 0`.
fn mix<T: Real>(x: &mut [T], t: &[T], alpha: f64) {
    if alpha == 0.0 {
        x.copy_from_slice(t);
        return;
    }
    let a = T::of(alpha);
    for (x, &t) in x.iter_mut().zip(t) {
        *x = t + a * (*x - t);
    }
}

/// A fragment's (traversal index, element count) entries and its values.
type Fragment = (Vec<(usize, usize)>, FlatBuffer);

/// Split θ's parameters into `count` fragments of whole tensors, contiguous in traversal
/// order, the first `n mod count` one tensor longer.
fn split_fragments(
    entries: Vec<(usize, usize)>,
    buffer: &FlatBuffer,
    count: usize,
) -> Result<Vec<Fragment>, AveragerError> {
    if count == 1 {
        return Ok(vec![(entries, buffer.clone())]);
    }
    let n = entries.len();
    if n < count {
        return Err(AveragerError::Outer(format!(
            "Streaming DiLoCo splits the parameters into {count} fragments of whole tensors, but \
             only {n} parameter tensor(s) are selected (valid: at most {n} fragments)"
        )));
    }
    let mut out = Vec::with_capacity(count);
    let (mut tensor, mut offset) = (0, 0);
    for f in 0..count {
        let take = n / count + usize::from(f < n % count);
        let part: Vec<(usize, usize)> = entries[tensor..tensor + take].to_vec();
        let len: usize = part.iter().map(|e| e.1).sum();
        let slice = match buffer {
            FlatBuffer::F32(v) => FlatBuffer::F32(v[offset..offset + len].to_vec()),
            FlatBuffer::F64(v) => FlatBuffer::F64(v[offset..offset + len].to_vec()),
        };
        out.push((part, slice));
        tensor += take;
        offset += len;
    }
    Ok(out)
}

fn compression_needs_deltas(compression: Option<AverageCompression>) -> AveragerError {
    AveragerError::Outer(format!(
        "{} compression sends the pseudo-gradients θ − x_r compressed, which needs the \
         mean-of-deltas reduction (valid: reduce mean-of-deltas with compression, or no \
         compression with delta-of-mean)",
        compression.map_or("half-precision".to_string(), |c| c.to_string())
    ))
}

fn not_taken() -> AveragerError {
    AveragerError::Outer(
        "the global parameters θ were never taken: call reset_global(&model, &selection) on \
         every rank, with identical models, before the first optimizer step"
            .into(),
    )
}

/// (traversal index, element count) of every flattened parameter.
fn entries_of(flat: &localsgd_comm::params::FlatParams) -> Vec<(usize, usize)> {
    flat.layout
        .entries
        .iter()
        .map(|e| (e.index, e.len))
        .collect()
}

fn zeros_like(b: &FlatBuffer) -> FlatBuffer {
    match b {
        FlatBuffer::F32(v) => FlatBuffer::F32(vec![0.0; v.len()]),
        FlatBuffer::F64(v) => FlatBuffer::F64(vec![0.0; v.len()]),
    }
}

/// `theta − x`, element by element.
fn difference<T: Real>(theta: &[T], x: &[T]) -> Vec<T> {
    theta.iter().zip(x).map(|(&t, &x)| t - x).collect()
}

impl ModelAverager for OuterAverager {
    fn step(&self) -> u64 {
        self.schedule.step()
    }

    fn scheduled_group(&self) -> Option<Group> {
        self.schedule.scheduled_group()
    }

    fn advance(&mut self) {
        self.schedule.advance()
    }

    fn state(&self) -> AveragerState {
        let inner = self.schedule.state();
        AveragerState {
            step: inner.step,
            config: AveragerConfig::Outer {
                schedule: Box::new(inner.config),
                outer: self.describe(),
            },
        }
    }

    fn load_state(&mut self, state: &AveragerState) -> Result<(), AveragerError> {
        check_state_config(&self.state().config, state)?;
        let inner = self.schedule.state();
        self.schedule.load_state(&AveragerState {
            step: state.step,
            config: inner.config,
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl dyn ModelAverager + '_ {
    /// The outer-optimizer averager behind this averager, for one (taking `θ`, SlowMo's inner
    /// learning rate, its state); `None` for plain averaging.
    pub fn outer(&self) -> Option<&OuterAverager> {
        self.as_any().downcast_ref()
    }

    /// Mutable [`outer`](Self::outer).
    pub fn outer_mut(&mut self) -> Option<&mut OuterAverager> {
        self.as_any_mut().downcast_mut()
    }
}
