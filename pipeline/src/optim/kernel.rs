//! The fused update loops: one pass over a parameter's values, its gradient and its optimizer
//! state, in PyTorch's arithmetic (`torch.optim.SGD` / `Adam` / `AdamW`, single-tensor CPU
//! implementation).
//!
//! PyTorch's vectorized CPU kernels compute `a.add_(b, alpha=s)` and `a.lerp_(b, w)` with a
//! fused multiply-add where the CPU has one (AVX2/AVX-512 builds), and `addcmul_`/`addcdiv_` as
//! separate multiplies and adds. The loops below do the same: [`Fma`] where the CPU has FMA
//! (detected once at run time), [`Separate`] otherwise, so the results match PyTorch on the same
//! machine to the bit.

use std::sync::OnceLock;

/// How `a * b + c` is rounded.
pub(crate) trait MulAdd {
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// Rounded once (a fused multiply-add instruction).
pub(crate) struct Fma;
/// Rounded after the multiply and after the add.
pub(crate) struct Separate;

impl MulAdd for Fma {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl MulAdd for Separate {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// Whether this CPU has fused multiply-add (as PyTorch's vectorized kernels use it).
pub(crate) fn has_fma() -> bool {
    static FMA: OnceLock<bool> = OnceLock::new();
    *FMA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("avx2")
        }
        #[cfg(target_arch = "aarch64")]
        {
            true
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            false
        }
    })
}

/// SGD's scalars, already in the types PyTorch applies them in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SgdScalars {
    /// `-lr`.
    pub neg_lr: f32,
    pub weight_decay: f32,
    pub momentum: f32,
    /// `1 - dampening`.
    pub keep: f32,
    pub nesterov: bool,
}

/// One SGD step of `p` with gradient `g`. `velocity`: the momentum buffer (`None` without
/// momentum); `first`: the buffer is this step's new one (PyTorch: `clone(grad)`).
pub(crate) fn sgd(
    p: &mut [f32],
    g: &[f32],
    velocity: Option<&mut [f32]>,
    first: bool,
    s: SgdScalars,
) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        unsafe { sgd_x86_fma(p, g, velocity, first, s) };
        return;
    }
    if has_fma() {
        sgd_body::<Fma>(p, g, velocity, first, s);
    } else {
        sgd_body::<Separate>(p, g, velocity, first, s);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn sgd_x86_fma(p: &mut [f32], g: &[f32], velocity: Option<&mut [f32]>, first: bool, s: SgdScalars) {
    sgd_body::<Fma>(p, g, velocity, first, s);
}

/// The loop for one combination of settings, so that it has no branch inside and vectorizes.
#[inline(always)]
fn sgd_body<M: MulAdd>(
    p: &mut [f32],
    g: &[f32],
    velocity: Option<&mut [f32]>,
    first: bool,
    s: SgdScalars,
) {
    let decay = s.weight_decay != 0.0;
    match (velocity, decay, first, s.nesterov) {
        (None, false, ..) => sgd_plain::<M, false>(p, g, s),
        (None, true, ..) => sgd_plain::<M, true>(p, g, s),
        (Some(v), false, false, false) => sgd_momentum::<M, false, false, false>(p, g, v, s),
        (Some(v), false, false, true) => sgd_momentum::<M, false, false, true>(p, g, v, s),
        (Some(v), false, true, false) => sgd_momentum::<M, false, true, false>(p, g, v, s),
        (Some(v), false, true, true) => sgd_momentum::<M, false, true, true>(p, g, v, s),
        (Some(v), true, false, false) => sgd_momentum::<M, true, false, false>(p, g, v, s),
        (Some(v), true, false, true) => sgd_momentum::<M, true, false, true>(p, g, v, s),
        (Some(v), true, true, false) => sgd_momentum::<M, true, true, false>(p, g, v, s),
        (Some(v), true, true, true) => sgd_momentum::<M, true, true, true>(p, g, v, s),
    }
}

#[inline(always)]
fn sgd_plain<M: MulAdd, const DECAY: bool>(p: &mut [f32], g: &[f32], s: SgdScalars) {
    for (p, &g) in p.iter_mut().zip(g) {
        // grad = grad.add(param, alpha=wd); param.add_(grad, alpha=-lr)
        let d = if DECAY {
            M::mul_add(*p, s.weight_decay, g)
        } else {
            g
        };
        *p = M::mul_add(d, s.neg_lr, *p);
    }
}

#[inline(always)]
fn sgd_momentum<M: MulAdd, const DECAY: bool, const FIRST: bool, const NESTEROV: bool>(
    p: &mut [f32],
    g: &[f32],
    v: &mut [f32],
    s: SgdScalars,
) {
    for ((p, &g), v) in p.iter_mut().zip(g).zip(v.iter_mut()) {
        let d = if DECAY {
            M::mul_add(*p, s.weight_decay, g)
        } else {
            g
        };
        // buf = clone(grad) on the first step, else buf.mul_(m).add_(grad, alpha=1-d)
        *v = if FIRST {
            d
        } else {
            M::mul_add(d, s.keep, *v * s.momentum)
        };
        // nesterov: grad = grad.add(buf, alpha=m); else grad = buf
        let step = if NESTEROV {
            M::mul_add(*v, s.momentum, d)
        } else {
            *v
        };
        *p = M::mul_add(step, s.neg_lr, *p);
    }
}

/// Adam's and AdamW's scalars, already in the types PyTorch applies them in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamScalars {
    /// Coupled (Adam) weight decay added to the gradient; 0 for none.
    pub coupled_decay: f32,
    /// Decoupled (AdamW) factor `1 - lr * wd` the parameter is multiplied by; `None` for none.
    pub decay_factor: Option<f32>,
    /// `1 - beta1`, the weight of `exp_avg.lerp_(grad, 1 - beta1)`.
    pub lerp_weight: f32,
    pub beta2: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `sqrt(1 - beta2^t)`.
    pub bias_correction2_sqrt: f32,
    pub eps: f32,
    /// `-lr / (1 - beta1^t)`.
    pub neg_step_size: f32,
}

/// One Adam/AdamW step of `p` with gradient `g` and moments `m`, `v` (zeros before the first).
pub(crate) fn adam(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: AdamScalars) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        unsafe { adam_x86_fma(p, g, m, v, s) };
        return;
    }
    if has_fma() {
        adam_body::<Fma>(p, g, m, v, s);
    } else {
        adam_body::<Separate>(p, g, m, v, s);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn adam_x86_fma(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: AdamScalars) {
    adam_body::<Fma>(p, g, m, v, s);
}

/// The loop for one combination of settings, so that it has no branch inside and vectorizes.
#[inline(always)]
fn adam_body<M: MulAdd>(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: AdamScalars) {
    let coupled = s.coupled_decay != 0.0;
    let decoupled = s.decay_factor.is_some();
    let small = s.lerp_weight.abs() < 0.5;
    match (coupled, decoupled, small) {
        (false, false, true) => adam_loop::<M, false, false, true>(p, g, m, v, s),
        (false, false, false) => adam_loop::<M, false, false, false>(p, g, m, v, s),
        (true, _, true) => adam_loop::<M, true, false, true>(p, g, m, v, s),
        (true, _, false) => adam_loop::<M, true, false, false>(p, g, m, v, s),
        (false, true, true) => adam_loop::<M, false, true, true>(p, g, m, v, s),
        (false, true, false) => adam_loop::<M, false, true, false>(p, g, m, v, s),
    }
}

#[inline(always)]
fn adam_loop<M: MulAdd, const COUPLED: bool, const DECOUPLED: bool, const SMALL: bool>(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    s: AdamScalars,
) {
    let factor = s.decay_factor.unwrap_or(1.0);
    // lerp(start, end, w) = start + w * (end - start) for |w| < 0.5, else
    // end - (end - start) * (1 - w); PyTorch's vector form: fmadd(coeff, end - start, base).
    let coeff = if SMALL {
        s.lerp_weight
    } else {
        s.lerp_weight - 1.0
    };
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        if DECOUPLED {
            *p *= factor;
        }
        let d = if COUPLED {
            M::mul_add(*p, s.coupled_decay, g)
        } else {
            g
        };
        *m = M::mul_add(coeff, d - *m, if SMALL { *m } else { d });
        // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1-beta2): self + value * t1 * t2
        *v = *v * s.beta2 + s.one_minus_beta2 * d * d;
        // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
        // param.addcdiv_(exp_avg, denom, value=-step_size): self + value * t1 / t2
        *p += s.neg_step_size * *m / denom;
    }
}
