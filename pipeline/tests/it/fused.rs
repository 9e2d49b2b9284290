//! The fused LayerNorm, causal softmax and cross-entropy against burn's own operations on the
//! CPU backend under autodiff: outputs and the gradients of every input, on contiguous and
//! non-contiguous (transposed) inputs, with and without a bias.

use burn::tensor::{Bool, DType, Device, FloatDType, Int, Tensor, TensorData};
use localsgd_pipeline::fused;

/// Deterministic pseudo-random values in [-2, 2).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn tensor<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(values(n, seed), shape), device)
}

fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec().unwrap()
}

/// Every element of `got` within `tol` (relative, absolute below 1) of `want`.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{what}[{i}]: {a} vs burn's {b}"
        );
    }
}

#[test]
fn layer_norm_matches_burns_forward_and_gradients() {
    layer_norm_matches_on(&Device::flex().autodiff());
}

#[test]
fn causal_softmax_matches_burns_masked_softmax_and_gradient() {
    causal_softmax_matches_on(&Device::flex().autodiff());
}

#[test]
fn cross_entropy_matches_burns_loss_and_gradient() {
    cross_entropy_matches_on(&Device::flex().autodiff());
}

/// The same three on LibTorch, where the fused forms are PyTorch's own kernels.
#[cfg(feature = "libtorch")]
#[test]
#[allow(deprecated)] // `Device::libtorch`: burn marks its LibTorch backend deprecated.
fn fused_operations_match_burns_on_libtorch() {
    let device = Device::libtorch().autodiff();
    layer_norm_matches_on(&device);
    causal_softmax_matches_on(&device);
    cross_entropy_matches_on(&device);
}

fn layer_norm_matches_on(device: &Device) {
    let device = device.clone();
    let (d, eps) = (48, 1e-5);
    for (transposed, with_bias) in [(false, true), (true, true), (false, false)] {
        let run = |fused_path: bool| {
            let x = tensor([4, 48, 7], 1, &device).require_grad();
            let gamma = tensor([d], 2, &device).require_grad();
            let beta = tensor([d], 3, &device).require_grad();
            let w = tensor([4, 7, d], 4, &device);
            // [4, 7, 48]: contiguous, or the transposed view of a [4, 48, 7] leaf.
            let input = if transposed {
                x.clone().swap_dims(1, 2)
            } else {
                x.clone().reshape([4, 7, d])
            };
            let b = with_bias.then(|| beta.clone());
            let y = if fused_path {
                fused::layer_norm(input, gamma.clone(), b, eps)
            } else {
                burn::tensor::module::layer_norm(input, gamma.clone(), b, eps)
            };
            let grads = (y.clone() * w).sum().backward();
            let mut out = vec![to_vec(y), to_vec(x.grad(&grads).unwrap())];
            out.push(to_vec(gamma.grad(&grads).unwrap()));
            if with_bias {
                out.push(to_vec(beta.grad(&grads).unwrap()));
            }
            out
        };
        let (ours, burns) = (run(true), run(false));
        for (i, name) in ["y", "dx", "dgamma", "dbeta"]
            .iter()
            .enumerate()
            .take(ours.len())
        {
            assert_close(name, &ours[i], &burns[i], 2e-5);
        }
    }
}

fn causal_softmax_matches_on(device: &Device) {
    let device = device.clone();
    let (t, scale) = (13, 0.3);
    for transposed in [false, true] {
        let run = |fused_path: bool| {
            let s = tensor([2, 3, t, t], 5, &device).require_grad();
            let w = tensor([2, 3, t, t], 6, &device);
            let input = if transposed {
                s.clone().swap_dims(2, 3)
            } else {
                s.clone()
            };
            let p = if fused_path {
                fused::causal_softmax(input, scale)
            } else {
                let future = Tensor::<2, Bool>::tril_mask([t, t], 0, &device).reshape([1, 1, t, t]);
                burn::tensor::activation::softmax(
                    (input * scale).mask_fill(future, f32::NEG_INFINITY),
                    3,
                )
            };
            let grads = (p.clone() * w).sum().backward();
            (to_vec(p), to_vec(s.grad(&grads).unwrap()))
        };
        let ((p, ds), (p_burn, ds_burn)) = (run(true), run(false));
        assert_close("p", &p, &p_burn, 1e-6);
        assert_close("ds", &ds, &ds_burn, 2e-6);
        // Future positions are exact zeros, the rows sum to one.
        for (r, row) in p.chunks(t).enumerate() {
            let i = r % t;
            assert!(row[i + 1..].iter().all(|&v| v == 0.0), "row {r}");
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6, "row {r}");
        }
    }
}

fn cross_entropy_matches_on(device: &Device) {
    let device = device.clone();
    let (n, c) = (37, 29);
    let targets: Vec<i64> = (0..n as i64).map(|i| (i * 7) % c as i64).collect();
    let run = |fused_path: bool| {
        let logits = tensor([n, c], 7, &device).mul_scalar(3.0).require_grad();
        let t = Tensor::<1, Int>::from_data(TensorData::new(targets.clone(), [n]), &device);
        let loss = if fused_path {
            fused::cross_entropy(logits.clone(), t)
        } else {
            burn::nn::loss::CrossEntropyLossConfig::new()
                .init(&device)
                .forward(logits.clone(), t)
        };
        let grads = (loss.clone() * 1.7).sum().backward();
        (to_vec(loss), to_vec(logits.grad(&grads).unwrap()))
    };
    let ((loss, dl), (loss_burn, dl_burn)) = (run(true), run(false));
    assert_eq!(loss.len(), 1);
    assert_close("loss", &loss, &loss_burn, 1e-6);
    assert_close("dlogits", &dl, &dl_burn, 1e-6);
}

/// A target that is no class gives a NaN loss on the fused path, not a panic or a number.
#[test]
fn cross_entropy_with_a_target_outside_the_classes_is_nan() {
    let device = Device::flex();
    let logits = tensor([3, 4], 8, &device);
    let targets = Tensor::<1, Int>::from_ints([0, 4, 1], &device);
    let loss: f32 = fused::cross_entropy(logits, targets).into_scalar();
    assert!(loss.is_nan(), "{loss}");
}

/// Float types the kernels do not take (here f64) go through burn's operations, written out in
/// `fused`: the same numbers as the fused f32 path.
#[test]
fn other_float_types_take_burns_operations_with_the_same_results() {
    let device = Device::flex();
    let f64_tensor = |shape: [usize; 2], seed| tensor(shape, seed, &device).cast(FloatDType::F64);
    let (s32, s64) = (tensor([9, 9], 9, &device), f64_tensor([9, 9], 9));
    assert_eq!(s64.dtype(), DType::F64, "the fallback's input is f64");
    assert_close(
        "causal softmax",
        &to_vec(fused::causal_softmax(s64, 0.5)),
        &to_vec(fused::causal_softmax(s32, 0.5)),
        1e-6,
    );
    let (x32, x64) = (tensor([5, 9], 10, &device), f64_tensor([5, 9], 10));
    let gamma = tensor([9], 11, &device);
    let gamma64 = gamma.clone().cast(FloatDType::F64);
    assert_close(
        "layer norm",
        &to_vec(fused::layer_norm(x64, gamma64, None, 1e-5)),
        &to_vec(fused::layer_norm(x32, gamma, None, 1e-5)),
        1e-5,
    );
    let targets = Tensor::<1, Int>::from_ints([0, 3, 8, 2, 5], &device);
    let (l32, l64) = (tensor([5, 9], 12, &device), f64_tensor([5, 9], 12));
    assert_close(
        "cross-entropy",
        &to_vec(fused::cross_entropy(l64, targets.clone())),
        &to_vec(fused::cross_entropy(l32, targets)),
        1e-6,
    );
}
