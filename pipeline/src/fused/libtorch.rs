//! The fused operations on LibTorch: PyTorch's own kernels, one call each where PyTorch has one.

// burn marks its LibTorch backend deprecated (in favour of its CubeCL backends); the binary's
// `device = "libtorch"` uses it on purpose.
#![allow(deprecated)]

use burn::backend::LibTorch;
use burn::backend::libtorch::TchTensor;
use tch::{Kind, Reduction, Tensor};

use super::{FusedBackend, FusedKernels};

/// The last dimension of `t`.
fn last_dim(t: &Tensor) -> i64 {
    t.size().last().copied().unwrap_or(1)
}

/// `[T, T]` true above the diagonal: the positions a causal row may not attend to.
fn future_mask(t: i64, device: tch::Device) -> Tensor {
    Tensor::ones([t, t], (Kind::Bool, device)).triu(1)
}

impl FusedKernels for LibTorch {
    fn layer_norm_forward(
        x: TchTensor,
        gamma: TchTensor,
        beta: TchTensor,
        eps: f64,
    ) -> (TchTensor, TchTensor, TchTensor) {
        let d = last_dim(&gamma.tensor);
        let (y, mean, rstd) =
            x.tensor
                .native_layer_norm([d], Some(&gamma.tensor), Some(&beta.tensor), eps);
        (
            TchTensor::new(y),
            TchTensor::new(mean),
            TchTensor::new(rstd),
        )
    }

    fn layer_norm_backward(
        x: TchTensor,
        gamma: TchTensor,
        mean: TchTensor,
        rstd: TchTensor,
        grad: TchTensor,
    ) -> (TchTensor, TchTensor, TchTensor) {
        // tch exposes no `native_layer_norm_backward`; the same formula in a few calls, with
        // `mean` and `rstd` as `native_layer_norm` returned them (`[..., 1]`).
        let (x, gamma, grad) = (&x.tensor, &gamma.tensor, &grad.tensor);
        let d = last_dim(gamma);
        let xhat = (x - &mean.tensor) * &rstd.tensor;
        let g = grad * gamma;
        let a = g.mean_dim(-1, true, Kind::Float);
        let b = (&g * &xhat).mean_dim(-1, true, Kind::Float);
        let dx = &rstd.tensor * (g - a - &xhat * b);
        let rows = grad.reshape([-1, d]);
        let dgamma = (&rows * xhat.reshape([-1, d])).sum_dim_intlist(0, false, Kind::Float);
        let dbeta = rows.sum_dim_intlist(0, false, Kind::Float);
        (
            TchTensor::new(dx),
            TchTensor::new(dgamma),
            TchTensor::new(dbeta),
        )
    }

    fn causal_softmax_forward(scores: TchTensor, scale: f64) -> TchTensor {
        let s = &scores.tensor;
        let mask = future_mask(last_dim(s), s.device());
        let p = (s * scale)
            .masked_fill(&mask, f64::NEG_INFINITY)
            .softmax(-1, Kind::Float);
        TchTensor::new(p)
    }

    fn causal_softmax_backward(p: TchTensor, grad: TchTensor, scale: f64) -> TchTensor {
        let ds = Tensor::internal_softmax_backward_data(&grad.tensor, &p.tensor, -1, Kind::Float);
        TchTensor::new(ds * scale)
    }

    fn cross_entropy_forward(logits: TchTensor, targets: TchTensor) -> TchTensor {
        let loss = logits.tensor.cross_entropy_loss::<Tensor>(
            &targets.tensor,
            None,
            Reduction::Mean,
            -100,
            0.0,
        );
        TchTensor::new(loss.reshape([1]))
    }

    fn cross_entropy_backward(logits: TchTensor, targets: TchTensor, grad: TchTensor) -> TchTensor {
        let n = logits.tensor.size().first().copied().unwrap_or(1).max(1);
        let mut p = logits.tensor.softmax(-1, Kind::Float);
        let index = targets.tensor.unsqueeze(1);
        let minus_one = Tensor::full([n, 1], -1.0, (Kind::Float, p.device()));
        let _ = p.scatter_add_(1, &index, &minus_one);
        TchTensor::new(p * (grad.tensor.reshape([1, 1]) / n as f64))
    }
}

/// Without autodiff: the kernels' outputs.
impl FusedBackend for LibTorch {
    fn fused_layer_norm(x: TchTensor, gamma: TchTensor, beta: TchTensor, eps: f64) -> TchTensor {
        Self::layer_norm_forward(x, gamma, beta, eps).0
    }

    fn fused_causal_softmax(scores: TchTensor, scale: f64) -> TchTensor {
        Self::causal_softmax_forward(scores, scale)
    }

    fn fused_cross_entropy(logits: TchTensor, targets: TchTensor) -> TchTensor {
        Self::cross_entropy_forward(logits, targets)
    }
}
