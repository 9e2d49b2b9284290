//! The matrix products of the GPT's training step on burn's `flex` CPU backend against `gemm`
//! called directly on the same operands (issue 54): every Linear's forward product and the two
//! products of its backward pass, and the attention's products forward and backward, each with
//! the operand layouts burn's autodiff hands `float_matmul` (plain row-major, or a transposed
//! view: `float_transpose` / `swap_dims` are metadata-only on flex, so the operand reaches the
//! product with a unit row stride, i.e. column-major).
//!
//! Shapes: the default GPT (`s`: batch 16, context 64, d-model 128, 4 heads of 32, MLP 512,
//! vocabulary 256) and the 3.3M one (`m`: batch 16, context 128, d-model 256, 8 heads of 32,
//! MLP 1,024). Every Linear gets the flattened `[B·T, in]` input and a weight stored `[in, out]`.
//! The attention's products come twice: `flat`, on `[B·H, T, 32]` tensors, and `gpt`, the 4-D
//! views the GPT really passes (`[B, T, H, 32]` storage seen as `[B, H, T, 32]` through
//! `swap_dims(1, 2)`, so a head's rows are `d-model` apart). The backward products are those of
//! `burn-autodiff`'s `float_matmul` backward: `dL = dY · Rᵀ` and `dR = Lᵀ · dY`, with `Rᵀ`/`Lᵀ`
//! `float_transpose` views; for the scores `Q · Kᵀ` the right-hand gradient is `dKᵀ = Qᵀ · dS`.
//!
//! Per case, each a median per call over interleaved samples (a slow moment of the machine hits
//! every column alike):
//! - `burn`: `lhs.clone().matmul(rhs.clone())` on `Device::flex()` with the autodiff layouts (the
//!   result is computed when `matmul` returns, flex being eager; it is dropped in the timing);
//! - `burn_contig`: the same with both operands row-major contiguous;
//! - `gemm_direct`: `gemm::gemm` with exactly the strides burn passes, `Parallelism::None`, into
//!   a preallocated output (one call per matrix of a batch);
//! - `gemm_par`: the same with the `Parallelism` argument burn-flex passes (`get_parallelism`:
//!   `Rayon(0)` for a 2-D product of at least 192³ multiply-adds, which under
//!   `RAYON_NUM_THREADS=1` is one thread but another blocking; `None` per matrix of a batch);
//! - `gemm_contig`: `gemm::gemm`, `Parallelism::None`, both operands row-major contiguous;
//! - `copy`: burn's own copy of the non-row-major operands to contiguous (a reshape of the view,
//!   which flex does with `FlexTensor::to_contiguous`), 0 when both are row-major; so
//!   `copy + gemm_contig` is what a copy-then-multiply would cost;
//! - `alloc`: `Tensor::empty` of the product's output shape, i.e. burn-flex's `FlexTensor::empty`,
//!   which `matmul` calls for its output: `vec![0u8; bytes]` handed to `Bytes::from_bytes_vec`,
//!   which copies it into a fresh 16-byte-aligned allocation (a `Vec<u8>` is only 1-aligned).
//!   `burn - gemm_par - alloc` is what is left of burn's own overhead;
//! - `zeroed`: `vec![0u8; bytes]` of the output's size alone, so `alloc - zeroed` is the
//!   re-aligning copy.
//!
//! The bench uses the system allocator (glibc); the `localsgd` binary uses mimalloc, so the cost
//! of the allocations (not of the copy) can differ there.
//!
//! Run single-threaded and pinned: `RAYON_NUM_THREADS=1 taskset -c 1 <binary>` (the runner
//! `bench/results/2026-12-07-amd-epyc-matmul-layouts/run.sh` does, and joins PyTorch's times).
//! Output: one tab-separated `RESULT` line per case (times in ms); `--list` prints the cases'
//! operand layouts instead (`CASE` lines, read by that folder's `torch_matmul.py`);
//! `--filter S` keeps the cases whose id contains `S`; `BENCH_SAMPLES=N` sets the samples
//! (default 21). Build: `cargo bench --workspace --bench matmul_layouts --no-run`.

use burn::tensor::{Device, Tensor, TensorData};
use gemm::Parallelism;
use std::hint::black_box;
use std::time::Instant;

/// One operand: a row-major `storage` array seen through the permutation `perm` (logical dim
/// `i` is storage dim `perm[i]`), which is how flex's `transpose`/`swap_dims`/`permute` views
/// are laid out.
struct Operand {
    storage: Vec<usize>,
    perm: Vec<usize>,
    data: Vec<f32>,
}

impl Operand {
    fn new(storage: &[usize], perm: &[usize], seed: u64) -> Self {
        let n = storage.iter().product();
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let data = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect();
        Self {
            storage: storage.to_vec(),
            perm: perm.to_vec(),
            data,
        }
    }

    fn shape(&self) -> Vec<usize> {
        self.perm.iter().map(|&p| self.storage[p]).collect()
    }

    fn strides(&self) -> Vec<isize> {
        let mut st = vec![1isize; self.storage.len()];
        for i in (0..st.len().saturating_sub(1)).rev() {
            st[i] = st[i + 1] * self.storage[i + 1] as isize;
        }
        self.perm.iter().map(|&p| st[p]).collect()
    }

    fn is_row_major(&self) -> bool {
        self.perm.iter().enumerate().all(|(i, &p)| i == p)
    }

    /// The same logical tensor, stored row-major.
    fn contiguous(&self) -> Operand {
        let shape = self.shape();
        let strides = self.strides();
        let mut data = Vec::with_capacity(self.data.len());
        let mut idx = vec![0usize; shape.len()];
        for _ in 0..self.data.len() {
            let off: isize = idx
                .iter()
                .zip(&strides)
                .map(|(&i, &s)| i as isize * s)
                .sum();
            data.push(self.data[off as usize]);
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Operand {
            storage: shape.clone(),
            perm: (0..shape.len()).collect(),
            data,
        }
    }

    /// `R` (row-major: unit column stride) or `C` (unit row stride: a transposed view), with
    /// the other stride when it is not the matrix's width/height (rows of a strided view).
    fn layout(&self) -> String {
        let (sh, st) = (self.shape(), self.strides());
        let r = sh.len();
        let (rows, cols, rs, cs) = (sh[r - 2], sh[r - 1], st[r - 2], st[r - 1]);
        if cs == 1 {
            if rs == cols as isize {
                "R".into()
            } else {
                format!("R(ld {rs})")
            }
        } else if rs == 1 {
            if cs == rows as isize {
                "C".into()
            } else {
                format!("C(ld {cs})")
            }
        } else {
            format!("strided({rs},{cs})")
        }
    }

    fn burn<const D: usize>(&self, device: &Device) -> Tensor<D> {
        let t = Tensor::<D>::from_data(
            TensorData::new(self.data.clone(), self.storage.clone()),
            device,
        );
        let perm: [usize; D] = self.perm.clone().try_into().expect("rank");
        t.permute(perm)
    }
}

struct Case {
    id: String,
    product: String,
    kind: &'static str,
    lhs: Operand,
    rhs: Operand,
}

impl Case {
    fn new(id: String, product: &str, kind: &'static str, lhs: Operand, rhs: Operand) -> Self {
        Case {
            id,
            product: product.to_string(),
            kind,
            lhs,
            rhs,
        }
    }

    /// (batch, m, k, n)
    fn dims(&self) -> (usize, usize, usize, usize) {
        let (l, r) = (self.lhs.shape(), self.rhs.shape());
        let n = l.len();
        (l[..n - 2].iter().product(), l[n - 2], l[n - 1], r[n - 1])
    }
}

/// The cases of one GPT size: batch `b`, context `t`, d-model `c`, `h` heads.
fn cases(tag: &str, b: usize, t: usize, c: usize, h: usize) -> Vec<Case> {
    let m = b * t;
    let hd = c / h;
    let mut v = Vec::new();
    let mut seed = 1u64;
    let mut op = |storage: &[usize], perm: &[usize]| {
        seed += 1;
        Operand::new(storage, perm, seed)
    };
    let linears = [
        ("qkv", c, 3 * c),
        ("proj", c, c),
        ("mlp-up", c, 4 * c),
        ("mlp-down", 4 * c, c),
        ("head", c, 256),
    ];
    for (name, i, o) in linears {
        let id = |p: &str| format!("{tag}/{name}/{p}");
        v.push(Case::new(
            id("fwd"),
            &format!("{name} Y=X·W"),
            "linear-fwd",
            op(&[m, i], &[0, 1]),
            op(&[i, o], &[0, 1]),
        ));
        v.push(Case::new(
            id("dx"),
            &format!("{name} dX=dY·Wᵀ"),
            "linear-dx",
            op(&[m, o], &[0, 1]),
            op(&[i, o], &[1, 0]),
        ));
        v.push(Case::new(
            id("dw"),
            &format!("{name} dW=Xᵀ·dY"),
            "linear-dw",
            op(&[m, i], &[1, 0]),
            op(&[m, o], &[0, 1]),
        ));
    }
    // Flat: [B·H, T, hd] tensors; `[0, 2, 1]` is `swap_dims(1, 2)` / `float_transpose`.
    let bh = b * h;
    let (q, tr, att) = ([bh, t, hd], [0, 2, 1], [bh, t, t]);
    let id = [0, 1, 2];
    let flat = [
        ("scores", "S=Q·Kᵀ", q, &id, q, &tr),
        ("out", "O=A·V", att, &id, q, &id),
        ("dA", "dA=dO·Vᵀ", q, &id, q, &tr),
        ("dV", "dV=Aᵀ·dO", att, &tr, q, &id),
        ("dQ", "dQ=dS·K", att, &id, q, &id),
        ("dKt", "dKᵀ=Qᵀ·dS", q, &tr, att, &id),
    ];
    for (name, what, ls, lp, rs, rp) in flat {
        v.push(Case::new(
            format!("{tag}/attn-flat/{name}"),
            &format!("attn {what}"),
            "attn",
            op(&ls, lp),
            op(&rs, rp),
        ));
    }
    // As the GPT passes them: q, k, v and dO are `[B, T, H, hd]` storage viewed `[B, H, T, hd]`
    // (`swap_dims(1, 2)`, perm [0, 2, 1, 3]); their transposes perm [0, 2, 3, 1]; A and dS are
    // contiguous `[B, H, T, T]`, Aᵀ perm [0, 1, 3, 2].
    let (s4, a4) = ([b, t, h, hd], [b, h, t, t]);
    let (hv, hvt, id4, at) = ([0, 2, 1, 3], [0, 2, 3, 1], [0, 1, 2, 3], [0, 1, 3, 2]);
    let gpt = [
        ("scores", "S=Q·Kᵀ", s4, &hv, s4, &hvt),
        ("out", "O=A·V", a4, &id4, s4, &hv),
        ("dA", "dA=dO·Vᵀ", s4, &hv, s4, &hvt),
        ("dV", "dV=Aᵀ·dO", a4, &at, s4, &hv),
        ("dQ", "dQ=dS·K", a4, &id4, s4, &hv),
        ("dKt", "dKᵀ=Qᵀ·dS", s4, &hvt, a4, &id4),
    ];
    for (name, what, ls, lp, rs, rp) in gpt {
        v.push(Case::new(
            format!("{tag}/attn-gpt/{name}"),
            &format!("attn {what}"),
            "attn",
            op(&ls, lp),
            op(&rs, rp),
        ));
    }
    v
}

/// `out = lhs · rhs` with `gemm::gemm` on the operands' own strides, one call per matrix of the
/// batch; `out` row-major.
fn gemm_strided(lhs: &Operand, rhs: &Operand, out: &mut [f32], par: impl Fn(usize) -> Parallelism) {
    let (ls, lst, rst) = (lhs.shape(), lhs.strides(), rhs.strides());
    let r = ls.len();
    let (m, k, n) = (ls[r - 2], ls[r - 1], rhs.shape()[r - 1]);
    let batch = &ls[..r - 2];
    let nb: usize = batch.iter().product();
    let mut idx = vec![0usize; batch.len()];
    for bi in 0..nb {
        let lo: isize = idx.iter().zip(&lst).map(|(&i, &s)| i as isize * s).sum();
        let ro: isize = idx.iter().zip(&rst).map(|(&i, &s)| i as isize * s).sum();
        let dst = &mut out[bi * m * n..(bi + 1) * m * n];
        // SAFETY: every offset that the shapes and strides address lies inside the operands'
        // storage and `dst` holds `m·n` values.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                lhs.data.as_ptr().offset(lo),
                lst[r - 1],
                lst[r - 2],
                rhs.data.as_ptr().offset(ro),
                rst[r - 1],
                rst[r - 2],
                0.0,
                1.0,
                false,
                false,
                false,
                par(m * n * k),
            );
        }
        for d in (0..batch.len()).rev() {
            idx[d] += 1;
            if idx[d] < batch[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// burn-flex 0.22.1 `ops/matmul.rs::get_parallelism` for a 2-D product.
fn burn_parallelism(ops: usize) -> Parallelism {
    if ops >= 192 * 192 * 192 {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

const COLUMNS: usize = 8;

/// Times the case; returns the medians in ms (see the module docs for the columns).
fn run_case<const D: usize>(case: &Case, samples: usize, device: &Device) -> [f64; COLUMNS] {
    let (batch, m, _, n) = case.dims();
    let out_len = batch * m * n;
    let (lc, rc) = (case.lhs.contiguous(), case.rhs.contiguous());
    let (bl, br) = (case.lhs.burn::<D>(device), case.rhs.burn::<D>(device));
    let (blc, brc) = (lc.burn::<D>(device), rc.burn::<D>(device));
    let strided: Vec<(Tensor<D>, usize)> = [(&case.lhs, &bl), (&case.rhs, &br)]
        .into_iter()
        .filter(|(o, _)| !o.is_row_major())
        .map(|(o, t)| (t.clone(), o.data.len()))
        .collect();
    let batched = D > 2;
    let mut out_shape = case.lhs.shape();
    out_shape[D - 1] = n;

    // The three computations agree (burn, gemm on burn's strides, gemm on contiguous copies).
    let mut out = vec![0f32; out_len];
    gemm_strided(&case.lhs, &case.rhs, &mut out, |_| Parallelism::None);
    let burn_out = bl
        .clone()
        .matmul(br.clone())
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32");
    let mut out_c = vec![0f32; out_len];
    gemm_strided(&lc, &rc, &mut out_c, |_| Parallelism::None);
    assert!(
        max_rel_diff(&burn_out, &out) < 1e-4,
        "{}: burn != gemm",
        case.id
    );
    assert!(
        max_rel_diff(&out_c, &out) < 1e-4,
        "{}: gemm layouts disagree",
        case.id
    );

    let mut out_p = vec![0f32; out_len];
    let mut fns: Vec<Box<dyn FnMut() + '_>> = vec![
        Box::new(|| {
            black_box(bl.clone().matmul(br.clone()));
        }),
        Box::new(|| {
            black_box(blc.clone().matmul(brc.clone()));
        }),
        Box::new(|| {
            gemm_strided(&case.lhs, &case.rhs, &mut out, |_| Parallelism::None);
            black_box(&out);
        }),
        Box::new(|| {
            gemm_strided(&case.lhs, &case.rhs, &mut out_p, |ops| {
                if batched {
                    Parallelism::None
                } else {
                    burn_parallelism(ops)
                }
            });
            black_box(&out_p);
        }),
        Box::new(|| {
            gemm_strided(&lc, &rc, &mut out_c, |_| Parallelism::None);
            black_box(&out_c);
        }),
        Box::new(|| {
            for (t, len) in &strided {
                black_box(t.clone().reshape::<1, _>([*len]));
            }
        }),
        Box::new(|| {
            black_box(Tensor::<D>::empty(out_shape.clone(), device));
        }),
        Box::new(|| {
            black_box(vec![0u8; out_len * 4]);
        }),
    ];

    // Warm up, then size the inner loop so that one sample of gemm_direct takes ~2 ms.
    for f in fns.iter_mut() {
        for _ in 0..3 {
            f();
        }
    }
    let t0 = Instant::now();
    (fns[2])();
    let once = t0.elapsed().as_secs_f64();
    let inner = ((2e-3 / once.max(1e-7)).ceil() as usize).clamp(1, 2000);

    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(samples); fns.len()];
    for _ in 0..samples {
        for (f, t) in fns.iter_mut().zip(times.iter_mut()) {
            let s = Instant::now();
            for _ in 0..inner {
                f();
            }
            t.push(s.elapsed().as_secs_f64() / inner as f64 * 1e3);
        }
    }
    let mut r = [0f64; COLUMNS];
    for (i, t) in times.into_iter().enumerate() {
        r[i] = median(t);
    }
    if strided.is_empty() {
        r[5] = 0.0;
    }
    r
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let list = args.iter().any(|a| a == "--list");
    let filter = args
        .iter()
        .position(|a| a == "--filter")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_default();
    let samples: usize = std::env::var("BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(21);
    let mut all = cases("s", 16, 64, 128, 4);
    all.extend(cases("m", 16, 128, 256, 8));
    all.retain(|c| c.id.contains(&filter));
    let dims = |v: &[usize]| {
        v.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x")
    };
    let perm = |v: &[usize]| {
        v.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    if list {
        for c in &all {
            println!(
                "CASE\t{}\t{}\t{}\t{}\t{}\t{}",
                c.id,
                c.kind,
                dims(&c.lhs.storage),
                perm(&c.lhs.perm),
                dims(&c.rhs.storage),
                perm(&c.rhs.perm)
            );
        }
        return;
    }
    let device = Device::flex();
    println!(
        "# RESULT id product shape(batch×m×k×n) layout(lhs·rhs) flop burn burn_contig gemm_direct gemm_par gemm_contig copy alloc zeroed (ms, median of {samples})"
    );
    for c in &all {
        let r = match c.lhs.storage.len() {
            2 => run_case::<2>(c, samples, &device),
            3 => run_case::<3>(c, samples, &device),
            4 => run_case::<4>(c, samples, &device),
            d => unreachable!("rank {d}"),
        };
        let (b, m, k, n) = c.dims();
        println!(
            "RESULT\t{}\t{}\t{b}x{m}x{k}x{n}\t{}·{}\t{}\t{}",
            c.id,
            c.product,
            c.lhs.layout(),
            c.rhs.layout(),
            2 * b * m * k * n,
            r.map(|t| format!("{t:.4}")).join("\t")
        );
    }
}
