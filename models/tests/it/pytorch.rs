//! Loading PyTorch-layout safetensors into the MLP and the CNN: values, layout and every error
//! case.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::{Device, Tensor, TensorData};
use localsgd_models::cnn::CnnConfig;
use localsgd_models::mlp::{Mlp, MlpConfig};
use localsgd_models::network::{Classify, ModelSpec, Network};
use localsgd_models::pytorch::{WeightsError, load_pytorch_safetensors, save_pytorch_safetensors};
use safetensors::{Dtype, tensor::TensorView};

/// (name, dtype, shape, little-endian bytes)
type Entry = (String, Dtype, Vec<usize>, Vec<u8>);

fn f32_entry(name: &str, shape: &[usize], values: &[f32]) -> Entry {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    (name.to_string(), Dtype::F32, shape.to_vec(), bytes)
}

fn f64_entry(name: &str, shape: &[usize], values: &[f64]) -> Entry {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    (name.to_string(), Dtype::F64, shape.to_vec(), bytes)
}

fn write(path: &Path, entries: &[Entry]) {
    let views: HashMap<String, TensorView<'_>> = entries
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A 3 -> 2 -> 2 network, PyTorch layout ([out, in]).
const W1: [f32; 6] = [1.0, 2.0, 3.0, -1.0, 0.5, 0.0]; // rows: out 0 = [1,2,3], out 1 = [-1,0.5,0]
const B1: [f32; 2] = [0.5, -4.0];
const W2: [f64; 4] = [1.0, -1.0, 2.0, 0.25];
const B2: [f64; 2] = [0.0, 1.0];

fn good_entries() -> Vec<Entry> {
    vec![
        f32_entry("fc1.weight", &[2, 3], &W1),
        f32_entry("fc1.bias", &[2], &B1),
        f64_entry("fc2.weight", &[2, 2], &W2),
        f64_entry("fc2.bias", &[2], &B2),
    ]
}

fn config() -> ModelSpec {
    ModelSpec::Mlp(MlpConfig {
        input: 3,
        hidden: vec![2],
        classes: 2,
    })
}

fn mlp(model: Network) -> Mlp {
    match model {
        Network::Mlp(m) => m,
        other => panic!("expected an MLP, got {other:?}"),
    }
}

#[test]
fn forward_matches_hand_computed_linear_layers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    write(&path, &good_entries());
    let device = Device::flex();
    let model = mlp(load_pytorch_safetensors(&path, &config(), &device).unwrap());
    let x = Tensor::<2>::from_data(
        TensorData::new(vec![1.0f32, 1.0, 1.0, 2.0, 0.0, -1.0], [2, 3]),
        &device,
    );
    let out = model.forward(x).into_data().try_to_vec::<f32>().unwrap();
    // Row [1,1,1]: h = relu([1+2+3+0.5, -1+0.5+0-4]) = relu([6.5, -4.5]) = [6.5, 0]
    //   out = [1*6.5 - 1*0 + 0, 2*6.5 + 0.25*0 + 1] = [6.5, 14]
    // Row [2,0,-1]: h = relu([2+0-3+0.5, -2+0+0-4]) = relu([-0.5, -6]) = [0, 0]; out = b2 = [0, 1]
    assert_eq!(out, vec![6.5, 14.0, 0.0, 1.0]);
    // burn's weight is the transpose: [in, out].
    assert_eq!(model.layers[0].weight.dims(), [3, 2]);
    let w = model.layers[0]
        .weight
        .val()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    assert_eq!(w, vec![1.0, -1.0, 2.0, 0.5, 3.0, 0.0]);
}

#[test]
fn save_writes_pytorch_layout_and_roundtrips() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.safetensors");
    write(&src, &good_entries());
    let device = Device::flex();
    let model = load_pytorch_safetensors(&src, &config(), &device).unwrap();
    let out = dir.path().join("out.safetensors");
    save_pytorch_safetensors(&model, &out).unwrap();

    let bytes = std::fs::read(&out).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file.names();
    names.sort();
    assert_eq!(
        names,
        vec!["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    );
    let w1 = file.tensor("fc1.weight").unwrap();
    assert_eq!(
        (w1.dtype(), w1.shape()),
        (Dtype::F32, [2usize, 3].as_slice())
    );
    let values: Vec<f32> = w1
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(values, W1.to_vec());

    let seeded = config().init(3, &device).unwrap();
    save_pytorch_safetensors(&seeded, &out).unwrap();
    let back = mlp(load_pytorch_safetensors(&out, &config(), &device).unwrap());
    let seeded = mlp(seeded);
    for (a, b) in seeded.layers.iter().zip(&back.layers) {
        assert_eq!(a.weight.val().into_data(), b.weight.val().into_data());
        let (ab, bb) = (a.bias.as_ref().unwrap(), b.bias.as_ref().unwrap());
        assert_eq!(ab.val().into_data(), bb.val().into_data());
    }
}

fn load_err(entries: &[Entry], config: &ModelSpec) -> WeightsError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    write(&path, entries);
    load_pytorch_safetensors(&path, config, &Device::flex()).unwrap_err()
}

#[test]
fn missing_tensor_is_named() {
    let mut entries = good_entries();
    entries.remove(3);
    match load_err(&entries, &config()) {
        WeightsError::MissingTensor {
            name,
            expected,
            found,
        } => {
            assert_eq!(name, "fc2.bias");
            assert_eq!(expected, vec![2]);
            assert_eq!(found, vec!["fc1.bias", "fc1.weight", "fc2.weight"]);
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
}

#[test]
fn extra_tensor_is_named() {
    let mut entries = good_entries();
    entries.push(f32_entry("fc3.weight", &[1, 2], &[0.0, 0.0]));
    let err = load_err(&entries, &config());
    assert!(
        matches!(&err, WeightsError::UnexpectedTensors { names, expected } if names == &["fc3.weight"] && expected.len() == 4),
        "{err:?}"
    );
}

#[test]
fn shape_mismatch_names_tensor_and_shapes() {
    let mut entries = good_entries();
    // [in, out] instead of PyTorch's [out, in].
    entries[0] = f32_entry("fc1.weight", &[3, 2], &W1);
    let err = load_err(&entries, &config());
    assert!(
        matches!(&err, WeightsError::ShapeMismatch { name, expected, found }
            if name == "fc1.weight" && expected == &[2, 3] && found == &[3, 2]),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("fc1.weight") && msg.contains("[2, 3]") && msg.contains("[3, 2]"),
        "{msg}"
    );
    // A config with a different hidden width also mismatches.
    let wide = MlpConfig {
        input: 3,
        hidden: vec![4],
        classes: 2,
    };
    assert!(matches!(
        load_err(&good_entries(), &ModelSpec::Mlp(wide)),
        WeightsError::ShapeMismatch { .. }
    ));
}

#[test]
fn unsupported_dtype_is_rejected() {
    let mut entries = good_entries();
    entries[1] = ("fc1.bias".to_string(), Dtype::I32, vec![2], vec![0; 8]);
    let err = load_err(&entries, &config());
    assert!(
        matches!(&err, WeightsError::UnsupportedDtype { name, found: Dtype::I32 } if name == "fc1.bias"),
        "{err:?}"
    );
    assert!(err.to_string().contains("F32 or F64"));
}

#[test]
fn unreadable_or_invalid_files() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.safetensors");
    let err = load_pytorch_safetensors(&missing, &config(), &Device::flex()).unwrap_err();
    assert!(matches!(err, WeightsError::Io { .. }));
    assert!(err.to_string().contains("nope.safetensors"));
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"definitely not safetensors").unwrap();
    let err = load_pytorch_safetensors(&garbage, &config(), &Device::flex()).unwrap_err();
    assert!(matches!(err, WeightsError::Format { .. }), "{err:?}");
    let bad = MlpConfig {
        input: 0,
        hidden: vec![],
        classes: 2,
    };
    assert!(matches!(
        load_err(&good_entries(), &ModelSpec::Mlp(bad)),
        WeightsError::Config(_)
    ));
}

/// A one-block CNN on 2x2 images, by hand: conv 3x3 (padding 1) with a single non-zero tap, batch
/// normalization from the file's running statistics (evaluation mode), ReLU, 2x2 max pooling, a
/// 1 -> 2 head. PyTorch's `num_batches_tracked` is accepted; the saved file has the same
/// tensors back (without it).
#[test]
fn cnn_loads_runs_and_roundtrips_in_pytorch_layout() {
    let spec = ModelSpec::Cnn(CnnConfig {
        side: 2,
        channels: vec![1],
        classes: 2,
    });
    // Centre tap 2, bias 1: conv(x) = 2x + 1 at every pixel.
    let mut kernel = [0.0f32; 9];
    kernel[4] = 2.0;
    let entries = vec![
        f32_entry("convs.0.weight", &[1, 1, 3, 3], &kernel),
        f32_entry("convs.0.bias", &[1], &[1.0]),
        f32_entry("norms.0.weight", &[1], &[0.5]),
        f32_entry("norms.0.bias", &[1], &[-1.0]),
        f32_entry("norms.0.running_mean", &[1], &[3.0]),
        f32_entry("norms.0.running_var", &[1], &[4.0 - 1e-5]),
        f32_entry("norms.0.num_batches_tracked", &[], &[7.0]),
        f32_entry("head.weight", &[2, 1], &[1.0, -2.0]),
        f32_entry("head.bias", &[2], &[0.0, 10.0]),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cnn.safetensors");
    write(&path, &entries);
    let device = Device::flex();
    let Network::Cnn(model) = load_pytorch_safetensors(&path, &spec, &device).unwrap() else {
        panic!("a CNN spec loads a CNN");
    };
    // Pixels [1, 2, 3, 5]: conv 3, 5, 7, 11; norm 0.5 (v - 3) / sqrt(4) - 1 = -1, -0.5, 0, 1;
    // ReLU then max: 1; head [1, -2 + 10] = [1, 8].
    let x = Tensor::<2>::from_data(
        TensorData::new(vec![1.0f32, 2.0, 3.0, 5.0], [1, 4]),
        &device,
    );
    let out = model.logits(x).into_data().try_to_vec::<f32>().unwrap();
    assert!(
        (out[0] - 1.0).abs() < 1e-5 && (out[1] - 8.0).abs() < 1e-5,
        "{out:?}"
    );

    let saved = dir.path().join("saved.safetensors");
    save_pytorch_safetensors(&Network::Cnn(model), &saved).unwrap();
    let bytes = std::fs::read(&saved).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, _, shape, raw) in entries
        .iter()
        .filter(|e| !e.0.ends_with("num_batches_tracked"))
    {
        let view = file.tensor(name).unwrap();
        assert_eq!(
            (view.shape(), view.data()),
            (shape.as_slice(), raw.as_slice()),
            "{name}"
        );
    }
    assert_eq!(file.names().len(), 8);
}
