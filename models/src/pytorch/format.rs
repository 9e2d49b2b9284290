//! The safetensors side of PyTorch weights, shared by every model: the error type, tensors as
//! (PyTorch name, PyTorch shape, row-major f32 values), reading them out of a file (F32 or F64)
//! and writing them (F32, atomically), and the Linear and LayerNorm layouts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::nn::{LayerNorm, Linear};
use burn::tensor::Tensor;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::mlp::ModelError;

/// A tensor as PyTorch names and lays it out: (name, shape, row-major f32 values).
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// Everything that can go wrong loading or saving PyTorch safetensors weights.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
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

/// The safetensors file in `bytes` (`origin` names it in errors).
pub(crate) fn parse<'a>(bytes: &'a [u8], origin: &Path) -> Result<SafeTensors<'a>, WeightsError> {
    SafeTensors::deserialize(bytes).map_err(|source| WeightsError::Format {
        path: origin.to_path_buf(),
        source,
    })
}

/// The bytes of the file at `path`.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, WeightsError> {
    std::fs::read(path).map_err(|source| WeightsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Every tensor of `file`, its values converted to f32.
pub(crate) fn all_tensors(file: &SafeTensors<'_>) -> Result<Vec<NamedTensor>, WeightsError> {
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = view_to_f32(&name, &view)?;
            Ok((name, view.shape().to_vec(), values))
        })
        .collect()
}

/// The values of tensor `name`, checked against the `expected` shape and converted to f32;
/// `found` (every name in the file) goes into the error where `name` is missing.
pub(crate) fn read_f32(
    file: &SafeTensors<'_>,
    found: &BTreeSet<String>,
    name: &str,
    expected: &[usize],
) -> Result<Vec<f32>, WeightsError> {
    let missing = || WeightsError::MissingTensor {
        name: name.to_string(),
        expected: expected.to_vec(),
        found: found.iter().cloned().collect(),
    };
    let view: TensorView<'_> = file.tensor(name).map_err(|_| missing())?;
    if view.shape() != expected {
        return Err(WeightsError::ShapeMismatch {
            name: name.to_string(),
            expected: expected.to_vec(),
            found: view.shape().to_vec(),
        });
    }
    view_to_f32(name, &view)
}

/// A safetensors tensor's values as f32 (F32 or F64).
fn view_to_f32(name: &str, view: &TensorView<'_>) -> Result<Vec<f32>, WeightsError> {
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
        other => Err(WeightsError::UnsupportedDtype {
            name: name.to_string(),
            found: other,
        }),
    }
}

/// Writes `tensors` to `path` as F32 safetensors, atomically (whole or not at all).
pub(crate) fn write(path: &Path, tensors: &[NamedTensor]) -> Result<(), WeightsError> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let format_err = |source| WeightsError::Format {
        path: path.to_path_buf(),
        source,
    };
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            TensorView::new(Dtype::F32, shape.clone(), b).map(|view| (name.as_str(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(format_err)?;
    let out = safetensors::serialize(views, None).map_err(format_err)?;
    localsgd_pipeline::atomic::write_atomic(path, out).map_err(|source| WeightsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A Linear layer as `{name}.weight` (`[out, in]`: burn's `[in, out]` transposed) and
/// `{name}.bias` (`[out]`).
pub(crate) fn push_linear(
    out: &mut Vec<NamedTensor>,
    name: &str,
    layer: &Linear,
) -> Result<(), WeightsError> {
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
        .ok_or_else(|| WeightsError::MissingBias {
            layer: name.to_string(),
        })?;
    out.push((format!("{name}.weight"), vec![fan_out, fan_in], w_out_in));
    out.push((
        format!("{name}.bias"),
        vec![fan_out],
        to_f32_vec(bias.val())?,
    ));
    Ok(())
}

/// A LayerNorm as `{name}.weight` and `{name}.bias` (`[d]`).
pub(crate) fn push_norm(
    out: &mut Vec<NamedTensor>,
    name: &str,
    ln: &LayerNorm,
) -> Result<(), WeightsError> {
    let weight = to_f32_vec(ln.gamma.val())?;
    let beta = ln.beta.as_ref().ok_or_else(|| WeightsError::MissingBias {
        layer: name.to_string(),
    })?;
    let bias = to_f32_vec(beta.val())?;
    out.push((format!("{name}.weight"), vec![weight.len()], weight));
    out.push((format!("{name}.bias"), vec![bias.len()], bias));
    Ok(())
}

/// A float tensor's values as f32, row-major.
pub(crate) fn to_f32_vec<const D: usize>(tensor: Tensor<D>) -> Result<Vec<f32>, WeightsError> {
    tensor
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| WeightsError::TensorData(format!("{e:?}")))
}
