//! The GPT's exact GELU on the CPU backend: ours (`localsgd_pipeline::gelu::gelu`, one vectorized
//! pass each way) against burn's (`burn::tensor::activation::gelu`, scalar `erf`/`exp` per
//! element), forward and backward under autodiff, at the MLP activation of the default GPT
//! (batch 16 × context 64 rows of 4 × 128 = 512 columns) and of the large one (16 × 128 rows of
//! 4 × 256 = 1,024 columns).
//!
//! The table's ratio is the median over interleaved rounds of each round's ratio (ours / burn's:
//! below 1, ours is faster), so that a slow moment of the machine hits both sides; criterion then
//! times the default shape's two sides on its own.
//!
//! `cargo bench --workspace --bench gelu` (`BENCH_ROUNDS=N` sets the rounds, default 9).

use burn::tensor::{Device, Distribution, Tensor};
use criterion::Criterion;
use std::hint::black_box;
use std::time::Instant;

/// One forward and backward pass of `gelu` over `x` (a fresh leaf each time); the input's
/// gradient is read back so that the backward pass has run.
fn step(x: &Tensor<2>, gelu: fn(Tensor<2>) -> Tensor<2>) -> f32 {
    let x = x.clone().require_grad();
    let y = gelu(x.clone());
    let grads = y.sum().backward();
    let g = x.grad(&grads).expect("x is a tracked leaf");
    g.slice([0..1, 0..1]).into_scalar::<f32>()
}

fn ours(x: Tensor<2>) -> Tensor<2> {
    localsgd_pipeline::gelu::gelu(x)
}

fn burns(x: Tensor<2>) -> Tensor<2> {
    burn::tensor::activation::gelu(x)
}

/// Median seconds of `reps` calls of `f`.
fn median_time(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[reps / 2]
}

fn main() {
    let device = Device::flex().autodiff();
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    println!("| shape | ours ms | burn's ms | ours / burn's (median of {rounds} rounds) |");
    println!("|---|---:|---:|---:|");
    for (rows, cols) in [(16 * 64, 512), (16 * 128, 1024)] {
        let x = Tensor::<2>::random([rows, cols], Distribution::Normal(0.0, 1.0), &device);
        let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t_ours = median_time(9, || {
                black_box(step(&x, ours));
            });
            let t_burn = median_time(9, || {
                black_box(step(&x, burns));
            });
            a.push(t_ours);
            b.push(t_burn);
            r.push(t_ours / t_burn);
        }
        for v in [&mut a, &mut b, &mut r] {
            v.sort_by(f64::total_cmp);
        }
        let mid = rounds / 2;
        println!(
            "| [{rows}, {cols}] | {:.3} | {:.3} | {:.3} |",
            a[mid] * 1e3,
            b[mid] * 1e3,
            r[mid]
        );
    }

    let mut c = Criterion::default().configure_from_args();
    let x = Tensor::<2>::random([16 * 64, 512], Distribution::Normal(0.0, 1.0), &device);
    c.bench_function("gelu forward+backward [1024, 512] ours", |bench| {
        bench.iter(|| step(&x, ours))
    });
    c.bench_function("gelu forward+backward [1024, 512] burn", |bench| {
        bench.iter(|| step(&x, burns))
    });
    c.final_summary();
}
