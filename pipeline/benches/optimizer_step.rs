//! One optimizer step of a whole model: burn's own `Sgd` (momentum 0.9) and `AdamW` against the
//! fused [`FusedSgdConfig`] / [`FusedAdamConfig`] of `localsgd_pipeline::optim`, in the same
//! run, on the parameter shapes of the Fashion-MNIST MLP 784-256-128-10 (235,146 parameters)
//! and the wide MLP 784-2048-512-10 (2,661,898), one thread.
//!
//! Each timed step gets fresh gradient tensors (made off the clock, as a backward pass hands
//! them over: owned by the step), and the model it stepped last. Ratios: compare the `burn` and
//! `fused` lines of one model and optimizer.
//!
//! `RAYON_NUM_THREADS=1 cargo bench --workspace --bench optimizer_step` (`-- --quick` for a
//! short run).

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Tensor, TensorData};
use criterion::Criterion;
use localsgd_pipeline::optim::{FusedAdamConfig, FusedSgdConfig};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// An MLP's parameters (its forward pass plays no part here).
#[derive(Module, Debug)]
struct Mlp {
    layers: Vec<Linear>,
}

fn mlp(widths: &[usize]) -> Mlp {
    let device = Device::flex().autodiff();
    Mlp {
        layers: widths
            .windows(2)
            .map(|w| LinearConfig::new(w[0], w[1]).init(&device))
            .collect(),
    }
}

/// Gradients for every parameter of `model`, owned by the step (fresh buffers).
fn gradients(model: &Mlp) -> GradientsParams {
    let device = Device::flex();
    let mut grads = GradientsParams::new();
    for layer in &model.layers {
        let [rows, cols] = layer.weight.val().dims();
        let weight: Vec<f32> = (0..rows * cols)
            .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
            .collect();
        grads.register(
            layer.weight.id,
            Tensor::<2>::from_data(TensorData::new(weight, [rows, cols]), &device),
        );
        if let Some(bias) = &layer.bias {
            let bias_grad: Vec<f32> = (0..cols).map(|i| (i % 13) as f32 * 1e-3).collect();
            grads.register(
                bias.id,
                Tensor::<1>::from_data(TensorData::new(bias_grad, [cols]), &device),
            );
        }
    }
    grads
}

/// `iters` steps of `optimizer` on `model`, each with fresh gradients; the steps' total time.
fn time_steps(optimizer: &mut ModuleOptimizer, model: &mut Option<Mlp>, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let Some(m) = model.take() else { break };
        let grads = gradients(&m);
        let start = Instant::now();
        let stepped = optimizer.step(0.01, m, grads);
        total += start.elapsed();
        *model = Some(black_box(stepped));
    }
    total
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let momentum = MomentumConfig {
        momentum: 0.9,
        dampening: 0.0,
        nesterov: false,
    };
    for (name, widths) in [
        ("fashion 784-256-128-10", vec![784, 256, 128, 10]),
        ("wide 784-2048-512-10", vec![784, 2048, 512, 10]),
    ] {
        let optimizers: Vec<(&str, ModuleOptimizer)> = vec![
            (
                "sgd momentum burn",
                SgdConfig::new()
                    .with_momentum(Some(momentum.clone()))
                    .init(),
            ),
            (
                "sgd momentum fused",
                FusedSgdConfig {
                    momentum: 0.9,
                    ..FusedSgdConfig::default()
                }
                .init()
                .expect("valid settings"),
            ),
            (
                "adamw burn",
                AdamWConfig::new()
                    .with_epsilon(1e-8)
                    .with_weight_decay(0.01)
                    .init(),
            ),
            (
                "adamw fused",
                FusedAdamConfig::adamw().init().expect("valid settings"),
            ),
        ];
        let mut group = c.benchmark_group(name);
        for (label, optimizer) in optimizers {
            let mut optimizer = optimizer;
            let mut model = Some(mlp(&widths));
            group.bench_function(label, |b| {
                b.iter_custom(|iters| time_steps(&mut optimizer, &mut model, iters))
            });
        }
        group.finish();
    }
    c.final_summary();
}
