//! The GPT language model against its PyTorch twin (`scripts/gpt_twin.py`, committed output in
//! `tests/data/gpt_twin*.{json,safetensors}`): the forward loss at the twin's initial weights,
//! 20 AdamW steps' losses and the final weights; the configuration's errors; the safetensors
//! round trip; causality. Every number asserted against comes from the PyTorch file.

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};
use localsgd_models::gpt::{Gpt, GptConfig, GptError};
use localsgd_models::pytorch::NamedTensor;

/// Forward loss at fixed weights and batch: relative difference to PyTorch's (measured: 8.6e-8).
const FORWARD_TOLERANCE: f64 = 1e-5;
/// Each AdamW step's loss: relative difference to PyTorch's (measured: at most 7.3e-7).
const STEP_TOLERANCE: f64 = 1e-4;
/// Final weights after 20 steps: `|ours - theirs| <= FINAL_TOLERANCE * max(1, |theirs|)`
/// (measured: at most 5.9e-6, in elements whose gradients are near zero, where Adam's
/// `m / (sqrt(v) + eps)` magnifies f32 rounding).
const FINAL_TOLERANCE: f64 = 5e-5;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The twin's JSON file.
fn reference() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(data_dir().join("gpt_twin.json")).unwrap())
        .unwrap()
}

fn twin_config(reference: &serde_json::Value) -> GptConfig {
    let c = &reference["config"];
    let get = |k: &str| c[k].as_u64().unwrap() as usize;
    GptConfig {
        vocab: get("vocab"),
        context: get("context"),
        d_model: get("d_model"),
        heads: get("heads"),
        layers: get("layers"),
    }
}

/// Batch `s` of the twin as f32 windows `[B, context + 1]`.
fn batch(reference: &serde_json::Value, s: usize, device: &Device) -> Tensor<2> {
    let rows = reference["batches"][s].as_array().unwrap();
    let width = rows[0].as_array().unwrap().len();
    let values: Vec<f32> = rows
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter())
        .map(|v| v.as_u64().unwrap() as f32)
        .collect();
    Tensor::<2>::from_data(TensorData::new(values, [rows.len(), width]), device)
}

fn rel(ours: f64, theirs: f64) -> f64 {
    (ours - theirs).abs() / theirs.abs()
}

/// Every tensor of a safetensors file, by name (F32).
fn file_tensors(path: &Path) -> Vec<NamedTensor> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, view.shape().to_vec(), values)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn sorted(mut tensors: Vec<NamedTensor>) -> Vec<NamedTensor> {
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

fn load_twin(reference: &serde_json::Value, device: &Device) -> Gpt {
    let path = data_dir().join(reference["init_weights"].as_str().unwrap());
    Gpt::load_safetensors(&path, &twin_config(reference), device).unwrap()
}

#[test]
fn forward_loss_matches_pytorch_at_the_twins_weights() {
    let reference = reference();
    let device = Device::flex();
    let model = load_twin(&reference, &device);
    let ours = model
        .window_loss(batch(&reference, 0, &device))
        .unwrap()
        .into_scalar::<f32>();
    let theirs = reference["forward_loss"].as_f64().unwrap();
    let r = rel(f64::from(ours), theirs);
    println!("forward loss: ours {ours}, PyTorch {theirs}, relative difference {r:.2e}");
    assert!(
        r <= FORWARD_TOLERANCE,
        "ours {ours}, PyTorch {theirs}: {r:.2e}"
    );
    // The same through the evaluation path (summed in f64) and on the autodiff device.
    let eval = model.window_eval(batch(&reference, 0, &device)).unwrap();
    let r = rel(eval.nats_per_byte(), theirs);
    assert!(r <= FORWARD_TOLERANCE, "window_eval: {r:.2e}");
    assert_eq!(eval.tokens, 4 * 16);
    let auto = Device::flex().autodiff();
    let ours = load_twin(&reference, &auto)
        .window_loss(batch(&reference, 0, &auto))
        .unwrap()
        .into_scalar::<f32>();
    let r = rel(f64::from(ours), theirs);
    assert!(r <= FORWARD_TOLERANCE, "autodiff device: {r:.2e}");
}

#[test]
fn twenty_adamw_steps_match_pytorch() {
    let reference = reference();
    let device = Device::flex().autodiff();
    let mut model = load_twin(&reference, &device);
    let adamw = &reference["adamw"];
    let lr = adamw["lr"].as_f64().unwrap();
    // torch.optim.AdamW, every value set (burn's defaults differ: eps 1e-5, weight decay 1e-4).
    let mut optim = AdamWConfig::new()
        .with_beta_1(adamw["betas"][0].as_f64().unwrap() as f32)
        .with_beta_2(adamw["betas"][1].as_f64().unwrap() as f32)
        .with_epsilon(adamw["eps"].as_f64().unwrap() as f32)
        .with_weight_decay(adamw["weight_decay"].as_f64().unwrap() as f32)
        .with_amsgrad(false)
        .with_cautious_weight_decay(false)
        .with_grad_clipping(None)
        .init();
    let theirs: Vec<f64> = reference["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(theirs.len(), 20);
    let mut worst = 0.0f64;
    for (s, &want) in theirs.iter().enumerate() {
        let loss = model.window_loss(batch(&reference, s, &device)).unwrap();
        let got = f64::from(loss.clone().into_scalar::<f32>());
        let r = rel(got, want);
        worst = worst.max(r);
        assert!(
            r <= STEP_TOLERANCE,
            "step {s}: ours {got}, PyTorch {want}: {r:.2e}"
        );
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
    }
    println!("20 AdamW steps: largest relative loss difference {worst:.2e}");
    // The final weights, tensor by tensor.
    let final_path = data_dir().join(reference["final_weights"].as_str().unwrap());
    let want = file_tensors(&final_path);
    let got = sorted(model.valid().to_named_tensors().unwrap());
    assert_eq!(got.len(), want.len());
    let mut worst = 0.0f64;
    for ((name, shape, ours), (wname, wshape, theirs)) in got.iter().zip(&want) {
        assert_eq!((name, shape), (wname, wshape));
        for (a, b) in ours.iter().zip(theirs) {
            let d = f64::from((a - b).abs()) / f64::from(b.abs()).max(1.0);
            worst = worst.max(d);
            assert!(d <= FINAL_TOLERANCE, "{name}: ours {a}, PyTorch {b}");
        }
    }
    println!("final weights: largest difference {worst:.2e}");
}

#[test]
fn parameter_counts_match_the_twin_and_the_default() {
    let reference = reference();
    let config = twin_config(&reference);
    assert_eq!(
        config.num_params(),
        reference["num_params"].as_u64().unwrap()
    );
    // wte 256x128, wpe 64x128, 2 blocks of (2 LayerNorms, 128->384, 128->128, 128->512,
    // 512->128), ln_f, lm_head 128->256: 32768 + 8192 + 2 x 198272 + 256 + 33024.
    assert_eq!(GptConfig::small().num_params(), 470_784);
    assert_eq!(GptConfig::small().validate().ok(), Some(()));
}

#[test]
fn invalid_configs_name_the_bad_value() {
    let ok = GptConfig::small();
    let cases = [
        (GptConfig { context: 0, ..ok }, "`context` = 0"),
        (GptConfig { d_model: 0, ..ok }, "`d-model` = 0"),
        (GptConfig { heads: 0, ..ok }, "`heads` = 0"),
        (GptConfig { layers: 0, ..ok }, "`layers` = 0"),
        (GptConfig { vocab: 0, ..ok }, "`vocab` = 0"),
        (
            GptConfig { heads: 5, ..ok },
            "`heads` = 5 does not divide `d-model` = 128; use heads that divide it (e.g. 4)",
        ),
    ];
    let device = Device::flex();
    for (config, want) in cases {
        let message = config.validate().unwrap_err().to_string();
        assert!(message.contains(want), "{message:?} lacks {want:?}");
        assert!(config.init(0, &device).is_err());
    }
    let err = GptConfig { heads: 5, ..ok }.validate().unwrap_err();
    assert!(
        matches!(
            err,
            GptError::HeadsNotDividing {
                heads: 5,
                d_model: 128,
                suggestion: 4
            }
        ),
        "{err:?}"
    );
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let device = Device::flex();
    let config = GptConfig {
        vocab: 256,
        context: 4,
        d_model: 8,
        heads: 2,
        layers: 1,
    };
    let model = config.init(1, &device).unwrap();
    let tokens = |values: Vec<i64>, t: usize| {
        Tensor::<2, Int>::from_data(TensorData::new(values, [1, t]), &device)
    };
    let err = model.forward(tokens(vec![1; 5], 5)).unwrap_err();
    assert!(
        err.to_string()
            .contains("5 tokens per row; the model takes 1 to 4"),
        "{err}"
    );
    let err = model.forward(tokens(vec![1, 2, 256], 3)).unwrap_err();
    assert!(
        err.to_string()
            .contains("token 256 is outside the vocabulary 0..256"),
        "{err}"
    );
    assert!(matches!(
        model.forward(tokens(vec![-1, 2], 2)),
        Err(GptError::Token { .. })
    ));
    let windows = |values: Vec<f32>, w: usize| {
        Tensor::<2>::from_data(TensorData::new(values, [1, w]), &device)
    };
    let err = model.window_loss(windows(vec![1.0; 6], 6)).unwrap_err();
    assert!(
        err.to_string()
            .contains("window of 6 values per row; windows hold 2 to 5"),
        "{err}"
    );
    assert!(matches!(
        model.window_loss(windows(vec![1.0], 1)),
        Err(GptError::WindowWidth { width: 1, .. })
    ));
    assert!(matches!(
        model.window_loss(windows(vec![1.0, 300.0], 2)),
        Err(GptError::Token { .. })
    ));
    // Shorter windows than the context are fine.
    assert_eq!(
        model
            .window_logits_and_targets(windows(vec![1.0, 2.0, 3.0], 3))
            .unwrap()
            .0
            .dims(),
        [1, 2, 256]
    );
}

#[test]
fn weights_files_that_do_not_fit_are_errors() {
    let reference = reference();
    let config = twin_config(&reference);
    let device = Device::flex();
    let mut tensors = load_twin(&reference, &device).to_named_tensors().unwrap();
    // A wider model than the file.
    let wider = GptConfig {
        d_model: 64,
        ..config
    };
    let err = Gpt::from_named_tensors(&wider, tensors.clone(), &device).unwrap_err();
    assert!(
        err.to_string()
            .contains("tensor \"wte.weight\": expected shape [256, 64], found [256, 32]"),
        "{err}"
    );
    // A deeper one: h.2 is missing.
    let deeper = GptConfig {
        layers: 3,
        ..config
    };
    let err = Gpt::from_named_tensors(&deeper, tensors.clone(), &device).unwrap_err();
    assert!(
        err.to_string()
            .contains("missing tensor \"h.2.ln_1.weight\""),
        "{err}"
    );
    // An extra tensor.
    tensors.push(("h.0.attn.bias".into(), vec![1], vec![0.0]));
    let err = Gpt::from_named_tensors(&config, tensors, &device).unwrap_err();
    assert!(
        err.to_string()
            .contains("unexpected tensors [\"h.0.attn.bias\"]"),
        "{err}"
    );
    // Not a safetensors file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    std::fs::write(&path, b"not safetensors").unwrap();
    assert!(Gpt::load_safetensors(&path, &config, &device).is_err());
}

#[test]
fn export_import_round_trip_is_exact() {
    let reference = reference();
    let device = Device::flex();
    // The twin's file, read and written back: the same values.
    let init = data_dir().join(reference["init_weights"].as_str().unwrap());
    let model = load_twin(&reference, &device);
    assert_eq!(
        sorted(model.to_named_tensors().unwrap()),
        file_tensors(&init)
    );
    // Our own init, through named tensors and through a file.
    let config = GptConfig {
        vocab: 256,
        context: 8,
        d_model: 16,
        heads: 4,
        layers: 2,
    };
    let model = config.init(3, &device).unwrap();
    let named = model.to_named_tensors().unwrap();
    let names: Vec<(String, Vec<usize>)> = named
        .iter()
        .map(|(n, s, _)| (n.clone(), s.clone()))
        .collect();
    assert_eq!(names, config.pytorch_layout());
    let again = Gpt::from_named_tensors(&config, named.clone(), &device).unwrap();
    assert_eq!(again.to_named_tensors().unwrap(), named);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpt.safetensors");
    model.save_safetensors(&path).unwrap();
    let loaded = Gpt::load_safetensors(&path, &config, &device).unwrap();
    assert_eq!(loaded.to_named_tensors().unwrap(), named);
    assert_eq!(loaded.config(), config);
    assert_eq!(params(&loaded), params(&model));
}

/// Every float parameter's values, in traversal order.
#[derive(Default)]
struct Collect(Vec<Vec<f32>>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        self.0
            .push(p.val().into_data().try_to_vec::<f32>().unwrap());
    }
}

fn params(model: &impl Module) -> Vec<Vec<f32>> {
    let mut c = Collect::default();
    model.visit(&mut c);
    c.0
}

#[test]
fn init_is_seeded_and_shaped_like_nanogpt() {
    let device = Device::flex();
    let config = GptConfig {
        vocab: 256,
        context: 32,
        d_model: 64,
        heads: 4,
        layers: 2,
    };
    let a = config.init(5, &device).unwrap();
    assert_eq!(params(&a), params(&config.init(5, &device).unwrap()));
    assert_ne!(params(&a), params(&config.init(6, &device).unwrap()));
    let std = |v: &[f32]| {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        (v.iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n)
            .sqrt()
    };
    let residual = 0.02 / 2.0f64.sqrt() / 2.0f64.sqrt(); // 0.02 / sqrt(2 * layers)
    for (name, _, values) in a.to_named_tensors().unwrap() {
        if name.ends_with(".bias") {
            assert!(values.iter().all(|&x| x == 0.0), "{name}");
        } else if name.contains("ln_") {
            assert!(values.iter().all(|&x| x == 1.0), "{name}");
        } else {
            let want = if name.ends_with("c_proj.weight") {
                residual
            } else {
                0.02
            };
            let got = std(&values);
            assert!(
                (got / want - 1.0).abs() < 0.05,
                "{name}: std {got}, want {want}"
            );
        }
    }
}

#[test]
fn earlier_positions_do_not_see_later_tokens() {
    let device = Device::flex();
    let config = GptConfig {
        vocab: 256,
        context: 8,
        d_model: 16,
        heads: 2,
        layers: 2,
    };
    let model = config.init(11, &device).unwrap();
    let logits = |ids: Vec<i64>| {
        let t = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, 8]), &device);
        model
            .forward(t)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
    };
    let base: Vec<i64> = b"causal!?".iter().map(|&b| i64::from(b)).collect();
    let a = logits(base.clone());
    for changed in [7usize, 4] {
        let mut other = base.clone();
        other[changed] = 3;
        let b = logits(other);
        let v = 256;
        assert_eq!(
            a[..changed * v],
            b[..changed * v],
            "positions before {changed}"
        );
        assert_ne!(
            a[changed * v..(changed + 1) * v],
            b[changed * v..(changed + 1) * v],
            "position {changed} sees its own token"
        );
    }
}
