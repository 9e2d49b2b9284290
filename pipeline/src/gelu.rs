//! The exact GELU, `x · Φ(x)` with `Φ(x) = ½(1 + erf(x/√2))` (PyTorch's `nn.GELU()` default),
//! as one vectorized pass over the tensor forward and one backward on burn's CPU backend (Flex),
//! split over rayon's threads.
//!
//! burn's own `gelu` computes `erf` and `exp` element by element through scalar `libm` calls,
//! which the compiler cannot vectorize; in the GPT's step they cost about a fifth of the time.
//! Here `erf` is Abramowitz and Stegun's formula 7.1.26 (absolute error at most 1.5e-7 in
//! exact arithmetic; `Φ` as computed in f32 lies within 3e-7 of the true value), whose only
//! transcendental part, `exp(-x²/2)`, is an `exp` of our own
//! built from additions, multiplications and exponent bits. The loop then has no call and no
//! branch, so the compiler vectorizes it: with AVX2 where the CPU has it (chosen at run time),
//! with SSE2 elsewhere. Both paths run the same IEEE operations in the same order (no fused
//! multiply-add), so every CPU computes the same bits: ranks on different machines stay
//! identical.
//!
//! The backward pass needs `Φ(x) + x·φ(x)`, where `φ(x) = exp(-x²/2)/√(2π)` is the same `exp`
//! the forward pass takes: one `exp` per element each way.
//!
//! Other devices (CUDA, and anything else burn runs on) and other float types take burn's own
//! `gelu`, so [`gelu`] is a drop-in replacement for `burn::tensor::activation::gelu`.
//!
//! ```
//! use burn::tensor::{Device, Tensor};
//!
//! let device = Device::flex();
//! let x = Tensor::<1>::from_floats([-3.0, -1.0, 0.0, 0.5, 2.0], &device);
//! let ours: Vec<f32> = localsgd_pipeline::gelu::gelu(x.clone()).into_data().try_to_vec().unwrap();
//! let burns: Vec<f32> = burn::tensor::activation::gelu(x).into_data().try_to_vec().unwrap();
//! for (a, b) in ours.iter().zip(&burns) {
//!     assert!((a - b).abs() < 1e-6, "{a} {b}");
//! }
//! ```

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::flex::FlexTensor;
use burn::backend::ops::ActivationOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, DType, Dispatch, Flex, backend_extension};
use burn::tensor::{Device, Tensor};
use rayon::prelude::*;

use crate::cpu::contiguous;

/// The exact GELU of `x`, with its gradient: one vectorized pass each way on the CPU backend,
/// burn's `gelu` elsewhere (see the [module](self) documentation).
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if !on_flex(&x.device()) {
        return burn::tensor::activation::gelu(x);
    }
    Tensor::from_dispatch(<Dispatch as GeluBackend>::gelu_exact(x.into_dispatch()))
}

/// Whether `device` is burn's CPU backend (with or without autodiff), the one backend the
/// extension below implements.
fn on_flex(device: &Device) -> bool {
    device.clone().inner() == Device::flex()
}

/// The exact GELU as a backend extension: the CPU backend's vectorized kernels, and autodiff's
/// backward pass through them.
#[backend_extension(Flex, Autodiff)]
pub trait GeluBackend: Backend {
    /// `x · Φ(x)`.
    fn gelu_exact(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::gelu(x)
    }

    /// `grad · (Φ(x) + x·φ(x))`: the gradient of [`gelu_exact`](Self::gelu_exact) at `x`.
    fn gelu_exact_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::gelu_backward(x, grad)
    }
}

impl GeluBackend for Flex {
    fn gelu_exact(x: FlexTensor) -> FlexTensor {
        if x.dtype() != DType::F32 {
            return <Flex as ActivationOps<Flex>>::gelu(x);
        }
        let (mut y, range) = contiguous(x);
        // Copies the storage first where another tensor shares it (autodiff keeps `x`).
        y.storage_mut::<f32>()[range]
            .par_chunks_mut(CHUNK)
            .for_each(kernels::forward);
        y
    }

    fn gelu_exact_backward(x: FlexTensor, grad: FlexTensor) -> FlexTensor {
        if x.dtype() != DType::F32
            || grad.dtype() != DType::F32
            || x.layout().shape() != grad.layout().shape()
        {
            return <Flex as ActivationOps<Flex>>::gelu_backward(x, grad);
        }
        let ((x, x_range), (mut g, g_range)) = (contiguous(x), contiguous(grad));
        let x = &x.storage::<f32>()[x_range];
        g.storage_mut::<f32>()[g_range]
            .par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(g, x)| kernels::backward(x, g));
        g
    }
}

/// Elements per task on rayon's pool (the one burn's CPU backend runs on): the kernels are
/// element-wise, so the split changes no result.
const CHUNK: usize = 16 * 1024;

/// Autodiff: the forward pass keeps `x`; the backward pass is
/// [`gelu_exact_backward`](GeluBackend::gelu_exact_backward) of the inner backend.
impl<B: Backend + GeluBackend, C: CheckpointStrategy> GeluBackend for Autodiff<B, C> {
    fn gelu_exact(x: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct GeluExactBackward;

        impl<B: Backend + GeluBackend> Backward<B, 1> for GeluExactBackward {
            type State = NodeId;

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let input: FloatTensor<B> = checkpointer.retrieve_node_output(ops.state);
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::gelu_exact_backward(input, grad)
                });
            }
        }

        match GeluExactBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = prep.checkpoint(&x);
                prep.finish(state, B::gelu_exact(x.primitive().clone()))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::gelu_exact(x.into_primitive())),
        }
    }
}

pub(crate) use kernels::exp_nonpositive;

/// The element kernels: plain loops over slices that the compiler vectorizes, compiled once
/// for AVX2 (used where the CPU has it) and once for the target's baseline.
mod kernels {
    /// `x ← x · Φ(x)` for every element.
    pub fn forward(values: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            unsafe { forward_avx2(values) };
            return;
        }
        forward_baseline(values);
    }

    /// `g ← g · (Φ(x) + x·φ(x))` for every element pair (`x` and `g` of one length).
    pub fn backward(x: &[f32], g: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            unsafe { backward_avx2(x, g) };
            return;
        }
        backward_baseline(x, g);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn forward_avx2(values: &mut [f32]) {
        forward_baseline(values)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn backward_avx2(x: &[f32], g: &mut [f32]) {
        backward_baseline(x, g)
    }

    #[inline(always)]
    fn forward_baseline(values: &mut [f32]) {
        for v in values.iter_mut() {
            let x = *v;
            let (cdf, _) = cdf_and_gauss(x);
            *v = x * cdf;
        }
    }

    #[inline(always)]
    fn backward_baseline(x: &[f32], g: &mut [f32]) {
        for (g, &x) in g.iter_mut().zip(x) {
            let (cdf, gauss) = cdf_and_gauss(x);
            *g *= cdf + x * (INV_SQRT_2PI * gauss);
        }
    }

    /// `1/√2`.
    const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
    /// `1/√(2π)`.
    const INV_SQRT_2PI: f32 = 0.398_942_3;

    /// `(Φ(x), exp(-x²/2))`. With `z = |x|/√2` and `t = 1/(1 + p·z)`, A&S 7.1.26 gives
    /// `erfc(z) ≈ t·(a₁ + t·(a₂ + t·(a₃ + t·(a₄ + t·a₅))))·exp(-z²)`; then
    /// `Φ(x) = 1 - ½erfc(z)` for `x ≥ 0` and `½erfc(z)` below (no cancellation in the tail).
    /// `exp(-z²) = exp(-x²/2)` is `√(2π)·φ(x)`, which the backward pass reuses.
    #[inline(always)]
    pub(super) fn cdf_and_gauss(x: f32) -> (f32, f32) {
        const P: f32 = 0.327_591_1;
        const A1: f32 = 0.254_829_6;
        const A2: f32 = -0.284_496_74;
        const A3: f32 = 1.421_413_8;
        const A4: f32 = -1.453_152;
        const A5: f32 = 1.061_405_4;
        let z = x.abs() * FRAC_1_SQRT_2;
        let t = 1.0 / (1.0 + P * z);
        let poly = t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5))));
        let gauss = exp_nonpositive(-(z * z));
        let half_erfc = 0.5 * poly * gauss;
        let cdf = if x >= 0.0 { 1.0 - half_erfc } else { half_erfc };
        // NaN in, NaN out (the comparison above sends NaN to the `half_erfc` side).
        let cdf = if x.is_nan() { x } else { cdf };
        (cdf, gauss)
    }

    /// `exp(y)` for `y ≤ 0` (NaN propagates), within about 2 units in the last place:
    /// `y = n·ln2 + r` with `|r| ≤ ln2/2`, `exp(r)` by its Taylor series to `r⁷/7!`, times
    /// `2ⁿ` written into the exponent bits. Below -87.3 the result underflows to 0 in f32's
    /// normal range anyway; the argument is clamped there so that `2ⁿ` stays a normal number.
    #[inline(always)]
    pub(crate) fn exp_nonpositive(y: f32) -> f32 {
        const LOG2_E: f32 = std::f32::consts::LOG2_E;
        // ln 2 split in two: `n · LN2_HI` is exact for the |n| ≤ 126 that occur here.
        const LN2_HI: f32 = 0.693_145_75;
        const LN2_LO: f32 = 1.428_606_8e-6;
        // 1.5 · 2²³: adding and subtracting it rounds an f32 of magnitude < 2²² to an integer.
        const ROUND: f32 = 12_582_912.0;
        // A comparison, not `max`, so that NaN stays NaN.
        let y = if y < -87.0 { -87.0 } else { y };
        let k = y * LOG2_E + ROUND;
        let n = k - ROUND;
        let r = (y - n * LN2_HI) - n * LN2_LO;
        let p = 1.0
            + r * (1.0
                + r * (0.5
                    + r * (1.0 / 6.0
                        + r * (1.0 / 24.0
                            + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
        // `k` lies in [2²³, 2²⁴), where its bits are 0x4B40_0000 + n: n ∈ [-126, 0] read off as
        // an integer without a float-to-int conversion; 2ⁿ is the normal f32 of biased
        // exponent n + 127.
        let biased = k.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127);
        let scale = f32::from_bits(biased << 23);
        p * scale
    }
}

#[cfg(test)]
mod tests {
    use super::kernels::{cdf_and_gauss, exp_nonpositive};

    /// erf in f64 to about 1e-15: its Maclaurin series below 3, its continued fraction above.
    fn erf64(x: f64) -> f64 {
        let a = x.abs();
        let v = if a < 3.0 {
            let (mut term, mut sum, mut k) = (a, a, 0.0);
            while term.abs() > 1e-17 * sum.abs() {
                k += 1.0;
                term *= -a * a / k;
                sum += term / (2.0 * k + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(a) = exp(-a²)/√π · 1/(a + 1/2/(a + 1/(a + 3/2/(a + 2/(a + ...)))))
            let mut f = a;
            for k in (1..60).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
        };
        v.copysign(x)
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64s_down_to_underflow() {
        let mut y = 0.0f32;
        while y > -87.0 {
            let want = (y as f64).exp();
            let got = exp_nonpositive(y) as f64;
            let ulp = (want as f32).abs() * f32::EPSILON;
            assert!(
                (got - want).abs() <= 2.0 * ulp as f64,
                "exp({y}) = {got}, want {want}"
            );
            y -= 0.013;
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-1e9) < 1e-37);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    #[test]
    fn cdf_is_within_3e7_of_the_f64_normal_cdf() {
        let mut x = -12.0f32;
        while x < 12.0 {
            let want = 0.5 * (1.0 + erf64(x as f64 / std::f64::consts::SQRT_2));
            let (cdf, gauss) = cdf_and_gauss(x);
            assert!(
                (cdf as f64 - want).abs() < 3e-7,
                "Φ({x}) = {cdf}, want {want}"
            );
            let want_gauss = (-(x as f64) * (x as f64) / 2.0).exp();
            assert!((gauss as f64 - want_gauss).abs() < 1e-7, "{x}: {gauss}");
            x += 0.0071;
        }
        assert_eq!(cdf_and_gauss(0.0).0, 0.5);
        assert_eq!(cdf_and_gauss(f32::INFINITY).0, 1.0);
        assert_eq!(cdf_and_gauss(f32::NEG_INFINITY).0, 0.0);
        assert!(cdf_and_gauss(f32::NAN).0.is_nan());
    }

    /// Forward values and input gradients under autodiff against burn's own `gelu` (libm's
    /// `erf`), on a tensor that covers the tails, zero and a non-contiguous (transposed) view.
    #[test]
    fn matches_burns_gelu_forward_and_backward() {
        use burn::tensor::{Device, Tensor, TensorData};
        let device = Device::flex().autodiff();
        let values: Vec<f32> = (0..4096).map(|i| (i as f32 - 2048.0) / 160.0).collect();
        let upstream: Vec<f32> = (0..4096)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let x = Tensor::<2>::from_data(TensorData::new(values, [64, 64]), &device);
        let w = Tensor::<2>::from_data(TensorData::new(upstream, [64, 64]), &device);
        for transposed in [false, true] {
            let run = |gelu: fn(Tensor<2>) -> Tensor<2>| {
                let leaf = x.clone().require_grad();
                let input = if transposed {
                    leaf.clone().transpose()
                } else {
                    leaf.clone()
                };
                let y = gelu(input);
                let grads = (y.clone() * w.clone()).sum().backward();
                let g = leaf.grad(&grads).unwrap();
                let y: Vec<f32> = y.inner().into_data().try_to_vec().unwrap();
                let g: Vec<f32> = g.into_data().try_to_vec().unwrap();
                (y, g)
            };
            let (y_ours, g_ours) = run(super::gelu);
            let (y_burn, g_burn) = run(burn::tensor::activation::gelu);
            for (i, (a, b)) in y_ours.iter().zip(&y_burn).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-6 * b.abs().max(1.0),
                    "y[{i}]: {a} vs {b}"
                );
            }
            for (i, (a, b)) in g_ours.iter().zip(&g_burn).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-6 * b.abs().max(1.0),
                    "grad[{i}]: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn erf_oracle_matches_known_values() {
        // erf(0.5), erf(1), erf(2), erf(3.5) to 15 digits (DLMF / A&S tables).
        for (x, want) in [
            (0.5, 0.520_499_877_813_047),
            (1.0, 0.842_700_792_949_715),
            (2.0, 0.995_322_265_018_953),
            (3.5, 0.999_999_256_901_628),
        ] {
            assert!((erf64(x) - want).abs() < 1e-14, "erf({x}) = {}", erf64(x));
        }
    }
}
