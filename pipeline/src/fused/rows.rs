//! The fused operations' kernels on plain f32 rows: LayerNorm, the causal softmax and the
//! cross-entropy, forward and backward. Each works on a block of whole rows; [`for_row_blocks`]
//! hands blocks to rayon's pool (the one burn's CPU backend runs its matrix products on).
//!
//! Every reduction sums in eight lanes and then combines the lanes in a fixed order, and every
//! block boundary depends on the row length only, never on the number of threads: the bits of
//! every result are the same on one thread or many, and on every CPU (the AVX2 and the baseline
//! builds of a kernel run the same IEEE operations in the same order, with no fused
//! multiply-add).

use rayon::prelude::*;

use crate::gelu::exp_nonpositive;

/// Elements a block of rows should hold, about: large enough that a task outweighs its
/// scheduling, small enough that two threads share the GPT's tensors evenly.
const BLOCK_ELEMENTS: usize = 8 * 1024;

/// Rows per block for rows of `row_len` elements (at least one).
pub(super) fn rows_per_block(row_len: usize) -> usize {
    (BLOCK_ELEMENTS / row_len.max(1)).max(1)
}

/// Calls `f(first_row, block)` for consecutive blocks of [`rows_per_block`] rows of `out`
/// (rows of `row_len` elements), in parallel.
pub(super) fn for_row_blocks<F>(out: &mut [f32], row_len: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    let rows = rows_per_block(row_len);
    out.par_chunks_mut(rows * row_len.max(1))
        .enumerate()
        .for_each(|(i, block)| f(i * rows, block));
}

/// Defines `pub(super) fn $name` whose body is compiled twice, for AVX2 (taken where the CPU has
/// it, checked at run time) and for the target's baseline, so that its loops vectorize.
macro_rules! vectorized {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        pub(super) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn imp($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    imp($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            imp($($arg),*)
        }
    };
}

/// Lanes of the reductions.
const LANES: usize = 8;

/// Combines eight lane sums in a fixed order.
#[inline(always)]
fn combine(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `Σ f(a[i], b[i])` in eight lanes (`a` and `b` of one length).
#[inline(always)]
fn lane_sum2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (ca, cb) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += f(ca[l], cb[l]);
        }
    }
    let mut s = combine(acc);
    for (&x, &y) in ar.iter().zip(br) {
        s += f(x, y);
    }
    s
}

/// `Σ f(a[i])` in eight lanes.
#[inline(always)]
fn lane_sum(a: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    lane_sum2(a, a, |x, _| f(x))
}

/// The largest element (`-∞` for an empty slice); NaN elements are skipped, and reach the
/// result through the values computed from them.
#[inline(always)]
fn lane_max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = a.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for v in acc.into_iter().chain(rest.iter().copied()) {
        m = if v > m { v } else { m };
    }
    m
}

vectorized! {
    /// LayerNorm of the rows of `x` (each `gamma.len()` long) into `y`, with each row's mean
    /// and `1/√(var + eps)` (the biased variance, PyTorch's) into `mean` and `rstd`.
    fn layer_norm_forward(
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
        y: &mut [f32],
        mean: &mut [f32],
        rstd: &mut [f32],
    ) {
        let d = gamma.len();
        let inv_d = 1.0 / d as f32;
        for (((x, y), mean), rstd) in x
            .chunks_exact(d)
            .zip(y.chunks_exact_mut(d))
            .zip(mean.iter_mut())
            .zip(rstd.iter_mut())
        {
            let mu = lane_sum(x, |v| v) * inv_d;
            let var = lane_sum(x, |v| (v - mu) * (v - mu)) * inv_d;
            let r = 1.0 / (var + eps).sqrt();
            for (((y, &x), &g), &b) in y.iter_mut().zip(x).zip(gamma).zip(beta) {
                *y = (x - mu) * r * g + b;
            }
            (*mean, *rstd) = (mu, r);
        }
    }
}

vectorized! {
    /// LayerNorm's backward pass over rows of `x`: `grad` (the output's gradient) becomes the
    /// input's gradient, and each row's `grad·x̂` and `grad` are added to `dgamma` and `dbeta`.
    fn layer_norm_backward(
        x: &[f32],
        gamma: &[f32],
        mean: &[f32],
        rstd: &[f32],
        grad: &mut [f32],
        dgamma: &mut [f32],
        dbeta: &mut [f32],
    ) {
        let d = gamma.len();
        let inv_d = 1.0 / d as f32;
        for (((x, g), &mu), &r) in x
            .chunks_exact(d)
            .zip(grad.chunks_exact_mut(d))
            .zip(mean)
            .zip(rstd)
        {
            for (((dg, db), &x), &g) in dgamma.iter_mut().zip(dbeta.iter_mut()).zip(x.iter()).zip(g.iter()) {
                *dg += g * ((x - mu) * r);
                *db += g;
            }
            // With ĝ = grad·γ: dx = r·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)).
            let a = lane_sum2(g, gamma, |g, w| g * w) * inv_d;
            let mut acc = [0.0f32; LANES];
            let mut b = 0.0f32;
            {
                let (gc, wc, xc) = (g.chunks_exact(LANES), gamma.chunks_exact(LANES), x.chunks_exact(LANES));
                let (gr, wr, xr) = (gc.remainder(), wc.remainder(), xc.remainder());
                for ((cg, cw), cx) in gc.zip(wc).zip(xc) {
                    for l in 0..LANES {
                        acc[l] += cg[l] * cw[l] * ((cx[l] - mu) * r);
                    }
                }
                let mut s = combine(acc);
                for ((&g, &w), &x) in gr.iter().zip(wr).zip(xr) {
                    s += g * w * ((x - mu) * r);
                }
                b += s * inv_d;
            }
            for ((g, &w), &x) in g.iter_mut().zip(gamma).zip(x) {
                *g = r * (*g * w - a - ((x - mu) * r) * b);
            }
        }
    }
}

vectorized! {
    /// Causal softmax over rows of `t` elements of `scores`, in place: row `r` is query position
    /// `i = (first_row + r) mod t` and keeps `softmax(scale · s[0..=i])` with zeros after `i`.
    fn causal_softmax_forward(scores: &mut [f32], t: usize, first_row: usize, scale: f32) {
        for (r, row) in scores.chunks_exact_mut(t).enumerate() {
            let i = (first_row + r) % t;
            let (kept, masked) = row.split_at_mut(i + 1);
            for v in kept.iter_mut() {
                *v *= scale;
            }
            let m = lane_max(kept);
            for v in kept.iter_mut() {
                *v = exp_nonpositive(*v - m);
            }
            let inv = 1.0 / lane_sum(kept, |v| v);
            for v in kept.iter_mut() {
                *v *= inv;
            }
            masked.fill(0.0);
        }
    }
}

vectorized! {
    /// The causal softmax's backward pass over rows of `t`: with `p` its output, `grad` (the
    /// output's gradient) becomes `scale · p · (grad - Σ p·grad)` (zero after position `i`).
    fn causal_softmax_backward(p: &[f32], grad: &mut [f32], t: usize, first_row: usize, scale: f32) {
        for (r, (p, g)) in p.chunks_exact(t).zip(grad.chunks_exact_mut(t)).enumerate() {
            let i = (first_row + r) % t;
            let (p, g_kept) = (&p[..=i], &mut g[..]);
            let (g_kept, g_masked) = g_kept.split_at_mut(i + 1);
            let dot = lane_sum2(p, g_kept, |p, g| p * g);
            for (g, &p) in g_kept.iter_mut().zip(p) {
                *g = scale * (p * (*g - dot));
            }
            g_masked.fill(0.0);
        }
    }
}

vectorized! {
    /// The cross-entropy of each row of `logits` (rows of `v` classes) against its target
    /// class, `logsumexp(row) - row[target]`, into `loss`; NaN where the target is not a class.
    fn cross_entropy_forward(logits: &[f32], v: usize, targets: &[i64], loss: &mut [f32]) {
        for ((row, &target), loss) in logits.chunks_exact(v).zip(targets).zip(loss.iter_mut()) {
            let m = lane_max(row);
            let sum = lane_sum(row, |x| exp_nonpositive(x - m));
            *loss = match usize::try_from(target).ok().filter(|&t| t < v) {
                Some(t) => (m + sum.ln()) - row[t],
                None => f32::NAN,
            };
        }
    }
}

vectorized! {
    /// The cross-entropy's backward pass over rows of `v` classes, in place: each row of
    /// `logits` becomes `scale · (softmax(row) - onehot(target))` (`scale`: the loss's gradient
    /// over the rows it averages); NaN rows where the target is not a class.
    fn cross_entropy_backward(logits: &mut [f32], v: usize, targets: &[i64], scale: f32) {
        for (row, &target) in logits.chunks_exact_mut(v).zip(targets) {
            let m = lane_max(row);
            for x in row.iter_mut() {
                *x = exp_nonpositive(*x - m);
            }
            let inv = scale / lane_sum(row, |x| x);
            for x in row.iter_mut() {
                *x *= inv;
            }
            match usize::try_from(target).ok().filter(|&t| t < v) {
                Some(t) => row[t] -= scale,
                None => row.fill(f32::NAN),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-3, 3).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
            })
            .collect()
    }

    /// LayerNorm forward and backward against the formulas in f64, one row at a time.
    #[test]
    fn layer_norm_matches_f64() {
        let (rows, d, eps) = (5, 37, 1e-5);
        let x = values(rows * d, 1);
        let gamma = values(d, 2);
        let beta = values(d, 3);
        let up = values(rows * d, 4);
        let (mut y, mut mean, mut rstd) = (vec![0.0; rows * d], vec![0.0; rows], vec![0.0; rows]);
        layer_norm_forward(&x, &gamma, &beta, eps, &mut y, &mut mean, &mut rstd);
        let mut dx = up.clone();
        let (mut dgamma, mut dbeta) = (vec![0.0; d], vec![0.0; d]);
        layer_norm_backward(&x, &gamma, &mean, &rstd, &mut dx, &mut dgamma, &mut dbeta);
        let (mut want_dg, mut want_db) = (vec![0.0f64; d], vec![0.0f64; d]);
        for r in 0..rows {
            let xr: Vec<f64> = x[r * d..(r + 1) * d].iter().map(|&v| v as f64).collect();
            let mu = xr.iter().sum::<f64>() / d as f64;
            let var = xr.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / d as f64;
            let rs = 1.0 / (var + eps as f64).sqrt();
            let xhat: Vec<f64> = xr.iter().map(|v| (v - mu) * rs).collect();
            let g: Vec<f64> = (0..d)
                .map(|j| up[r * d + j] as f64 * gamma[j] as f64)
                .collect();
            let a = g.iter().sum::<f64>() / d as f64;
            let b = g.iter().zip(&xhat).map(|(g, h)| g * h).sum::<f64>() / d as f64;
            for j in 0..d {
                let want_y = xhat[j] * gamma[j] as f64 + beta[j] as f64;
                assert!((y[r * d + j] as f64 - want_y).abs() < 1e-5, "y[{r},{j}]");
                let want_dx = rs * (g[j] - a - xhat[j] * b);
                assert!(
                    (dx[r * d + j] as f64 - want_dx).abs() < 1e-4 * want_dx.abs().max(1.0),
                    "dx[{r},{j}]: {} vs {want_dx}",
                    dx[r * d + j]
                );
                want_dg[j] += up[r * d + j] as f64 * xhat[j];
                want_db[j] += up[r * d + j] as f64;
            }
        }
        for j in 0..d {
            assert!((dgamma[j] as f64 - want_dg[j]).abs() < 1e-4, "dgamma[{j}]");
            assert!((dbeta[j] as f64 - want_db[j]).abs() < 1e-4, "dbeta[{j}]");
        }
    }

    /// The causal softmax and its backward pass against the formulas in f64, on rows that start
    /// at several query positions (blocks that begin mid-matrix).
    #[test]
    fn causal_softmax_matches_f64() {
        let (t, scale) = (11, 0.37f32);
        for first_row in [0, 4, 10] {
            let rows = 2 * t;
            let s = values(rows * t, 5 + first_row as u64);
            let up = values(rows * t, 9);
            let mut p = s.clone();
            causal_softmax_forward(&mut p, t, first_row, scale);
            let mut ds = up.clone();
            causal_softmax_backward(&p, &mut ds, t, first_row, scale);
            for r in 0..rows {
                let i = (first_row + r) % t;
                let z: Vec<f64> = (0..=i)
                    .map(|j| s[r * t + j] as f64 * scale as f64)
                    .collect();
                let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = z.iter().map(|z| (z - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                let want: Vec<f64> = e.iter().map(|e| e / sum).collect();
                let dot: f64 = (0..=i).map(|j| want[j] * up[r * t + j] as f64).sum();
                for j in 0..t {
                    let (wp, wd) = if j <= i {
                        let wd = scale as f64 * want[j] * (up[r * t + j] as f64 - dot);
                        (want[j], wd)
                    } else {
                        (0.0, 0.0)
                    };
                    assert!((p[r * t + j] as f64 - wp).abs() < 1e-6, "p[{r},{j}]");
                    assert!((ds[r * t + j] as f64 - wd).abs() < 1e-6, "ds[{r},{j}]");
                }
            }
        }
    }

    /// Cross-entropy and its gradient against the formulas in f64; an out-of-range target
    /// gives NaN, not a panic.
    #[test]
    fn cross_entropy_matches_f64() {
        let (rows, v) = (6, 19);
        let logits = values(rows * v, 11);
        let targets: Vec<i64> = vec![0, 18, 5, 7, 19, -1];
        let mut loss = vec![0.0; rows];
        cross_entropy_forward(&logits, v, &targets, &mut loss);
        let mut grad = logits.clone();
        cross_entropy_backward(&mut grad, v, &targets, 0.25);
        for r in 0..rows {
            let row: Vec<f64> = logits[r * v..(r + 1) * v]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            if r >= 4 {
                assert!(loss[r].is_nan() && grad[r * v].is_nan(), "row {r}");
                continue;
            }
            let t = targets[r] as usize;
            assert!((loss[r] as f64 - (lse - row[t])).abs() < 1e-5, "loss[{r}]");
            for j in 0..v {
                let want = 0.25 * ((row[j] - lse).exp() - if j == t { 1.0 } else { 0.0 });
                assert!(
                    (grad[r * v + j] as f64 - want).abs() < 1e-6,
                    "grad[{r},{j}]"
                );
            }
        }
    }

    /// Blocks depend on the row length only, so one thread and several give the same bits.
    #[test]
    fn blocks_do_not_depend_on_the_thread_count() {
        let (t, scale) = (64, 0.125f32);
        let s = values(256 * t, 21);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut p = s.clone();
            pool.install(|| {
                for_row_blocks(&mut p, t, |first, block| {
                    causal_softmax_forward(block, t, first, scale)
                })
            });
            p
        };
        assert_eq!(run(1), run(3));
    }
}
