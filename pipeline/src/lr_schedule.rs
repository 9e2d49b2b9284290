//! Learning-rate schedules with PyTorch's numbers: [`LrSchedule`] gives the learning rate of
//! optimizer step `k` (0-based) in the closed forms of `torch.optim.lr_scheduler` (`StepLR`,
//! `CosineAnnealingLR`, `LinearLR`), and implements burn's `LrScheduler`, so it plugs into
//! [`Pipeline::with_lr_scheduler`](crate::pipeline::Pipeline::with_lr_scheduler) like any burn
//! scheduler.
//!
//! Why not burn's own: its `LinearLrScheduler` returns `initial + (final - initial) / n` at the
//! first step where PyTorch's `LinearLR` returns `start_factor * lr`, one step off; the step and
//! cosine schedules agree with PyTorch's closed forms.
//!
//! ```
//! use localsgd_pipeline::lr_schedule::LrSchedule;
//! let s = LrSchedule::Step { base: 0.1, step_size: 2, gamma: 0.5 };
//! assert_eq!((0..5).map(|k| s.lr(k)).collect::<Vec<_>>(), vec![0.1, 0.1, 0.05, 0.05, 0.025]);
//! ```

use burn::optim::LearningRate;
use burn::optim::lr_scheduler::{LrScheduler, LrSchedulerRecord};

/// A learning-rate schedule (see the [module docs](self)). The learning rate of step `k`
/// depends on `k` alone, so resuming at step `k` is exact.
#[derive(Debug, Clone, PartialEq)]
pub enum LrSchedule {
    /// `base` at every step.
    Constant {
        /// The learning rate.
        base: f64,
    },
    /// `StepLR(step_size, gamma)`: `base * gamma^floor(k / step_size)`.
    Step {
        /// The initial learning rate.
        base: f64,
        /// Steps between decays (≥ 1).
        step_size: u64,
        /// Decay factor.
        gamma: f64,
    },
    /// `CosineAnnealingLR(T_max, eta_min)`: `min + (base - min) * (1 + cos(pi * k / t_max)) / 2`.
    Cosine {
        /// The initial learning rate.
        base: f64,
        /// Steps of one half period (≥ 1), usually the run's length.
        t_max: u64,
        /// The learning rate at `t_max`.
        min: f64,
    },
    /// `LinearLR(start_factor, end_factor=1, total_iters)`: a linear warmup from
    /// `start_factor * base` to `base` over `steps`, then `base`.
    LinearWarmup {
        /// The learning rate after the warmup.
        base: f64,
        /// Factor of the first step (PyTorch's default 1/3).
        start_factor: f64,
        /// Warmup length in steps (≥ 1).
        steps: u64,
    },
}

impl LrSchedule {
    /// The learning rate of optimizer step `k` (0-based).
    pub fn lr(&self, k: u64) -> f64 {
        match *self {
            LrSchedule::Constant { base } => base,
            LrSchedule::Step {
                base,
                step_size,
                gamma,
            } => {
                let decays = k / step_size.max(1);
                base * gamma.powi(i32::try_from(decays).unwrap_or(i32::MAX))
            }
            LrSchedule::Cosine { base, t_max, min } => {
                let phase = k as f64 / t_max.max(1) as f64 * std::f64::consts::PI;
                min + (base - min) * (1.0 + phase.cos()) / 2.0
            }
            LrSchedule::LinearWarmup {
                base,
                start_factor,
                steps,
            } => {
                let done = k.min(steps) as f64 / steps.max(1) as f64;
                base * (start_factor + (1.0 - start_factor) * done)
            }
        }
    }

    /// A stepping scheduler for burn (`ModuleLrScheduler::new(schedule.scheduler())`): its
    /// `n`-th `step()` returns `lr(n - 1)`.
    pub fn scheduler(self) -> ScheduleStepper {
        ScheduleStepper {
            schedule: self,
            next: 0,
        }
    }
}

/// [`LrSchedule`] as burn's stateful `LrScheduler` (its state: the next step's index).
#[derive(Debug, Clone)]
pub struct ScheduleStepper {
    schedule: LrSchedule,
    next: u64,
}

const NEXT_KEY: &str = "next_step";

impl LrScheduler for ScheduleStepper {
    fn step(&mut self) -> LearningRate {
        let lr = self.schedule.lr(self.next);
        self.next += 1;
        lr
    }

    fn to_record(&self) -> LrSchedulerRecord {
        LrSchedulerRecord::new().with_scalar(NEXT_KEY, self.next)
    }

    fn load_record(&mut self, record: LrSchedulerRecord) {
        if let Some(next) = record.scalar::<u64>(NEXT_KEY) {
            self.next = next;
        }
    }
}
