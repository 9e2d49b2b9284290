//! PyTorch's SGD, Adam and AdamW as fused burn optimizers: [`FusedSgdConfig`] and
//! [`FusedAdamConfig`] build a burn [`ModuleOptimizer`](burn::optim::ModuleOptimizer) whose
//! per-parameter step is one pass over the parameter, its gradient and its state.
//!
//! burn's own `Sgd`/`Adam`/`AdamW` build each step from tensor operations (scale the gradient,
//! add, square, divide, ...), every one a new buffer and a trip through memory; on the CPU that
//! costs more than the forward and backward pass of a small model. The fused step reads the
//! parameter's buffer, updates it in place together with the momentum or moments, and hands the
//! same buffers back to burn (no copy where burn holds the only reference, as it does for a
//! model stepped in place).
//!
//! **Arithmetic.** Each element is computed as `torch.optim.SGD`/`Adam`/`AdamW` compute it on
//! the CPU (their single-tensor implementation): the same operations in the same order and the
//! same roundings, scalars such as `lr / (1 - beta1^t)` in f64 then rounded to f32, and a fused
//! multiply-add where PyTorch's vectorized kernels use one (`add_` with `alpha`, `lerp_`) when
//! the CPU has FMA. Against the test vectors of `scripts/optimizer_reference.py` (real
//! PyTorch): SGD in every setting bit for bit; Adam and AdamW within 2 ulps per step, because
//! PyTorch's vectorized CPU `sqrt` is not correctly rounded (1 ulp off for some inputs) and the
//! fused step's is. burn's own optimizers are further off (Adam folds `eps` into the bias
//! correction; SGD's `MomentumConfig` dampens by 0.1 by default).
//!
//! **State and checkpoints.** The state is recorded under the names of burn's `SgdState` and
//! `AdamState` (`momentum.velocity`; `momentum.time`, `momentum.moment_1`, `momentum.moment_2`),
//! so a record saved from burn's optimizer resumes in the fused one and back, and the
//! pipeline's checkpoints keep their format.
//!
//! **Devices.** The fused pass runs on f32 parameters of burn's CPU backend and, with the feature
//! `libtorch`, of LibTorch's CPU device (in the tensor's own storage); elsewhere (a GPU device,
//! f64 parameters) the same formulas run as burn tensor operations.
//!
//! ```
//! use burn::module::Module;
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::GradientsParams;
//! use burn::tensor::{Device, Tensor};
//! use localsgd_pipeline::optim::FusedSgdConfig;
//!
//! let device = Device::flex().autodiff();
//! let mut model: Linear = LinearConfig::new(4, 2).init(&device);
//! let mut optimizer = FusedSgdConfig { momentum: 0.9, ..FusedSgdConfig::default() }.init()?;
//! let x = Tensor::<2>::ones([8, 4], &device);
//! for _ in 0..3 {
//!     let loss = model.forward(x.clone()).powf_scalar(2.0).mean();
//!     let grads = GradientsParams::from_grads(loss.backward(), &model);
//!     model = optimizer.step(0.1, model, grads);
//! }
//! assert_eq!(model.weight.val().dims(), [4, 2]);
//! # Ok::<(), localsgd_pipeline::optim::OptimError>(())
//! ```

mod adam;
mod buffer;
mod kernel;
mod sgd;
mod state;
#[cfg(test)]
mod tests;

pub use adam::{FusedAdam, FusedAdamConfig};
pub use sgd::{FusedSgd, FusedSgdConfig};
pub use state::{AdamState, SgdState};

use burn::tensor::{DType, Device, Tensor};

/// An optimizer setting outside what PyTorch accepts.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// A setting's value is out of range (the message names it and what is valid).
    #[error("invalid optimizer setting: {0}")]
    Invalid(String),
}

/// `value` of setting `name` must be finite and lie in `[low, high)` (`high` included when
/// infinite).
fn check_range(name: &str, value: f64, low: f64, high: f64, valid: &str) -> Result<(), OptimError> {
    let inside = value.is_finite() && value >= low && (high.is_infinite() || value < high);
    if inside {
        Ok(())
    } else {
        Err(OptimError::Invalid(format!(
            "{name} {value} (valid: {valid})"
        )))
    }
}

/// Whether the fused pass can step this tensor: f32 on burn's CPU backend, or (feature
/// `libtorch`) on LibTorch's CPU device, whose storage the pass updates in place.
// burn marks its LibTorch backend deprecated (for its CubeCL ones); `device = "libtorch"` uses it
// on purpose.
#[allow(deprecated)]
fn host<const D: usize>(t: &Tensor<D>) -> bool {
    if t.dtype() != DType::F32 {
        return false;
    }
    let device = t.device();
    #[cfg(feature = "libtorch")]
    if device == Device::libtorch() {
        return true;
    }
    device == Device::flex()
}
