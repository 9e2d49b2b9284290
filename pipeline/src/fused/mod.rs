//! LayerNorm, the causal softmax of attention and the cross-entropy loss as one operation each,
//! forward and backward, on burn's CPU backend (Flex) and on LibTorch (feature `libtorch`).
//!
//! burn builds these three from elementary operations (LayerNorm: a mean, a variance, a
//! subtraction, a division and an affine map; softmax: scale, mask, max, exp, sum, divide;
//! cross-entropy: log-softmax, gather, mean), and its autodiff records each of them: on a CPU
//! every one is a pass over the tensor with a fresh output, most of them on one thread, and
//! the backward pass recomputes the `exp`s. Here each is one operation with its own backward
//! pass:
//!
//! - on Flex, one pass per row forward and one backward, spread over rayon's threads (the pool
//!   burn's CPU backend runs its matrix products on), with the vectorized `exp` of
//!   [`gelu`](crate::gelu); the results do not depend on the number of threads or on the CPU
//!   (see `rows.rs`);
//! - on LibTorch, PyTorch's own kernels (`native_layer_norm`, `softmax` and its backward,
//!   `cross_entropy_loss`), so that the step runs what PyTorch's runs.
//!
//! Other devices, and float types other than f32, take burn's own operations: each function is
//! a drop-in replacement for burn's form, written next to it below.
//!
//! ```
//! use burn::tensor::{Device, Int, Tensor};
//! use localsgd_pipeline::fused;
//!
//! let device = Device::flex();
//! let logits = Tensor::<2>::from_floats([[2.0, 0.5, -1.0], [0.0, 0.0, 0.0]], &device);
//! let targets = Tensor::<1, Int>::from_ints([0, 2], &device);
//! let loss: f32 = fused::cross_entropy(logits, targets).into_scalar();
//! // (log(e² + e^0.5 + e⁻¹) - 2 + log 3) / 2
//! assert!((loss - 0.6700).abs() < 1e-4, "{loss}");
//! ```

// burn marks its LibTorch backend deprecated (for its CubeCL ones); the extension below routes
// `device = "libtorch"` to it on purpose.
#![cfg_attr(feature = "libtorch", allow(deprecated))]

mod autodiff;
mod flex;
#[cfg(feature = "libtorch")]
mod libtorch;
mod rows;

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, DType, Dispatch, backend_extension};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, Int, Tensor};

/// `(x - mean) / √(var + eps) · gamma + beta` over the last dimension of `x` (`gamma.len()`
/// long; the biased variance): PyTorch's `F.layer_norm` and burn's
/// [`layer_norm`](burn::tensor::module::layer_norm), with gradients for all three tensors.
///
/// # Panics
/// Where the last dimension of `x` is not `gamma`'s length, or `beta`'s differs, as burn's.
pub fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    eps: f64,
) -> Tensor<D> {
    let [d] = gamma.dims();
    let fused = fast_path(&x.device())
        && x.dtype() == DType::F32
        && gamma.dtype() == DType::F32
        && beta
            .as_ref()
            .is_none_or(|b| b.dtype() == DType::F32 && b.dims() == [d])
        && x.dims()[D - 1] == d;
    if !fused {
        return burn::tensor::module::layer_norm(x, gamma, beta, eps);
    }
    let beta = beta.unwrap_or_else(|| Tensor::zeros([d], &x.device()));
    Tensor::from_dispatch(<Dispatch as FusedBackend>::fused_layer_norm(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        eps,
    ))
}

/// The causal softmax of attention scores `[..., T, T]`: row `i` becomes
/// `softmax(scale · scores[i, 0..=i])` followed by zeros, as
/// `softmax((scores · scale).masked_fill(future, -∞), -1)` (nanoGPT's form, written out in
/// burn below).
///
/// # Panics
/// Where `D < 2` or the last two dimensions differ (burn's form would not mask a causal
/// pattern either).
pub fn causal_softmax<const D: usize>(scores: Tensor<D>, scale: f64) -> Tensor<D> {
    let dims = scores.dims();
    assert!(
        D >= 2 && dims[D - 1] == dims[D - 2],
        "causal_softmax: scores must be [..., T, T], got {dims:?}"
    );
    if !(fast_path(&scores.device()) && scores.dtype() == DType::F32) {
        let t = dims[D - 1];
        let mut mask_shape = [1; D];
        (mask_shape[D - 2], mask_shape[D - 1]) = (t, t);
        // `tril_mask` is true strictly above the diagonal: the future.
        let future = Tensor::<2, Bool>::tril_mask([t, t], 0, &scores.device()).reshape(mask_shape);
        let masked = (scores * scale).mask_fill(future, f32::NEG_INFINITY);
        return softmax(masked, D - 1);
    }
    Tensor::from_dispatch(<Dispatch as FusedBackend>::fused_causal_softmax(
        scores.into_dispatch(),
        scale,
    ))
}

/// The mean over rows of `logits` `[N, C]` of the cross-entropy against `targets` `[N]`
/// (class indices): PyTorch's `F.cross_entropy(logits, targets)` and burn's
/// [`CrossEntropyLoss`](burn::nn::loss::CrossEntropyLoss) without weights or smoothing. A
/// target outside `0..C` makes the loss NaN on the fused path (burn's panics).
///
/// # Panics
/// Where `targets` does not have one entry per row.
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    let [n, _] = logits.dims();
    assert_eq!(
        targets.dims(),
        [n],
        "cross_entropy: one target per row of the logits"
    );
    if !(fast_path(&logits.device()) && logits.dtype() == DType::F32) {
        let device = logits.device();
        return CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets);
    }
    Tensor::from_dispatch(<Dispatch as FusedBackend>::fused_cross_entropy(
        logits.into_dispatch(),
        targets.into_dispatch(),
    ))
}

/// Whether `device` (with or without autodiff) is one the fused kernels run on.
fn fast_path(device: &Device) -> bool {
    let inner = device.clone().inner();
    if inner == Device::flex() {
        return true;
    }
    #[cfg(feature = "libtorch")]
    #[allow(deprecated)]
    // burn marks its LibTorch backend deprecated; `device = "libtorch"` uses it.
    if inner == Device::libtorch() {
        return true;
    }
    false
}

/// The three operations as a backend extension: [`FusedKernels`] on Flex and LibTorch, and
/// autodiff's backward passes through them.
#[backend_extension(Flex, LibTorch: cfg(feature = "libtorch"), Autodiff)]
pub trait FusedBackend: Backend {
    /// See [`layer_norm`]; `beta` is given (zeros where the caller has none).
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self>;

    /// See [`causal_softmax`].
    fn fused_causal_softmax(scores: FloatTensor<Self>, scale: f64) -> FloatTensor<Self>;

    /// See [`cross_entropy`]; the loss has shape `[1]`.
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// One backend's kernels, forward and backward, that autodiff composes (no dispatch: called
/// on the inner backend only).
pub trait FusedKernels: Backend {
    /// LayerNorm's output and what its backward pass needs (each row's mean and
    /// `1/√(var + eps)`, in the backend's own layout).
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients of `x`, `gamma` and `beta` from the output's `grad`.
    fn layer_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The causal softmax of `scores` `[..., T, T]` scaled by `scale`.
    fn causal_softmax_forward(scores: FloatTensor<Self>, scale: f64) -> FloatTensor<Self>;

    /// The scores' gradient from the softmax's output `p` and its gradient `grad`.
    fn causal_softmax_backward(
        p: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        scale: f64,
    ) -> FloatTensor<Self>;

    /// The mean cross-entropy, shape `[1]`.
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self>;

    /// The logits' gradient from the loss's gradient `grad` (shape `[1]`).
    fn cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}
