//! `torch.optim.Adam` and `torch.optim.AdamW` as one fused burn optimizer.

use burn::optim::{LearningRate, ModuleOptimizer, Optimizer};
use burn::tensor::{Device, Tensor};

use super::buffer::Buffer;
use super::kernel::{self, AdamScalars};
use super::state::AdamState;
use super::{OptimError, check_range, host};

/// `torch.optim.Adam`'s and `torch.optim.AdamW`'s settings: [`adam`](Self::adam) and
/// [`adamw`](Self::adamw) give PyTorch's defaults (betas 0.9 / 0.999, eps 1e-8; weight decay 0
/// for Adam, 0.01 decoupled for AdamW). No AMSGrad.
///
/// ```
/// use localsgd_pipeline::optim::FusedAdamConfig;
///
/// let adamw = FusedAdamConfig::adamw().init()?;
/// # let _ = adamw;
/// let bad = FusedAdamConfig { beta_1: 1.0, ..FusedAdamConfig::adam() }.build();
/// assert!(bad.unwrap_err().to_string().contains("beta_1 1"));
/// # Ok::<(), localsgd_pipeline::optim::OptimError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FusedAdamConfig {
    /// Decay of the first moment (PyTorch's `betas[0]`).
    pub beta_1: f64,
    /// Decay of the second moment (`betas[1]`).
    pub beta_2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay: added to the gradient as an L2 penalty (Adam), or applied to the
    /// parameter as `param *= 1 - lr * weight_decay` before the update (AdamW).
    pub weight_decay: f64,
    /// AdamW's decoupled weight decay instead of Adam's L2 penalty.
    pub decoupled_weight_decay: bool,
    /// Decay only parameters of two or more dimensions (weight matrices, embeddings), not
    /// biases and LayerNorm weights: nanoGPT's `configure_optimizers`, two PyTorch parameter
    /// groups. `false` (PyTorch's `AdamW(model.parameters())`): every parameter.
    #[serde(default)]
    pub decay_matrices_only: bool,
}

impl FusedAdamConfig {
    /// `torch.optim.Adam()`'s defaults.
    pub fn adam() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
            decay_matrices_only: false,
        }
    }

    /// `torch.optim.AdamW()`'s defaults.
    pub fn adamw() -> Self {
        Self {
            weight_decay: 0.01,
            decoupled_weight_decay: true,
            ..Self::adam()
        }
    }

    /// The optimizer, after checking the settings as PyTorch does.
    pub fn build(&self) -> Result<FusedAdam, OptimError> {
        check_range("beta_1", self.beta_1, 0.0, 1.0, "0 <= beta_1 < 1")?;
        check_range("beta_2", self.beta_2, 0.0, 1.0, "0 <= beta_2 < 1")?;
        check_range("eps", self.eps, 0.0, f64::INFINITY, "eps >= 0")?;
        check_range(
            "weight_decay",
            self.weight_decay,
            0.0,
            f64::INFINITY,
            "weight_decay >= 0",
        )?;
        Ok(FusedAdam { config: *self })
    }

    /// The optimizer for a whole module (burn's [`ModuleOptimizer`]).
    pub fn init(&self) -> Result<ModuleOptimizer, OptimError> {
        Ok(ModuleOptimizer::from(self.build()?))
    }
}

/// `torch.optim.Adam` / `AdamW`, one pass over each parameter: see [`FusedAdamConfig`] and the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct FusedAdam {
    config: FusedAdamConfig,
}

impl FusedAdam {
    /// The settings.
    pub fn config(&self) -> &FusedAdamConfig {
        &self.config
    }

    /// The scalars of step `t` (from 1) at `lr` for a parameter of `dims` dimensions, computed
    /// in f64 as PyTorch computes them in Python floats, then applied in f32.
    pub(super) fn scalars(&self, lr: LearningRate, t: usize, dims: usize) -> AdamScalars {
        let c = &self.config;
        let t = t as f64;
        let bias_correction1 = 1.0 - c.beta_1.powf(t);
        let bias_correction2 = 1.0 - c.beta_2.powf(t);
        let weight_decay = if c.decay_matrices_only && dims < 2 {
            0.0
        } else {
            c.weight_decay
        };
        let decay = weight_decay != 0.0;
        AdamScalars {
            coupled_decay: if decay && !c.decoupled_weight_decay {
                weight_decay as f32
            } else {
                0.0
            },
            decay_factor: (decay && c.decoupled_weight_decay)
                .then_some((1.0 - lr * weight_decay) as f32),
            lerp_weight: (1.0 - c.beta_1) as f32,
            beta2: c.beta_2 as f32,
            one_minus_beta2: (1.0 - c.beta_2) as f32,
            bias_correction2_sqrt: bias_correction2.powf(0.5) as f32,
            eps: c.eps as f32,
            neg_step_size: (-(lr / bias_correction1)) as f32,
        }
    }
}

impl Optimizer for FusedAdam {
    type State<const D: usize> = AdamState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let time = state.as_ref().map_or(0, |s| s.time) + 1;
        let s = self.scalars(lr, time, D);
        let on_host = host(&tensor)
            && host(&grad)
            && state
                .as_ref()
                .is_none_or(|s| host(&s.moment_1) && host(&s.moment_2));
        if !on_host {
            return self.step_tensors(s, time, tensor, grad, state);
        }
        let mut p = Buffer::take(tensor);
        let g = Buffer::take(grad);
        let (mut m, mut v) = match state {
            Some(s) => (Buffer::take(s.moment_1), Buffer::take(s.moment_2)),
            None => (p.zeros_like(), p.zeros_like()),
        };
        let stepped = match (p.values_mut(), g.values(), m.values_mut(), v.values_mut()) {
            (Some(pv), Some(gv), Some(mv), Some(vv)) => {
                kernel::adam(pv, gv, mv, vv, s);
                true
            }
            _ => false,
        };
        if !stepped {
            // Bytes that do not read as f32 slices (never from burn's CPU backend): the tensor
            // arithmetic instead.
            let state = (time > 1).then(|| AdamState {
                time: time - 1,
                moment_1: m.into_tensor(),
                moment_2: v.into_tensor(),
            });
            return self.step_tensors(s, time, p.into_tensor(), g.into_tensor(), state);
        }
        let state = AdamState {
            time,
            moment_1: m.into_tensor(),
            moment_2: v.into_tensor(),
        };
        (p.into_tensor(), Some(state))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        AdamState {
            time: state.time,
            moment_1: state.moment_1.to_device(device),
            moment_2: state.moment_2.to_device(device),
        }
    }
}

impl FusedAdam {
    /// The same arithmetic in burn tensor operations, for parameters that are not f32 on the
    /// CPU (a GPU device): correct, not fused.
    pub(super) fn step_tensors<const D: usize>(
        &self,
        s: AdamScalars,
        time: usize,
        mut tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<AdamState<D>>,
    ) -> (Tensor<D>, Option<AdamState<D>>) {
        if let Some(f) = s.decay_factor {
            tensor = tensor.mul_scalar(f);
        }
        let d = if s.coupled_decay != 0.0 {
            grad + tensor.clone().mul_scalar(s.coupled_decay)
        } else {
            grad
        };
        let (m, v) = match state {
            Some(st) => (st.moment_1, st.moment_2),
            None => (d.zeros_like(), d.zeros_like()),
        };
        let m = m.clone() + (d.clone() - m).mul_scalar(s.lerp_weight);
        let v = v.mul_scalar(s.beta2) + d.clone().mul_scalar(s.one_minus_beta2) * d;
        let denom = v
            .clone()
            .sqrt()
            .div_scalar(s.bias_correction2_sqrt)
            .add_scalar(s.eps);
        let tensor = tensor + m.clone().mul_scalar(s.neg_step_size) / denom;
        let state = AdamState {
            time,
            moment_1: m,
            moment_2: v,
        };
        (tensor, Some(state))
    }
}
