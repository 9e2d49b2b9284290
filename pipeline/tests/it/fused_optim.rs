//! The fused optimizers against real PyTorch (`scripts/optimizer_reference.py`, vectors in
//! `tests/data/optimizer_reference.json`), on burn's CPU backend and (feature `libtorch`) on
//! LibTorch's CPU device, where they step the tensors' storage in place; their records against
//! burn's, and their resume.

use burn::nn::{Linear, LinearConfig};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer, Optimizer, SgdConfig};
use burn::tensor::{Bytes, Device, Tensor, TensorData};
use localsgd_pipeline::optim::{
    AdamState, FusedAdam, FusedAdamConfig, FusedSgd, FusedSgdConfig, SgdState,
};
use serde_json::Value;

const REFERENCE: &str = include_str!("../data/optimizer_reference.json");

fn floats(bits: &Value) -> Vec<f32> {
    bits.as_array()
        .expect("an array of f32 bit patterns")
        .iter()
        .map(|b| f32::from_bits(b.as_u64().expect("a u32") as u32))
        .collect()
}

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

fn values<const D: usize>(t: &Tensor<D>) -> Vec<f32> {
    t.clone()
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 values")
}

/// Compare bit patterns, reporting the first difference.
fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_ulps(what, got, want, 0);
}

/// Distance in units in the last place (same-sign finite values).
fn ulps(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let b = x.to_bits() as i64;
        if b < 0x8000_0000 { b } else { 0x8000_0000 - b }
    };
    (key(a) - key(b)).unsigned_abs() as u32
}

/// Every value within `max` units in the last place of PyTorch's, or within `abs` of it.
fn assert_ulps(what: &str, got: &[f32], want: &[f32], max: u32) {
    assert_near(what, got, want, max, 0.0);
}

fn assert_near(what: &str, got: &[f32], want: &[f32], max: u32, abs: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let near = (g - w).abs() <= abs;
        assert!(
            ulps(*g, *w) <= max || near,
            "{what}[{i}]: got {g:e}, PyTorch {w:e} ({} ulp apart, at most {max})",
            ulps(*g, *w)
        );
    }
}

/// How far Adam may be from PyTorch: PyTorch's vectorized `sqrt` on the CPU is not correctly
/// rounded (1 ulp off for some inputs), the fused step's is; everything else is bit for bit.
const ADAM_ULPS: u32 = 2;

/// The same for a parameter, per step taken: an update of size up to the learning rate (0.1)
/// off by the quotient's 1–2 ulps (2^-27 ≈ 7.5e-9 each) moves a parameter near zero by more
/// ulps of its own, and the steps' errors add up; 3e-8 is four ulps of the largest update.
const ADAM_ABS: f32 = 3e-8;

enum Fused {
    Sgd(FusedSgd),
    Adam(FusedAdam),
}

fn setting(settings: &Value, name: &str) -> Option<f64> {
    settings.get(name).and_then(Value::as_f64)
}

fn fused(kind: &str, settings: &Value) -> Fused {
    match kind {
        "sgd" => Fused::Sgd(
            FusedSgdConfig {
                momentum: setting(settings, "momentum").unwrap_or(0.0),
                dampening: setting(settings, "dampening").unwrap_or(0.0),
                nesterov: settings
                    .get("nesterov")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                weight_decay: setting(settings, "weight_decay").unwrap_or(0.0),
            }
            .build()
            .expect("valid SGD settings"),
        ),
        _ => {
            let mut config = if kind == "adam" {
                FusedAdamConfig::adam()
            } else {
                FusedAdamConfig::adamw()
            };
            if let Some(betas) = settings.get("betas").and_then(Value::as_array) {
                config.beta_1 = betas[0].as_f64().expect("beta 1");
                config.beta_2 = betas[1].as_f64().expect("beta 2");
            }
            if let Some(eps) = setting(settings, "eps") {
                config.eps = eps;
            }
            if let Some(wd) = setting(settings, "weight_decay") {
                config.weight_decay = wd;
            }
            config.decay_matrices_only = settings
                .get("decay_matrices_only")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            Fused::Adam(config.build().expect("valid Adam settings"))
        }
    }
}

/// One parameter of a case: rank 1 or 2, as the vectors' shapes.
enum Param {
    One(Tensor<1>, Option<SgdState<1>>, Option<AdamState<1>>),
    Two(Tensor<2>, Option<SgdState<2>>, Option<AdamState<2>>),
}

fn step_param<const D: usize>(
    optimizer: &Fused,
    lr: f64,
    p: Tensor<D>,
    g: Tensor<D>,
    sgd: Option<SgdState<D>>,
    adam: Option<AdamState<D>>,
) -> (Tensor<D>, Option<SgdState<D>>, Option<AdamState<D>>) {
    match optimizer {
        Fused::Sgd(o) => {
            let (p, s) = o.step(lr, p, g, sgd);
            (p, s, None)
        }
        Fused::Adam(o) => {
            let (p, s) = o.step(lr, p, g, adam);
            (p, None, s)
        }
    }
}

fn check_state<const D: usize>(
    what: &str,
    want: &Value,
    sgd: &Option<SgdState<D>>,
    adam: &Option<AdamState<D>>,
) {
    if let Some(velocity) = want.get("velocity") {
        let got = sgd.as_ref().and_then(|s| s.velocity.as_ref());
        match (velocity.is_null(), got) {
            (true, None) => {}
            (false, Some(v)) => {
                assert_bits(&format!("{what} velocity"), &values(v), &floats(velocity))
            }
            (true, Some(_)) => panic!("{what}: a momentum buffer PyTorch does not keep"),
            (false, None) => panic!("{what}: no momentum buffer, PyTorch keeps one"),
        }
    }
    if let Some(time) = want.get("time") {
        let s = adam.as_ref().expect("an Adam state");
        assert_eq!(
            s.time as u64,
            time.as_u64().expect("a step count"),
            "{what} time"
        );
        let (m, v) = (&want["moment_1"], &want["moment_2"]);
        assert_ulps(
            &format!("{what} exp_avg"),
            &values(&s.moment_1),
            &floats(m),
            ADAM_ULPS,
        );
        assert_ulps(
            &format!("{what} exp_avg_sq"),
            &values(&s.moment_2),
            &floats(v),
            ADAM_ULPS,
        );
    }
}

#[test]
fn fused_optimizers_match_pytorch() {
    check_against_pytorch(&Device::flex());
}

#[cfg(feature = "libtorch")]
#[test]
#[allow(deprecated)] // burn's LibTorch backend, used on purpose.
fn fused_optimizers_match_pytorch_on_libtorch() {
    check_against_pytorch(&Device::libtorch());
}

/// Every case of the reference on `device`: SGD bit for bit, Adam and AdamW within
/// `ADAM_ULPS` (PyTorch's vectorized `sqrt`).
fn check_against_pytorch(device: &Device) {
    let reference: Value = serde_json::from_str(REFERENCE).expect("reference JSON");
    let lrs: Vec<f64> = reference["lrs"]
        .as_array()
        .expect("lrs")
        .iter()
        .map(|v| v.as_f64().expect("an lr"))
        .collect();
    let initial = reference["initial"].as_array().expect("initial");
    let grads = reference["grads"].as_array().expect("grads");
    let cases = reference["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 11, "every case of the reference script");
    for case in cases {
        let name = case["name"].as_str().expect("a name");
        let kind = case["kind"].as_str().expect("a kind");
        let optimizer = fused(kind, &case["settings"]);
        let tol = if kind == "sgd" { 0 } else { ADAM_ULPS };
        let per_step = if kind == "sgd" { 0.0 } else { ADAM_ABS };
        let mut params = [
            Param::One(tensor(floats(&initial[0]), [37], device), None, None),
            Param::Two(tensor(floats(&initial[1]), [3, 45], device), None, None),
        ];
        for (step, want) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let abs = per_step * (step + 1) as f32;
            for (i, param) in params.iter_mut().enumerate() {
                let g = floats(&grads[step][i]);
                let what = format!("{name} step {} param {i}", step + 1);
                let placeholder = Param::One(tensor(vec![], [0], device), None, None);
                *param = match std::mem::replace(param, placeholder) {
                    Param::One(p, sgd, adam) => {
                        let (p, sgd, adam) = step_param(
                            &optimizer,
                            lrs[step],
                            p,
                            tensor(g, [37], device),
                            sgd,
                            adam,
                        );
                        assert_near(&what, &values(&p), &floats(&want["params"][i]), tol, abs);
                        check_state(&what, &want["state"][i], &sgd, &adam);
                        Param::One(p, sgd, adam)
                    }
                    Param::Two(p, sgd, adam) => {
                        let (p, sgd, adam) = step_param(
                            &optimizer,
                            lrs[step],
                            p,
                            tensor(g, [3, 45], device),
                            sgd,
                            adam,
                        );
                        assert_near(&what, &values(&p), &floats(&want["params"][i]), tol, abs);
                        check_state(&what, &want["state"][i], &sgd, &adam);
                        Param::Two(p, sgd, adam)
                    }
                };
            }
        }
    }
}

/// A linear layer and a fixed batch; `steps` optimizer steps of its squared output.
fn train(optimizer: &mut ModuleOptimizer, mut model: Linear, steps: usize) -> Linear {
    let device = Device::flex().autodiff();
    let x = Tensor::<2>::from_data(
        TensorData::new((0..24).map(|i| (i as f32 * 0.37).sin()).collect(), [6, 4]),
        &device,
    );
    for _ in 0..steps {
        let loss = model.forward(x.clone()).powf_scalar(2.0).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(0.05, model, grads);
    }
    model
}

fn layer() -> Linear {
    let device = Device::flex().autodiff();
    let model: Linear = LinearConfig::new(4, 3).init(&device);
    let bias = model.bias.clone().map(|b| b.map(|t| t.ones_like()));
    Linear { bias, ..model }
}

fn record(optimizer: &ModuleOptimizer) -> Vec<u8> {
    optimizer
        .into_bytes()
        .expect("an optimizer record")
        .to_vec()
}

fn load(optimizer: ModuleOptimizer, bytes: &[u8]) -> ModuleOptimizer {
    optimizer
        .from_bytes(Bytes::from_bytes_vec(bytes.to_vec()))
        .expect("a record the optimizer reads")
}

#[test]
fn records_move_between_burn_and_fused_optimizers() {
    let momentum = MomentumConfig {
        momentum: 0.9,
        dampening: 0.0,
        nesterov: false,
    };
    let pairs: Vec<(ModuleOptimizer, ModuleOptimizer)> = vec![
        (
            SgdConfig::new().with_momentum(Some(momentum)).init(),
            FusedSgdConfig {
                momentum: 0.9,
                ..FusedSgdConfig::default()
            }
            .init()
            .expect("valid"),
        ),
        (
            AdamConfig::new().with_epsilon(1e-8).init(),
            FusedAdamConfig::adam().init().expect("valid"),
        ),
    ];
    for (mut burn_optimizer, fused) in pairs {
        let model = layer();
        let _ = train(&mut burn_optimizer, model.clone(), 2);
        let saved = record(&burn_optimizer);
        // burn's record read by the fused optimizer and written back: the same bytes.
        let fused = load(fused, &saved);
        assert_eq!(record(&fused), saved);
        // And the fused optimizer's own record read by burn's.
        let mut fused = fused;
        let _ = train(&mut fused, model, 1);
        let again = record(&fused);
        let burn_again = load(burn_optimizer.clone(), &again);
        assert_eq!(record(&burn_again), again);
    }
}

#[test]
fn a_resumed_fused_optimizer_continues_exactly() {
    let configs = [
        FusedSgdConfig {
            momentum: 0.9,
            nesterov: true,
            weight_decay: 1e-3,
            ..FusedSgdConfig::default()
        }
        .init()
        .expect("valid"),
        FusedAdamConfig::adamw().init().expect("valid"),
    ];
    for fresh in configs {
        let start = layer();
        let mut straight = fresh.clone();
        let whole = train(&mut straight, start.clone(), 4);

        let mut first = fresh.clone();
        let half = train(&mut first, start, 2);
        let mut resumed = load(fresh, &record(&first));
        let end = train(&mut resumed, half, 2);
        for (a, b) in [
            (whole.weight.val(), end.weight.val()),
            (
                whole.bias.as_ref().expect("bias").val().unsqueeze::<2>(),
                end.bias.as_ref().expect("bias").val().unsqueeze::<2>(),
            ),
        ] {
            assert_bits("resumed parameters", &values(&a), &values(&b));
        }
    }
}

#[test]
fn settings_outside_pytorchs_ranges_are_refused_by_name() {
    let cases: Vec<(Result<ModuleOptimizer, _>, &str)> = vec![
        (
            FusedSgdConfig {
                momentum: -0.1,
                ..FusedSgdConfig::default()
            }
            .init(),
            "momentum -0.1 (valid: momentum >= 0)",
        ),
        (
            FusedSgdConfig {
                nesterov: true,
                momentum: 0.9,
                dampening: 0.1,
                ..FusedSgdConfig::default()
            }
            .init(),
            "Nesterov momentum needs momentum > 0 and dampening 0 (got momentum 0.9, dampening 0.1)",
        ),
        (
            FusedAdamConfig {
                beta_2: 1.0,
                ..FusedAdamConfig::adam()
            }
            .init(),
            "beta_2 1 (valid: 0 <= beta_2 < 1)",
        ),
        (
            FusedAdamConfig {
                eps: f64::NAN,
                ..FusedAdamConfig::adamw()
            }
            .init(),
            "eps NaN (valid: eps >= 0)",
        ),
        (
            FusedAdamConfig {
                weight_decay: -1.0,
                ..FusedAdamConfig::adamw()
            }
            .init(),
            "weight_decay -1 (valid: weight_decay >= 0)",
        ),
    ];
    for (result, message) in cases {
        let err = result.err().expect("refused").to_string();
        assert_eq!(err, format!("invalid optimizer setting: {message}"));
    }
}
