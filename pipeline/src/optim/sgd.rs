//! `torch.optim.SGD` as a fused burn optimizer.

use burn::optim::{LearningRate, ModuleOptimizer, Optimizer};
use burn::tensor::{Device, Tensor};

use super::buffer::Buffer;
use super::kernel::{self, SgdScalars};
use super::state::SgdState;
use super::{OptimError, check_range, host};

/// `torch.optim.SGD`'s settings, with its defaults: no momentum, no dampening, no Nesterov, no
/// weight decay. The learning rate comes with each step (the pipeline's, or its schedule's).
///
/// ```
/// use localsgd_pipeline::optim::FusedSgdConfig;
///
/// let optimizer = FusedSgdConfig { momentum: 0.9, ..FusedSgdConfig::default() }.init()?;
/// # let _ = optimizer;
/// assert!(FusedSgdConfig { nesterov: true, ..FusedSgdConfig::default() }.init().is_err());
/// # Ok::<(), localsgd_pipeline::optim::OptimError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct FusedSgdConfig {
    /// Momentum factor (0: none).
    pub momentum: f64,
    /// Dampening of the momentum (PyTorch's default 0; burn's `MomentumConfig` defaults to 0.1).
    pub dampening: f64,
    /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`, as in PyTorch).
    pub nesterov: bool,
    /// L2 penalty added to the gradient (`grad + weight_decay * param`).
    pub weight_decay: f64,
}

impl FusedSgdConfig {
    /// The optimizer, after checking the settings as `torch.optim.SGD` does.
    pub fn build(&self) -> Result<FusedSgd, OptimError> {
        check_range(
            "momentum",
            self.momentum,
            0.0,
            f64::INFINITY,
            "momentum >= 0",
        )?;
        check_range(
            "dampening",
            self.dampening,
            f64::NEG_INFINITY,
            f64::INFINITY,
            "a finite number",
        )?;
        check_range(
            "weight_decay",
            self.weight_decay,
            0.0,
            f64::INFINITY,
            "weight_decay >= 0",
        )?;
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(OptimError::Invalid(format!(
                "Nesterov momentum needs momentum > 0 and dampening 0 (got momentum {}, \
                 dampening {})",
                self.momentum, self.dampening
            )));
        }
        Ok(FusedSgd { config: *self })
    }

    /// The optimizer for a whole module (burn's [`ModuleOptimizer`]: the pipeline's optimizer
    /// phase, its checkpoints and burn-train's `Learner` take it as they take burn's own).
    pub fn init(&self) -> Result<ModuleOptimizer, OptimError> {
        Ok(ModuleOptimizer::from(self.build()?))
    }
}

/// `torch.optim.SGD`, one pass over each parameter: see [`FusedSgdConfig`] and the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct FusedSgd {
    config: FusedSgdConfig,
}

impl FusedSgd {
    /// The settings.
    pub fn config(&self) -> &FusedSgdConfig {
        &self.config
    }

    pub(super) fn scalars(&self, lr: LearningRate) -> SgdScalars {
        let c = &self.config;
        SgdScalars {
            neg_lr: (-lr) as f32,
            weight_decay: c.weight_decay as f32,
            momentum: c.momentum as f32,
            keep: (1.0 - c.dampening) as f32,
            nesterov: c.nesterov,
        }
    }
}

impl Optimizer for FusedSgd {
    type State<const D: usize> = SgdState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let s = self.scalars(lr);
        let with_momentum = self.config.momentum != 0.0;
        let previous = state.and_then(|s| s.velocity).filter(|_| with_momentum);
        if host(&tensor) && host(&grad) && previous.as_ref().is_none_or(host) {
            let mut p = Buffer::take(tensor);
            let g = Buffer::take(grad);
            let first = previous.is_none();
            let mut v = match previous {
                Some(v) => Some(Buffer::take(v)),
                None if with_momentum => Some(g.copy()),
                None => None,
            };
            let stepped = match (
                p.values_mut(),
                g.values(),
                v.as_mut().map(|v| v.values_mut().ok_or(())).transpose(),
            ) {
                (Some(pv), Some(gv), Ok(vv)) => {
                    kernel::sgd(pv, gv, vv, first, s);
                    true
                }
                _ => false,
            };
            if !stepped {
                // Bytes that do not read as f32 slices (never from burn's CPU backend): the
                // tensor arithmetic instead.
                let previous = v.filter(|_| !first).map(Buffer::into_tensor);
                return self.step_tensors(s, p.into_tensor(), g.into_tensor(), previous);
            }
            let velocity = v.map(Buffer::into_tensor);
            return (p.into_tensor(), Some(SgdState { velocity }));
        }
        self.step_tensors(s, tensor, grad, previous)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        SgdState {
            velocity: state.velocity.map(|v| v.to_device(device)),
        }
    }
}

impl FusedSgd {
    /// The same arithmetic in burn tensor operations, for parameters that are not f32 on the
    /// CPU (a GPU device): correct, not fused.
    pub(super) fn step_tensors<const D: usize>(
        &self,
        s: SgdScalars,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        previous: Option<Tensor<D>>,
    ) -> (Tensor<D>, Option<SgdState<D>>) {
        let mut d = grad;
        if s.weight_decay != 0.0 {
            d = d + tensor.clone().mul_scalar(s.weight_decay);
        }
        let mut velocity = None;
        if self.config.momentum != 0.0 {
            let v = match previous {
                Some(v) => v.mul_scalar(s.momentum) + d.clone().mul_scalar(s.keep),
                None => d.clone(),
            };
            d = if s.nesterov {
                d + v.clone().mul_scalar(s.momentum)
            } else {
                v.clone()
            };
            velocity = Some(v);
        }
        (tensor + d.mul_scalar(s.neg_lr), Some(SgdState { velocity }))
    }
}
