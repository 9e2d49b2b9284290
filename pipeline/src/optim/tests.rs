//! The tensor-operation path (a GPU device's) against the fused pass: the same formulas, so the
//! same numbers up to rounding.

use super::*;
use burn::optim::Optimizer;
use burn::tensor::TensorData;

fn tensor(values: Vec<f32>) -> Tensor<1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), &Device::flex())
}

fn values(t: &Tensor<1>) -> Vec<f32> {
    t.clone()
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 values")
}

fn assert_close(what: &str, a: &Tensor<1>, b: &Tensor<1>) {
    for (i, (x, y)) in values(a).iter().zip(values(b)).enumerate() {
        assert!(
            (x - y).abs() <= 1e-6 * y.abs().max(1.0),
            "{what}[{i}]: fused {x}, tensor operations {y}"
        );
    }
}

fn start() -> Tensor<1> {
    tensor((0..100).map(|i| (i as f32 * 0.3).sin()).collect())
}

fn grad(step: usize) -> Tensor<1> {
    tensor(
        (0..100)
            .map(|i| ((i + 7 * step) as f32 * 0.7).cos())
            .collect(),
    )
}

#[test]
fn sgd_tensor_operations_agree_with_the_fused_pass() {
    for config in [
        FusedSgdConfig::default(),
        FusedSgdConfig {
            momentum: 0.9,
            dampening: 0.2,
            weight_decay: 0.01,
            ..FusedSgdConfig::default()
        },
        FusedSgdConfig {
            momentum: 0.9,
            nesterov: true,
            ..FusedSgdConfig::default()
        },
    ] {
        let sgd = config.build().expect("valid settings");
        let (mut fused, mut fused_state) = (start(), None);
        let (mut ops, mut ops_state): (Tensor<1>, Option<SgdState<1>>) = (start(), None);
        for step in 0..4 {
            (fused, fused_state) = sgd.step(0.1, fused, grad(step), fused_state);
            let previous = ops_state.and_then(|s| s.velocity);
            (ops, ops_state) = sgd.step_tensors(sgd.scalars(0.1), ops, grad(step), previous);
            assert_close(&format!("{config:?} step {step}"), &fused, &ops);
        }
    }
}

#[test]
fn adam_tensor_operations_agree_with_the_fused_pass() {
    for config in [
        FusedAdamConfig::adam(),
        FusedAdamConfig {
            weight_decay: 0.05,
            beta_1: 0.3,
            ..FusedAdamConfig::adam()
        },
        FusedAdamConfig::adamw(),
    ] {
        let adam = config.build().expect("valid settings");
        let (mut fused, mut fused_state) = (start(), None);
        let (mut ops, mut ops_state): (Tensor<1>, Option<AdamState<1>>) = (start(), None);
        for step in 0..4 {
            (fused, fused_state) = adam.step(0.01, fused, grad(step), fused_state);
            let s = adam.scalars(0.01, step + 1, 2);
            (ops, ops_state) = adam.step_tensors(s, step + 1, ops, grad(step), ops_state);
            assert_close(&format!("{config:?} step {step}"), &fused, &ops);
        }
    }
}
