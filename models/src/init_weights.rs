//! Loading a model's initial weights from, and saving them to, a PyTorch-style safetensors
//! file: what `safetensors.torch.save_file(model.state_dict())` writes for the PyTorch twin.
//!
//! - [`Mlp`]: layer `k` (0-based) is `fc{k+1}.weight` with PyTorch's shape `[out, in]` and
//!   `fc{k+1}.bias` `[out]`, a module whose Linear layers are named `fc1`, `fc2`, ... Linear
//!   weights are transposed to and from burn's `[in, out]` layout.
//! - [`Cnn`]: `convs.{i}.weight` `[out, in, 3, 3]` and `convs.{i}.bias`; `norms.{i}.weight`,
//!   `.bias`, `.running_mean`, `.running_var` (`[channels]`; `norms.{i}.num_batches_tracked`,
//!   which PyTorch also writes, is accepted and not used: the momentum is fixed at 0.1);
//!   `head.weight` `[classes, features]` and `head.bias`.
//!
//! Tensors may be F32 or F64 (converted to f32).
//!
//! ```
//! use burn::tensor::Device;
//! use localsgd_models::init_weights::{load_pytorch_safetensors, save_pytorch_safetensors};
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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::nn::Relu;
use burn::tensor::{Device, Tensor};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::batch_norm::BatchNorm2d;
use crate::cnn::{Cnn, CnnConfig, conv_from_pytorch};
use crate::gpt::{Gpt, GptError};
use crate::mlp::{Mlp, MlpConfig, ModelError, linear_from_pytorch};
use crate::network::{ModelSpec, Network};

/// Everything that can go wrong loading or saving PyTorch safetensors weights.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitWeightsError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid safetensors file (or could not be serialized).
    #[error("{path}: invalid safetensors data: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// The safetensors error.
        #[source]
        source: safetensors::SafeTensorError,
    },
    /// The configuration the weights are checked against is invalid.
    #[error(transparent)]
    Config(#[from] ModelError),
    /// A tensor the configuration needs is absent.
    #[error("missing tensor {name:?} (expected shape {expected:?}); file has {found:?}")]
    MissingTensor {
        /// The missing name.
        name: String,
        /// The shape it should have.
        expected: Vec<usize>,
        /// Every tensor name in the file, sorted.
        found: Vec<String>,
    },
    /// The file holds tensors the configuration has no place for.
    #[error("unexpected tensors {names:?}; the model takes exactly {expected:?}")]
    UnexpectedTensors {
        /// The extra names, sorted.
        names: Vec<String>,
        /// Every name the model takes, sorted.
        expected: Vec<String>,
    },
    /// A tensor's shape disagrees with the configuration.
    #[error("tensor {name:?}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        /// The tensor.
        name: String,
        /// The shape the configuration implies (PyTorch layout).
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor has a dtype other than F32 or F64.
    #[error("tensor {name:?}: dtype {found:?} is not supported; expected F32 or F64")]
    UnsupportedDtype {
        /// The tensor.
        name: String,
        /// Its dtype in the file.
        found: Dtype,
    },
    /// A model tensor's values could not be read back as f32.
    #[error("cannot read model tensor values: {0}")]
    TensorData(String),
    /// A layer of the model to save has no bias (the layout requires one per layer).
    #[error("layer {layer:?} has no bias; the PyTorch layout needs a bias for every layer")]
    MissingBias {
        /// The layer's PyTorch name.
        layer: String,
    },
}

/// Loads a model shaped like `spec` from the safetensors file at `path`.
pub fn load_pytorch_safetensors(
    path: &Path,
    spec: &ModelSpec,
    device: &Device,
) -> Result<Network, InitWeightsError> {
    let bytes = std::fs::read(path).map_err(|source| InitWeightsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    load_pytorch_safetensors_bytes(&bytes, path, spec, device)
}

/// Like [`load_pytorch_safetensors`] on bytes already in memory; `origin` only names them in
/// errors.
pub fn load_pytorch_safetensors_bytes(
    bytes: &[u8],
    origin: &Path,
    spec: &ModelSpec,
    device: &Device,
) -> Result<Network, InitWeightsError> {
    spec.validate()?;
    let file = SafeTensors::deserialize(bytes).map_err(|source| InitWeightsError::Format {
        path: origin.to_path_buf(),
        source,
    })?;
    let found: BTreeSet<String> = file.names().into_iter().map(str::to_string).collect();
    let (expected, ignored) = tensor_names(spec);
    let extra: Vec<String> = found
        .iter()
        .filter(|n| !expected.contains(*n) && !ignored.contains(*n))
        .cloned()
        .collect();
    if !extra.is_empty() {
        return Err(InitWeightsError::UnexpectedTensors {
            names: extra,
            expected: expected.into_iter().collect(),
        });
    }
    let read = |name: &str, shape: &[usize]| read_f32(&file, &found, name, shape);
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
    read: impl Fn(&str, &[usize]) -> Result<Vec<f32>, InitWeightsError>,
    device: &Device,
) -> Result<Mlp, InitWeightsError> {
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
    read: impl Fn(&str, &[usize]) -> Result<Vec<f32>, InitWeightsError>,
    device: &Device,
) -> Result<Cnn, InitWeightsError> {
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

/// The values of tensor `name`, checked against `expected` shape and converted to f32.
fn read_f32(
    file: &SafeTensors<'_>,
    found: &BTreeSet<String>,
    name: &str,
    expected: &[usize],
) -> Result<Vec<f32>, InitWeightsError> {
    let missing = || InitWeightsError::MissingTensor {
        name: name.to_string(),
        expected: expected.to_vec(),
        found: found.iter().cloned().collect(),
    };
    let view: TensorView<'_> = file.tensor(name).map_err(|_| missing())?;
    if view.shape() != expected {
        return Err(InitWeightsError::ShapeMismatch {
            name: name.to_string(),
            expected: expected.to_vec(),
            found: view.shape().to_vec(),
        });
    }
    let data = view.data();
    match view.dtype() {
        Dtype::F32 => Ok(data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()),
        Dtype::F64 => Ok(data
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
            .collect()),
        other => Err(InitWeightsError::UnsupportedDtype {
            name: name.to_string(),
            found: other,
        }),
    }
}

/// Writes `model` to `path` in its PyTorch layout (module docs), all tensors F32; running
/// statistics are written as they stand after the pending update is applied.
pub fn save_pytorch_safetensors(model: &Network, path: &Path) -> Result<(), InitWeightsError> {
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    match model {
        Network::Gpt(gpt) => {
            let named = gpt.to_named_tensors().map_err(|e| match e {
                GptError::Weights(e) => e,
                other => InitWeightsError::TensorData(other.to_string()),
            })?;
            for (name, shape, values) in named {
                tensors.push((name, shape, le_bytes(&values)));
            }
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
                    .ok_or_else(|| InitWeightsError::MissingBias {
                        layer: name.clone(),
                    })?;
                tensors.push((
                    format!("{name}.weight"),
                    dims.to_vec(),
                    le_bytes(&to_f32_vec(conv.weight.val())?),
                ));
                tensors.push((
                    format!("{name}.bias"),
                    vec![dims[0]],
                    le_bytes(&to_f32_vec(bias.val())?),
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
                    tensors.push((
                        format!("norms.{i}.{part}"),
                        vec![values.len()],
                        le_bytes(&values),
                    ));
                }
            }
            push_linear(&mut tensors, "head", &cnn.head)?;
        }
    }
    let format_err = |source| InitWeightsError::Format {
        path: path.to_path_buf(),
        source,
    };
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes).map(|view| (name.as_str(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(format_err)?;
    let bytes = safetensors::serialize(views, None).map_err(format_err)?;
    localsgd_pipeline::atomic::write_atomic(path, bytes).map_err(|source| InitWeightsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A Linear layer as `{name}.weight` (`[out, in]`) and `{name}.bias`.
fn push_linear(
    tensors: &mut Vec<(String, Vec<usize>, Vec<u8>)>,
    name: &str,
    layer: &burn::nn::Linear,
) -> Result<(), InitWeightsError> {
    let [fan_in, fan_out] = layer.weight.shape().dims();
    let w_in_out = to_f32_vec(layer.weight.val())?;
    let mut w_out_in = vec![0.0f32; fan_in * fan_out];
    for i in 0..fan_in {
        for o in 0..fan_out {
            w_out_in[o * fan_in + i] = w_in_out[i * fan_out + o];
        }
    }
    let bias = layer
        .bias
        .as_ref()
        .ok_or_else(|| InitWeightsError::MissingBias {
            layer: name.to_string(),
        })?;
    tensors.push((
        format!("{name}.weight"),
        vec![fan_out, fan_in],
        le_bytes(&w_out_in),
    ));
    tensors.push((
        format!("{name}.bias"),
        vec![fan_out],
        le_bytes(&to_f32_vec(bias.val())?),
    ));
    Ok(())
}

/// A float tensor's values as f32, row-major.
fn to_f32_vec<const D: usize>(tensor: Tensor<D>) -> Result<Vec<f32>, InitWeightsError> {
    tensor
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| InitWeightsError::TensorData(format!("{e:?}")))
}

/// f32 values as little-endian bytes.
fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}
