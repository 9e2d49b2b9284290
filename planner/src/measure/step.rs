//! Milliseconds per iteration of a bare burn loop (`localsgd bench-step`): forward, loss (read
//! back, as the pipeline does), backward, optimizer step, with no pipeline and no
//! communication. It is the compute term of the cost model and the "bare burn" column of the
//! benchmark matrix.
//!
//! Apart from the step's clock it also times what a gradient all-reduce costs this rank besides
//! the wire: the gradients flattened into one buffer, averaged over a one-rank thread group
//! (the mean's division and the backend's own pass over the buffer) and written back — the
//! reducer's blocking path with nobody to wait for — as [`StepTiming::copy_ms`]: the per-byte
//! cost term of the model ([`Workload::copy_bytes_per_second`](crate::Workload)). (A one-rank
//! DDP run does not measure it: its mean is the identity and skips all of this.)
//!
//! With peers (a one-process-per-rank backend's world), every rank runs the same loop and
//! joins a one-float all-reduce between steps, outside the clock, as a training iteration's
//! has-data agreement sits between its steps; that all-reduce takes the maximum of the step's
//! time over the ranks, so the mean and median are over each step's slowest rank (as a
//! synchronous iteration waits for it). That is the compute of a step as it runs between
//! collectives, where the network stack and the collective's progress engine take turns with it
//! on the cores. The loop's cycle — step and all-reduce together, on this rank's clock — is
//! reported apart ([`StepTiming::cycle_mean_ms`]): less the slowest step, it is what one small
//! collective costs between real steps, including the wait for ranks the scheduler has not run
//! yet when there are more ranks than cores (`bench/bench-matrix` feeds it to `localsgd plan
//! --latency-us`).
//!
//! Steps back to back are the best case. A gap spins before each step, off the clock, as a
//! rank waits in its collectives between steps: a step that follows a wait can be slower than
//! one that follows another step (`bench/results/` keeps the measurements).

use super::throughput::spin;
use super::{MeasureError, check_gap, invalid};
use burn::module::Module;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_grads, grads_from_flat};
use localsgd_comm::{CommError, Group, GroupExt, ReduceOp, ThreadWorld};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the bare loop runs: timed and warm-up iterations, restarts, and a spin before each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepSettings {
    iters: usize,
    warmup_iters: usize,
    restart_every: usize,
    gap: Duration,
}

impl StepSettings {
    /// `iters` timed iterations (at least 1) after `warmup_iters` untimed ones; every
    /// `restart_every` iterations (warm-up ones included; 0: never) training starts again (the
    /// initial weights, a fresh optimizer, the first batch); `gap` of spinning before each step,
    /// off the clock (at most [`MAX_GAP`](super::MAX_GAP); zero: none).
    pub fn new(
        iters: usize,
        warmup_iters: usize,
        restart_every: usize,
        gap: Duration,
    ) -> Result<Self, MeasureError> {
        if iters == 0 {
            return Err(invalid("iters", 0, "at least 1 timed iteration"));
        }
        check_gap(gap)?;
        Ok(Self {
            iters,
            warmup_iters,
            restart_every,
            gap,
        })
    }

    /// Timed iterations.
    pub fn iters(&self) -> usize {
        self.iters
    }

    /// Untimed iterations first.
    pub fn warmup_iters(&self) -> usize {
        self.warmup_iters
    }

    /// Iterations after which training starts again (0: never).
    pub fn restart_every(&self) -> usize {
        self.restart_every
    }

    /// The spin before each step.
    pub fn gap(&self) -> Duration {
        self.gap
    }

    /// The step of its run that iteration `it` (0-based, warm-up included) trains: `it`, or
    /// with restarts `it % restart_every`.
    pub fn step_of(&self, it: usize) -> usize {
        match self.restart_every {
            0 => it,
            every => it % every,
        }
    }
}

/// What one rank measured (with peers, the step times are each step's slowest rank's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTiming {
    /// Median milliseconds of a step over the timed iterations.
    pub median_ms: f64,
    /// Mean milliseconds of a step over the timed iterations.
    pub mean_ms: f64,
    /// Mean milliseconds of a step plus the all-reduce between steps, on this rank's clock (the
    /// step alone without peers).
    pub cycle_mean_ms: f64,
    /// Median milliseconds of the gradients' flatten, one-rank mean and write-back.
    pub copy_ms: f64,
    /// Ranks that ran the loop (1 without peers).
    pub ranks: usize,
    /// The loss of the last timed step, as read back (a check of what was trained).
    pub last_loss: f32,
}

/// Why [`measure_step`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError<E> {
    /// Building a batch failed.
    #[error(transparent)]
    Batch(E),
    /// A collective, flattening or writing back failed.
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// Time the bare loop of `model` on this rank. Each iteration builds its batch off the clock
/// (`batch(step)`, the batch of that step of its run, see [`StepSettings::step_of`]), spins for
/// the gap, then on the clock computes `loss`, reads it back, runs the backward pass and steps
/// `optimizer`'s result at `lr`. With `peers`, between steps (off the clock) a one-float
/// all-reduce of the step's time (max) makes each step count its slowest rank; every rank of
/// `peers` must call this with the same settings. After the loop, the gradients of the first
/// batch are flattened, averaged over a one-rank group and written back, timed apart
/// ([`StepTiming::copy_ms`]; inside the loop they would change the bare step).
///
/// `optimizer` makes a fresh optimizer (at the start and at every restart); `model` is the
/// initial model, on an autodiff device.
///
/// ```
/// use burn::module::{Module, Param};
/// use burn::optim::SgdConfig;
/// use burn::tensor::{Device, Tensor, TensorData};
/// use localsgd_planner::measure::{StepSettings, measure_step};
/// use std::time::Duration;
///
/// #[derive(Module, Debug)]
/// struct Line {
///     w: Param<Tensor<2>>,
/// }
///
/// let device = Device::flex().autodiff();
/// let line = Line {
///     w: Param::from_tensor(Tensor::from_data(TensorData::new(vec![0.5f32, -0.25], [2, 1]), &device)),
/// };
/// // Squared error of `x w` against 0, on a batch of two rows per step.
/// let loss = |m: &Line, x: &Tensor<2>| {
///     let y = x.clone().matmul(m.w.val());
///     (y.clone() * y).mean()
/// };
/// let batch = |step: usize| -> Result<Tensor<2>, std::convert::Infallible> {
///     let v = step as f32;
///     Ok(Tensor::from_data(TensorData::new(vec![1.0, v, v, 1.0], [2, 2]), &device))
/// };
/// let settings = StepSettings::new(5, 1, 0, Duration::ZERO)?;
/// let timing = measure_step(line, || SgdConfig::new().init(), 0.1, loss, batch, &settings, None)?;
/// assert_eq!(timing.ranks, 1);
/// assert!(timing.median_ms > 0.0 && timing.copy_ms > 0.0 && timing.last_loss.is_finite());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn measure_step<M, T, E>(
    model: M,
    mut optimizer: impl FnMut() -> ModuleOptimizer,
    lr: f64,
    loss: impl Fn(&M, &T) -> Tensor<1>,
    mut batch: impl FnMut(usize) -> Result<T, E>,
    settings: &StepSettings,
    peers: Option<&Group>,
) -> Result<StepTiming, StepError<E>>
where
    M: Module,
{
    let mut model = model;
    let mut optim = optimizer();
    // What a restart goes back to (burn's optimizer step makes new tensors, so this clone
    // keeps the initial values).
    let initial = model.clone();
    // A one-rank group (its handle used on this thread alone).
    let alone: Group =
        Arc::new(ThreadWorld::new(1)?.groups().pop().ok_or_else(|| {
            CommError::InvalidConfig("a one-rank thread world has no group".into())
        })?);
    let mut times = Vec::with_capacity(settings.iters);
    let mut cycles = Vec::with_capacity(settings.iters);
    let mut last_loss = f32::NAN;
    for it in 0..settings.warmup_iters + settings.iters {
        // The iteration's step in its run: with restarts, runs of that many steps one after
        // the other, each from the start (outside the clock).
        let step = settings.step_of(it);
        if step == 0 && it > 0 {
            model = initial.clone();
            optim = optimizer();
        }
        let batch = batch(step).map_err(StepError::Batch)?;
        spin(settings.gap);
        let started = Instant::now();
        let l = loss(&model, &batch);
        let value = l.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(lr, model, grads);
        let mut ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(group) = peers {
            // The collective between steps, off the clock: this step's slowest rank.
            let mut slowest = [ms as f32];
            group.all_reduce_slice(&mut slowest, ReduceOp::Max)?;
            ms = f64::from(slowest[0]);
        }
        let cycle = started.elapsed().as_secs_f64() * 1e3;
        if it >= settings.warmup_iters {
            times.push(ms);
            cycles.push(cycle);
            last_loss = value;
        }
    }
    // The copies, apart: gradients of one batch, read once untimed (so the clock sees the
    // copies, not the backward pass), then flattened, averaged over one rank and written back
    // on the clock, as the reducer does.
    let first = batch(0).map_err(StepError::Batch)?;
    let grads = GradientsParams::from_grads(loss(&model, &first).backward(), &model);
    let _materialized = flatten_grads(&model, &grads, &ParamSelection::All)?;
    let mut grads = grads;
    let mut copies = Vec::new();
    for _ in 0..settings.iters.clamp(5, 200) {
        let started = Instant::now();
        let mut flat = flatten_grads(&model, &grads, &ParamSelection::All)?;
        match &mut flat.buffer {
            FlatBuffer::F32(v) => alone.average_slice(v)?,
            FlatBuffer::F64(v) => alone.average_slice(v)?,
        }
        grads = grads_from_flat(&model, &flat)?;
        copies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(StepTiming {
        median_ms: median(&times),
        mean_ms: mean(&times),
        cycle_mean_ms: mean(&cycles),
        copy_ms: median(&copies),
        ranks: peers.map_or(1, |g| g.size()),
        last_loss,
    })
}

/// The upper median of a non-empty list (NaN for an empty one).
fn median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_go_back_to_step_zero() {
        let s = StepSettings::new(6, 2, 7, Duration::ZERO).unwrap();
        let steps: Vec<usize> = (0..8).map(|it| s.step_of(it)).collect();
        assert_eq!(steps, [0, 1, 2, 3, 4, 5, 6, 0]);
        let never = StepSettings::new(6, 2, 0, Duration::ZERO).unwrap();
        assert_eq!(never.step_of(7), 7);
    }

    #[test]
    fn settings_out_of_range_name_their_flag() {
        let e = StepSettings::new(0, 0, 0, Duration::ZERO).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid --iters 0: at least 1 timed iteration"
        );
        let e = StepSettings::new(1, 0, 0, Duration::from_micros(1_000_001)).unwrap_err();
        assert!(e.to_string().starts_with("invalid --gap-us 1000001"), "{e}");
    }

    #[test]
    fn the_median_is_the_upper_one() {
        assert_eq!(median(&[3.0, 1.0, 2.0, 4.0]), 3.0);
        assert_eq!(median(&[2.0]), 2.0);
        assert!(median(&[]).is_nan());
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
    }
}
