//! Outer-optimizer model averaging (`../shared/spec/outer-optimizers.md`): DiLoCo and SlowMo.
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
//!
//! The schedule is any [`ModelAverager`] without overlap: the outer step runs on the steps where
//! it averages over the whole group; steps where it averages a smaller group (the lower levels of
//! a [`HierarchicalModelAverager`](crate::HierarchicalModelAverager)) stay plain averaging.
//! [`OuterAverager::periodic`] builds the spec's cadence: after a warm-up of `W` steps, sync
//! after local steps `H, 2H, ...` (0-based steps `W+H−1, W+2H−1, ...`).
//!
//! `θ` is taken by [`OuterAverager::reset_global`] (call it before the first optimizer step,
//! when the replicas are identical) and refreshed automatically after the last warm-up step
//! `W − 1` (the replicas, synchronised by gradient all-reduce during the warm-up, are identical
//! but have moved). A synchronisation without `θ` is an error, never a lazy snapshot.
//!
//! Not here yet: Streaming DiLoCo (fragments, delayed fragment sync, mixing), pseudo-gradient
//! compression, the binary's `--algorithm diloco|slowmo`.
//!
//! Four workers (threads) with targets 0..3 fit `w` by SGD; DiLoCo syncs every 3 steps. The
//! numbers are the spec's vector V2:
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

mod sgd;
mod state;

pub use sgd::{OuterSgd, OuterSgdConfig};
pub use state::OuterState;

use crate::average::{average_in_group, check_agreement};
use crate::averager::{ModelAverager, check_state_config};
use crate::error::AveragerError;
use crate::overlap::selection_of_indices;
use crate::periodic::PeriodicModelAverager;
use crate::state::{AveragerConfig, AveragerState};
use burn::module::Module;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params, write_params};
use localsgd_comm::precision::Compressible;
use localsgd_comm::{Element, Group, GroupExt, Precision, average_compressed, round_to};
use serde::{Deserialize, Serialize};
use sgd::{Real, slow_step, type_name};

/// How the pseudo-gradient is reduced over the group (spec §1.1). Equal in exact arithmetic,
/// they round differently (bitwise equal on dyadic data, vector V9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PseudoGradient {
    /// Variant A (torchft, OpenDiLoCo, hivemind): every rank computes `θ − x_r`; the group
    /// averages those.
    MeanOfDeltas,
    /// Variant B (fairscale): the group averages the parameters; every rank computes
    /// `θ − mean(x_r)`.
    DeltaOfMean,
}

/// The outer optimizer of an [`OuterAverager`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OuterOptimizer {
    /// `torch.optim.SGD` on `θ` with the pseudo-gradient as gradient (DiLoCo).
    Sgd(OuterSgdConfig),
    /// fairscale's SlowMo slow step: slow learning rate `lr` (α, fairscale's `slowmo_lr`) and
    /// slow momentum `momentum` (β, `slowmo_momentum`). fairscale's defaults are `(1.0, 0.5)`.
    SlowMo {
        /// α (`slowmo_lr`), `> 0`.
        lr: f64,
        /// β (`slowmo_momentum`), `>= 0`.
        momentum: f64,
    },
}

impl From<OuterSgdConfig> for OuterOptimizer {
    fn from(config: OuterSgdConfig) -> Self {
        OuterOptimizer::Sgd(config)
    }
}

impl OuterOptimizer {
    /// Check the settings: torch's rules for [`Sgd`](Self::Sgd) (see
    /// [`OuterSgdConfig::validate`]), `lr > 0` and `momentum >= 0`, both finite, for
    /// [`SlowMo`](Self::SlowMo). The error names the value and what would be valid.
    pub fn validate(&self) -> Result<(), AveragerError> {
        match *self {
            OuterOptimizer::Sgd(c) => c.validate(),
            OuterOptimizer::SlowMo { lr, momentum } => {
                if !(lr.is_finite() && lr > 0.0) {
                    return Err(AveragerError::Outer(format!(
                        "SlowMo's slow learning rate must be a finite number > 0 (got {lr}); \
                         fairscale's default is 1"
                    )));
                }
                if !(momentum.is_finite() && momentum >= 0.0) {
                    return Err(AveragerError::Outer(format!(
                        "SlowMo's slow momentum must be a finite number >= 0 (got {momentum}); \
                         fairscale's default is 0.5"
                    )));
                }
                Ok(())
            }
        }
    }

    /// The pseudo-gradient reduction an [`OuterAverager`] uses unless told otherwise: mean of
    /// deltas for SGD (torchft, OpenDiLoCo), delta of mean for SlowMo (fairscale).
    pub fn default_reduce(&self) -> PseudoGradient {
        match self {
            OuterOptimizer::Sgd(_) => PseudoGradient::MeanOfDeltas,
            OuterOptimizer::SlowMo { .. } => PseudoGradient::DeltaOfMean,
        }
    }
}

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
}

/// Model averaging with an outer optimizer (DiLoCo, SlowMo); see the [module docs](self).
#[derive(Debug)]
pub struct OuterAverager {
    world: Group,
    schedule: Box<dyn ModelAverager>,
    optimizer: OuterOptimizer,
    reduce: PseudoGradient,
    local_start: u64,
    inner_lr: Option<f64>,
    global: Option<Global>,
    outer_steps: u64,
    compression: Option<Precision>,
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
            global: None,
            outer_steps: 0,
            compression: None,
        })
    }

    /// The spec's cadence: `warmup` steps of synchronous training (0-based steps
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

    /// Send the pseudo-gradients in half precision (`None`: full precision). OpenDiLoCo
    /// all-reduces them in fp16 "without any performance degradation"; each rank's `θ − x_r` is
    /// rounded to `precision` once, divided by the group size and summed there (the hooks'
    /// compressed average), so a sync moves half the bytes of an f32 one. Needs
    /// [`PseudoGradient::MeanOfDeltas`]: the deltas are small numbers; the parameters that
    /// delta-of-mean averages are not, and rounding them would move the model itself.
    pub fn with_compression(mut self, precision: Option<Precision>) -> Result<Self, AveragerError> {
        if precision.is_some() && self.reduce == PseudoGradient::DeltaOfMean {
            return Err(compression_needs_deltas(precision));
        }
        self.compression = precision;
        Ok(self)
    }

    /// The pseudo-gradients' wire precision (`None`: the parameters' own).
    pub fn compression(&self) -> Option<Precision> {
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

    /// `θ`, once taken.
    pub fn global_params(&self) -> Option<&FlatBuffer> {
        self.global.as_ref().map(|g| &g.theta)
    }

    /// The outer momentum (torch's `momentum_buffer` for SGD, fairscale's
    /// `global_momentum_buffer` for SlowMo), if any.
    pub fn outer_momentum(&self) -> Option<&FlatBuffer> {
        let g = self.global.as_ref()?;
        match &g.sgd {
            Some(sgd) => sgd.momentum_buffer(),
            None => g.slow_momentum.as_ref(),
        }
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
        let entries = entries_of(&flat);
        if let Some(g) = &mut self.global
            && g.entries == entries
            && type_name(&g.theta) == type_name(&flat.buffer)
        {
            g.theta = flat.buffer;
            return Ok(());
        }
        let (sgd, slow_momentum) = match self.optimizer {
            OuterOptimizer::Sgd(c) => (Some(OuterSgd::new(c)?), None),
            OuterOptimizer::SlowMo { .. } => (None, Some(zeros_like(&flat.buffer))),
        };
        self.global = Some(Global {
            entries,
            theta: flat.buffer,
            sgd,
            slow_momentum,
        });
        Ok(())
    }

    /// The state to checkpoint beside [`state`](ModelAverager::state): `θ`, the outer momentum
    /// and the outer-step count (`None` before `θ` was taken).
    pub fn global_state(&self) -> Option<OuterState> {
        let g = self.global.as_ref()?;
        Some(OuterState {
            outer_steps: self.outer_steps,
            entries: g.entries.clone(),
            theta: g.theta.clone(),
            momentum: self.outer_momentum().cloned(),
        })
    }

    /// Restore a state from [`global_state`](Self::global_state). Fails, changing nothing, when
    /// its momentum does not fit this optimizer or its buffers disagree in type or length.
    pub fn load_global_state(&mut self, state: &OuterState) -> Result<(), AveragerError> {
        state.check()?;
        let (sgd, slow_momentum) = match self.optimizer {
            OuterOptimizer::Sgd(c) => {
                if c.momentum == 0.0 && state.momentum.is_some() {
                    return Err(AveragerError::Outer(
                        "the saved outer state has a momentum buffer but this outer SGD has \
                         momentum 0"
                            .into(),
                    ));
                }
                let mut sgd = OuterSgd::new(c)?;
                sgd.set_momentum_buffer(state.momentum.clone());
                (Some(sgd), None)
            }
            OuterOptimizer::SlowMo { .. } => match &state.momentum {
                Some(m) => (None, Some(m.clone())),
                None => {
                    return Err(AveragerError::Outer(
                        "the saved outer state has no slow momentum buffer, which SlowMo needs"
                            .into(),
                    ));
                }
            },
        };
        self.global = Some(Global {
            entries: state.entries.clone(),
            theta: state.theta.clone(),
            sgd,
            slow_momentum,
        });
        self.outer_steps = state.outer_steps;
        Ok(())
    }

    fn describe(&self) -> String {
        // Compression appears only when on, so states of full-precision runs keep their text.
        let compression = match self.compression {
            Some(p) => format!(", compression {p}"),
            None => String::new(),
        };
        format!(
            "outer({:?}, reduce {:?}, local_start {}{compression})",
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
        let module = match self.schedule.scheduled_group() {
            Some(g) if g.size() == self.world.size() => self.outer_sync(module, selection)?,
            Some(g) => average_in_group(module, selection, &g)?,
            None => module,
        };
        if self.local_start > 0 && step + 1 == self.local_start {
            self.refresh_global(&module)?;
        }
        self.schedule.advance();
        Ok(module)
    }

    /// `θ ← x` over `θ`'s own parameters (the warm-up's end).
    fn refresh_global<M: Module>(&mut self, module: &M) -> Result<(), AveragerError> {
        let Some(g) = &self.global else {
            return Err(not_taken());
        };
        let indices: Vec<usize> = g.entries.iter().map(|e| e.0).collect();
        self.reset_global(module, &selection_of_indices(module, &indices))
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
        let Some(g) = self.global.as_mut() else {
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
                        group_mean(&world, &mut d, compression)?;
                        FlatBuffer::F32(d)
                    }
                    (PseudoGradient::MeanOfDeltas, FlatBuffer::F64(x), FlatBuffer::F64(t)) => {
                        let mut d = difference(t, x);
                        group_mean(&world, &mut d, compression)?;
                        FlatBuffer::F64(d)
                    }
                    (PseudoGradient::DeltaOfMean, FlatBuffer::F32(x), FlatBuffer::F32(t)) => {
                        group_mean(&world, x, None)?;
                        FlatBuffer::F32(difference(t, x))
                    }
                    (PseudoGradient::DeltaOfMean, FlatBuffer::F64(x), FlatBuffer::F64(t)) => {
                        group_mean(&world, x, None)?;
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
                    FlatBuffer::F32(x) => group_mean(&world, x, None)?,
                    FlatBuffer::F64(x) => group_mean(&world, x, None)?,
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

/// `v` replaced by its mean over `world` (divide, then sum), on the wire in `compression` when
/// given. One rank sends nothing (the mean of one replica is itself); compression still
/// rounds there, as the wire would.
fn group_mean<T: Element + Compressible>(
    world: &Group,
    v: &mut [T],
    compression: Option<Precision>,
) -> Result<(), AveragerError> {
    match (compression, world.size()) {
        (None, 1) => {}
        (None, _) => world.average_slice(v)?,
        (Some(p), 1) => round_to(v, p),
        (Some(p), _) => average_compressed(&**world, v, p)?,
    }
    Ok(())
}

fn compression_needs_deltas(precision: Option<Precision>) -> AveragerError {
    AveragerError::Outer(format!(
        "{} compression sends the pseudo-gradients θ − x_r in half precision, which needs the \
         mean-of-deltas reduction (valid: reduce mean-of-deltas with compression, or no \
         compression with delta-of-mean)",
        precision.map_or("half-precision".to_string(), |p| p.to_string())
    ))
}

fn not_taken() -> AveragerError {
    AveragerError::Outer(
        "the global parameters θ were never taken: call reset_global(&model, &selection) on \
         every rank, with identical models, before the first optimizer step"
            .into(),
    )
}

fn type_changed() -> AveragerError {
    AveragerError::Outer("θ and the outer optimizer's state disagree in element type".into())
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

    fn outer(&self) -> Option<&OuterAverager> {
        Some(self)
    }

    fn outer_mut(&mut self) -> Option<&mut OuterAverager> {
        Some(self)
    }
}
