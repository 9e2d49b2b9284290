//! The inner optimizer the optimizer phase steps: burn's [`ModuleOptimizer`] with an optional
//! learning-rate schedule, or one that lives elsewhere ([`InnerOptimizer`]).

use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::{ModuleLearningRate, ModuleLrScheduler};
use burn::optim::{GradientsParams, ModuleOptimizer};

/// An inner optimizer whose state the pipeline does not own: burn-train's `Learner` keeps its
/// optimizer and learning-rate scheduler private, so the `localsgd-learner` strategy steps
/// through it. The pipeline calls [`next_lr`](Self::next_lr) once per iteration (also when
/// the step is skipped for non-finite gradients), then [`step`](Self::step) once, or once per
/// gradient bucket with pipelined gradient sync (each call with the parameters of one bucket's
/// gradients, all at the same learning rate).
///
/// Checkpoints of the pipeline's checkpoint phase need a [`ModuleOptimizer`]: a pipeline with
/// an `InnerOptimizer` saves its optimizer state its own way (burn-train's checkpointer).
pub trait InnerOptimizer<M>: Send {
    /// The learning rate of this iteration's step (advances the schedule by one step).
    fn next_lr(&mut self) -> ModuleLearningRate;

    /// Step `model` with `grads` at `lr`.
    fn step(&mut self, lr: ModuleLearningRate, model: M, grads: GradientsParams) -> M;
}

/// The optimizer a pipeline steps: burn's own (checkpointed by the pipeline) or an
/// [`InnerOptimizer`] that keeps its state elsewhere.
pub(crate) enum Inner<M> {
    /// burn's optimizer, at the pipeline's constant rate or its scheduler's.
    Module {
        optimizer: ModuleOptimizer,
        scheduler: Option<ModuleLrScheduler>,
        lr: f64,
    },
    /// Stepped through the trait.
    Custom(Box<dyn InnerOptimizer<M>>),
}

impl<M: Module> Inner<M> {
    pub(crate) fn next_lr(&mut self) -> ModuleLearningRate {
        match self {
            Inner::Module {
                scheduler: Some(s), ..
            } => s.step(),
            Inner::Module { lr, .. } => ModuleLearningRate::from(*lr),
            Inner::Custom(c) => c.next_lr(),
        }
    }

    pub(crate) fn step(&mut self, lr: ModuleLearningRate, model: M, grads: GradientsParams) -> M {
        match self {
            Inner::Module { optimizer, .. } => optimizer.step(lr, model, grads),
            Inner::Custom(c) => c.step(lr, model, grads),
        }
    }

    /// Replay the schedule over `iterations` steps (a resumed run).
    pub(crate) fn replay_schedule(&mut self, iterations: u64) {
        if let Inner::Module {
            scheduler: Some(s), ..
        } = self
        {
            for _ in 0..iterations {
                s.step();
            }
        }
    }

    pub(crate) fn module_optimizer(&self) -> Option<&ModuleOptimizer> {
        match self {
            Inner::Module { optimizer, .. } => Some(optimizer),
            Inner::Custom(_) => None,
        }
    }
}
