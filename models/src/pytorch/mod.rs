//! PyTorch weights in and out: loading a model's weights from, and saving them to, a
//! safetensors file as `safetensors.torch.save_file(model.state_dict())` writes it for the
//! model's PyTorch twin. The one place of the workspace that reads or writes that format.
//!
//! - [`Mlp`]: layer `k` (0-based) is `fc{k+1}.weight` with PyTorch's shape `[out, in]` and
//!   `fc{k+1}.bias` `[out]`, a module whose Linear layers are named `fc1`, `fc2`, ... Linear
//!   weights are transposed to and from burn's `[in, out]` layout.
//! - [`Cnn`]: `convs.{i}.weight` `[out, in, 3, 3]` and `convs.{i}.bias`; `norms.{i}.weight`,
//!   `.bias`, `.running_mean`, `.running_var` (`[channels]`; `norms.{i}.num_batches_tracked`,
//!   which PyTorch also writes, is accepted and not used: the momentum is fixed at 0.1);
//!   `head.weight` `[classes, features]` and `head.bias`.
//! - [`Gpt`]: nanoGPT's `state_dict` names and shapes, listed in the [`gpt`](crate::gpt)
//!   module's documentation (`Gpt::{load_safetensors, save_safetensors}` read and write them
//!   through this module too).
//!
//! Tensors may be F32 or F64 (converted to f32); files are written as F32.
//!
//! ```
//! use burn::tensor::Device;
//! use localsgd_models::pytorch::{load_pytorch_safetensors, save_pytorch_safetensors};
//! use localsgd_models::network::{Network, ModelSpec};
//! use localsgd_models::mlp::MlpConfig;
//!
//! let device = Device::flex();
//! let spec = ModelSpec::Mlp(MlpConfig { input: 4, hidden: vec![3], classes: 2 });
//! let model = spec.init(1, &device).unwrap();
//! let dir = std::env::temp_dir().join(format!("localsgd-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("init.safetensors");
//! save_pytorch_safetensors(&model, &path).unwrap();
//! let Network::Mlp(loaded) = load_pytorch_safetensors(&path, &spec, &device).unwrap() else {
//!     unreachable!()
//! };
//! assert_eq!(loaded.widths(), vec![4, 3, 2]);
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```

pub(crate) mod format;

use std::collections::BTreeSet;
use std::path::Path;

use burn::module::Module;
use burn::nn::Relu;
use burn::tensor::Device;

use crate::batch_norm::BatchNorm2d;
use crate::cnn::{Cnn, CnnConfig, conv_from_pytorch};
use crate::gpt::{Gpt, GptError};
use crate::mlp::{Mlp, MlpConfig, ModelError, linear_from_pytorch};
use crate::network::{ModelSpec, Network};

pub use format::{NamedTensor, WeightsError};
use format::{parse, push_linear, read_file, to_f32_vec, write};

/// Loads a model shaped like `spec` from the safetensors file at `path`.
pub fn load_pytorch_safetensors(
    path: &Path,
    spec: &ModelSpec,
    device: &Device,
) -> Result<Network, WeightsError> {
    load_pytorch_safetensors_bytes(&read_file(path)?, path, spec, device)
}

/// Like [`load_pytorch_safetensors`] on bytes already in memory; `origin` only names them in
/// errors.
pub fn load_pytorch_safetensors_bytes(
    bytes: &[u8],
    origin: &Path,
    spec: &ModelSpec,
    device: &Device,
) -> Result<Network, WeightsError> {
    spec.validate()?;
    let file = parse(bytes, origin)?;
    let found: BTreeSet<String> = file.names().into_iter().map(str::to_string).collect();
    let (expected, ignored) = tensor_names(spec);
    let extra: Vec<String> = found
        .iter()
        .filter(|n| !expected.contains(*n) && !ignored.contains(*n))
        .cloned()
        .collect();
    if !extra.is_empty() {
        return Err(WeightsError::UnexpectedTensors {
            names: extra,
            expected: expected.into_iter().collect(),
        });
    }
    let read = |name: &str, shape: &[usize]| format::read_f32(&file, &found, name, shape);
    Ok(match spec {
        ModelSpec::Mlp(config) => Network::Mlp(load_mlp(config, read, device)?),
        ModelSpec::Cnn(config) => Network::Cnn(load_cnn(config, read, device)?),
        ModelSpec::Gpt(config) => Network::Gpt(
            Gpt::from_safetensors_bytes(bytes, origin, config, device).map_err(|e| match e {
                GptError::Weights(e) => e,
                other => ModelError::Gpt(other.to_string()).into(),
            })?,
        ),
    })
}

/// The tensor names `spec` takes, and those it accepts without using.
fn tensor_names(spec: &ModelSpec) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut ignored = BTreeSet::new();
    match spec {
        ModelSpec::Mlp(config) => {
            for k in 1..config.widths().len() {
                names.extend([format!("fc{k}.weight"), format!("fc{k}.bias")]);
            }
        }
        ModelSpec::Cnn(config) => {
            for i in 0..config.channels.len() {
                names.extend([format!("convs.{i}.weight"), format!("convs.{i}.bias")]);
                for part in ["weight", "bias", "running_mean", "running_var"] {
                    names.insert(format!("norms.{i}.{part}"));
                }
                ignored.insert(format!("norms.{i}.num_batches_tracked"));
            }
            names.extend(["head.weight".to_string(), "head.bias".to_string()]);
        }
        ModelSpec::Gpt(config) => {
            names.extend(config.pytorch_layout().into_iter().map(|(name, _)| name));
        }
    }
    (names, ignored)
}

fn load_mlp(
    config: &MlpConfig,
    read: impl Fn(&str, &[usize]) -> Result<Vec<f32>, WeightsError>,
    device: &Device,
) -> Result<Mlp, WeightsError> {
    let widths = config.widths();
    let mut model = Mlp {
        layers: Vec::with_capacity(widths.len() - 1),
        activation: Relu::new(),
    };
    for (k, pair) in widths.windows(2).enumerate() {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let weight = read(&format!("fc{}.weight", k + 1), &[fan_out, fan_in])?;
        let bias = read(&format!("fc{}.bias", k + 1), &[fan_out])?;
        model
            .layers
            .push(linear_from_pytorch(&weight, &bias, fan_in, fan_out, device));
    }
    Ok(model)
}

fn load_cnn(
    config: &CnnConfig,
    read: impl Fn(&str, &[usize]) -> Result<Vec<f32>, WeightsError>,
    device: &Device,
) -> Result<Cnn, WeightsError> {
    let mut model = config.init(0, device)?;
    let mut prev = 1;
    for (i, &c) in config.channels.iter().enumerate() {
        let weight = read(&format!("convs.{i}.weight"), &[c, prev, 3, 3])?;
        let bias = read(&format!("convs.{i}.bias"), &[c])?;
        model.convs[i] = conv_from_pytorch(&weight, &bias, prev, c, device);
        let part = |name: &str| read(&format!("norms.{i}.{name}"), &[c]);
        model.norms[i] = BatchNorm2d::from_values(
            &part("weight")?,
            &part("bias")?,
            &part("running_mean")?,
            &part("running_var")?,
            device,
        );
        prev = c;
    }
    let features = config.head_inputs();
    let weight = read("head.weight", &[config.classes, features])?;
    let bias = read("head.bias", &[config.classes])?;
    model.head = linear_from_pytorch(&weight, &bias, features, config.classes, device);
    Ok(model)
}

/// Writes `model` to `path` in its PyTorch layout (module docs), all tensors F32; running
/// statistics are written as they stand after the pending update is applied.
pub fn save_pytorch_safetensors(model: &Network, path: &Path) -> Result<(), WeightsError> {
    let mut tensors: Vec<NamedTensor> = Vec::new();
    match model {
        Network::Gpt(gpt) => {
            tensors = gpt.to_named_tensors().map_err(|e| match e {
                GptError::Weights(e) => e,
                other => WeightsError::TensorData(other.to_string()),
            })?;
        }
        Network::Mlp(mlp) => {
            for (k, layer) in mlp.layers.iter().enumerate() {
                push_linear(&mut tensors, &format!("fc{}", k + 1), layer)?;
            }
        }
        Network::Cnn(cnn) => {
            let cnn = cnn.valid();
            for (i, conv) in cnn.convs.iter().enumerate() {
                let name = format!("convs.{i}");
                let dims: [usize; 4] = conv.weight.shape().dims();
                let bias = conv
                    .bias
                    .as_ref()
                    .ok_or_else(|| WeightsError::MissingBias {
                        layer: name.clone(),
                    })?;
                let weight = to_f32_vec(conv.weight.val())?;
                tensors.push((format!("{name}.weight"), dims.to_vec(), weight));
                tensors.push((
                    format!("{name}.bias"),
                    vec![dims[0]],
                    to_f32_vec(bias.val())?,
                ));
            }
            for (i, norm) in cnn.norms.iter().enumerate() {
                let parts = [
                    ("weight", norm.gamma.val()),
                    ("bias", norm.beta.val()),
                    ("running_mean", norm.running_mean.value()),
                    ("running_var", norm.running_var.value()),
                ];
                for (part, t) in parts {
                    let values = to_f32_vec(t)?;
                    tensors.push((format!("norms.{i}.{part}"), vec![values.len()], values));
                }
            }
            push_linear(&mut tensors, "head", &cnn.head)?;
        }
    }
    write(path, &tensors)
}
