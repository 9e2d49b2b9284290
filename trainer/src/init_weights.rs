//! Loading initial [`Mlp`] weights from, and saving them to, a PyTorch-style safetensors file.
//!
//! Layout: layer `k` (0-based) is stored as `fc{k+1}.weight` with PyTorch's shape `[out, in]` and
//! `fc{k+1}.bias` with shape `[out]` — what `safetensors.torch.save_file(model.state_dict())`
//! writes for a module whose Linear layers are named `fc1`, `fc2`, ... Weights are transposed to
//! and from burn's `[in, out]` layout. Tensors may be F32 or F64 (converted to f32).
//!
//! ```
//! use burn::tensor::Device;
//! use localsgd_trainer::init_weights::{load_pytorch_safetensors, save_pytorch_safetensors};
//! use localsgd_trainer::model::MlpConfig;
//!
//! let device = Device::flex();
//! let config = MlpConfig { input: 4, hidden: vec![3], classes: 2 };
//! let model = config.init(1, &device).unwrap();
//! let dir = std::env::temp_dir().join(format!("localsgd-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("init.safetensors");
//! save_pytorch_safetensors(&model, &path).unwrap();
//! let loaded = load_pytorch_safetensors(&path, &config, &device).unwrap();
//! assert_eq!(loaded.widths(), vec![4, 3, 2]);
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::nn::Relu;
use burn::tensor::{Device, Tensor};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::model::{Mlp, MlpConfig, ModelError, linear_from_pytorch};

/// Everything that can go wrong loading or saving PyTorch safetensors weights.
#[derive(Debug, thiserror::Error)]
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
    #[error(
        "unexpected tensors {names:?}; a {layers}-layer MLP takes exactly fc1..fc{layers} weight and bias"
    )]
    UnexpectedTensors {
        /// The extra names, sorted.
        names: Vec<String>,
        /// Number of Linear layers in the configuration.
        layers: usize,
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
    #[error("layer {layer} has no bias; the fcK layout needs a bias for every layer")]
    MissingBias {
        /// 0-based layer index.
        layer: usize,
    },
}

/// Loads an [`Mlp`] shaped like `config` from the safetensors file at `path`.
pub fn load_pytorch_safetensors(
    path: &Path,
    config: &MlpConfig,
    device: &Device,
) -> Result<Mlp, InitWeightsError> {
    let bytes = std::fs::read(path).map_err(|source| InitWeightsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    load_pytorch_safetensors_bytes(&bytes, path, config, device)
}

/// Like [`load_pytorch_safetensors`] on bytes already in memory; `origin` only names them in
/// errors.
pub fn load_pytorch_safetensors_bytes(
    bytes: &[u8],
    origin: &Path,
    config: &MlpConfig,
    device: &Device,
) -> Result<Mlp, InitWeightsError> {
    config.validate()?;
    let file = SafeTensors::deserialize(bytes).map_err(|source| InitWeightsError::Format {
        path: origin.to_path_buf(),
        source,
    })?;
    let widths = config.widths();
    let layers = widths.len() - 1;
    let found: BTreeSet<String> = file.names().into_iter().map(str::to_string).collect();
    let expected: BTreeSet<String> = (1..=layers)
        .flat_map(|k| [format!("fc{k}.weight"), format!("fc{k}.bias")])
        .collect();
    let extra: Vec<String> = found.difference(&expected).cloned().collect();
    if !extra.is_empty() {
        return Err(InitWeightsError::UnexpectedTensors {
            names: extra,
            layers,
        });
    }
    let mut model = Mlp {
        layers: Vec::with_capacity(layers),
        activation: Relu::new(),
    };
    for (k, pair) in widths.windows(2).enumerate() {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let weight = read_f32(
            &file,
            &found,
            &format!("fc{}.weight", k + 1),
            &[fan_out, fan_in],
        )?;
        let bias = read_f32(&file, &found, &format!("fc{}.bias", k + 1), &[fan_out])?;
        model
            .layers
            .push(linear_from_pytorch(&weight, &bias, fan_in, fan_out, device));
    }
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

/// Writes `model` to `path` in the `fcK.weight` (`[out, in]`, F32) / `fcK.bias` layout.
pub fn save_pytorch_safetensors(model: &Mlp, path: &Path) -> Result<(), InitWeightsError> {
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (k, layer) in model.layers.iter().enumerate() {
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
            .ok_or(InitWeightsError::MissingBias { layer: k })?;
        let bias = to_f32_vec(bias.val())?;
        tensors.push((
            format!("fc{}.weight", k + 1),
            vec![fan_out, fan_in],
            le_bytes(&w_out_in),
        ));
        tensors.push((format!("fc{}.bias", k + 1), vec![fan_out], le_bytes(&bias)));
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
    std::fs::write(path, bytes).map_err(|source| InitWeightsError::Io {
        path: path.to_path_buf(),
        source,
    })
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
