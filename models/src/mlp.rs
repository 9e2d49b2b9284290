//! The multi-layer perceptron trained by the pipeline, with PyTorch's `nn.Linear` default
//! initialization drawn from a seeded ChaCha generator, so every rank builds the same initial
//! model from the same seed.
//!
//! ```
//! use burn::tensor::{Device, Tensor};
//! use localsgd_models::mlp::MlpConfig;
//!
//! let device = Device::flex();
//! let config = MlpConfig { input: 64, hidden: vec![32], classes: 10 };
//! let model = config.init(7, &device).unwrap();
//! let logits = model.forward(Tensor::<2>::zeros([5, 64], &device));
//! assert_eq!(logits.dims(), [5, 10]);
//! ```

use burn::module::{Module, Param};
use burn::nn::{Linear, Relu};
use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The layer widths of an [`Mlp`]: `input -> hidden[0] -> ... -> classes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlpConfig {
    /// Number of input features.
    pub input: usize,
    /// Widths of the hidden layers, in order (may be empty: a linear classifier).
    pub hidden: Vec<usize>,
    /// Number of output logits (classes).
    pub classes: usize,
}

/// An invalid [`MlpConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A layer width is zero.
    #[error("MLP widths {widths:?}: width {position} is 0; every width must be at least 1")]
    ZeroWidth {
        /// All widths, input first.
        widths: Vec<usize>,
        /// Position of the zero in `widths`.
        position: usize,
    },
    /// The CNN needs square images and the input is not `side * side` features.
    #[error(
        "model `cnn` needs square images: {features} input features is not side x side (e.g. 784 = 28 x 28, 64 = 8 x 8); use model `mlp` for this data"
    )]
    NotSquare {
        /// Number of input features.
        features: usize,
    },
    /// The CNN's channel list or class count is empty or zero.
    #[error(
        "model `cnn`: channels {channels:?} and {classes} classes; expected at least one block of positive channels, e.g. [8, 16], and at least one class"
    )]
    Channels {
        /// The channels given.
        channels: Vec<usize>,
        /// The classes.
        classes: usize,
    },
    /// The GPT's sizes do not work (the message names the setting and what is valid).
    #[error("{0}")]
    Gpt(String),
    /// The image side cannot be halved by every block.
    #[error(
        "model `cnn`: an image side of {side} cannot be halved by {blocks} pooling blocks; the side must be a multiple of 2^{blocks} (use fewer `channels`)"
    )]
    SideNotDivisible {
        /// The image side.
        side: usize,
        /// Number of conv blocks.
        blocks: usize,
    },
}

/// A multi-layer perceptron: Linear layers with ReLU between them (none after the last).
#[derive(Module, Debug)]
pub struct Mlp {
    /// The Linear layers, input side first. burn stores each weight as `[in, out]`.
    pub layers: Vec<Linear>,
    /// The activation applied between layers.
    pub activation: Relu,
}

impl MlpConfig {
    /// All widths, `[input, hidden..., classes]`.
    pub fn widths(&self) -> Vec<usize> {
        let mut widths = Vec::with_capacity(self.hidden.len() + 2);
        widths.push(self.input);
        widths.extend(&self.hidden);
        widths.push(self.classes);
        widths
    }

    /// Number of parameters (weights and biases of every layer).
    pub fn num_params(&self) -> u64 {
        self.widths()
            .windows(2)
            .map(|w| (w[0] as u64 + 1) * w[1] as u64)
            .sum()
    }

    /// Checks that every width is positive.
    pub fn validate(&self) -> Result<(), ModelError> {
        let widths = self.widths();
        match widths.iter().position(|&w| w == 0) {
            Some(position) => Err(ModelError::ZeroWidth { widths, position }),
            None => Ok(()),
        }
    }

    /// Builds the model with PyTorch's `nn.Linear` default initialization: weight and bias of a
    /// layer with `fan_in` inputs are uniform in `[-1/sqrt(fan_in), 1/sqrt(fan_in)]`
    /// (kaiming_uniform with `a = sqrt(5)`).
    ///
    /// The values come from ChaCha8 seeded with `seed`, drawn layer by layer, each weight in
    /// PyTorch's `[out, in]` row-major order, then its bias. Same seed, same model, on any rank.
    pub fn init(&self, seed: u64, device: &Device) -> Result<Mlp, ModelError> {
        self.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let widths = self.widths();
        let layers = widths
            .windows(2)
            .map(|pair| {
                let (fan_in, fan_out) = (pair[0], pair[1]);
                let bound = 1.0 / (fan_in as f64).sqrt();
                let weight_out_in: Vec<f32> = (0..fan_in * fan_out)
                    .map(|_| uniform(&mut rng, bound))
                    .collect();
                let bias: Vec<f32> = (0..fan_out).map(|_| uniform(&mut rng, bound)).collect();
                linear_from_pytorch(&weight_out_in, &bias, fan_in, fan_out, device)
            })
            .collect();
        Ok(Mlp {
            layers,
            activation: Relu::new(),
        })
    }
}

impl Mlp {
    /// Logits `[batch, classes]` for inputs `[batch, input]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len().saturating_sub(1);
        self.layers.iter().enumerate().fold(x, |h, (i, layer)| {
            let h = layer.forward(h);
            if i < last {
                self.activation.forward(h)
            } else {
                h
            }
        })
    }

    /// The widths `[input, hidden..., classes]`, read from the layers' weight shapes.
    pub fn widths(&self) -> Vec<usize> {
        let mut widths = Vec::with_capacity(self.layers.len() + 1);
        for (i, layer) in self.layers.iter().enumerate() {
            let [fan_in, fan_out] = layer.weight.shape().dims();
            if i == 0 {
                widths.push(fan_in);
            }
            widths.push(fan_out);
        }
        widths
    }
}

/// A burn Linear from a PyTorch-layout weight (`[out, in]`, row-major) and bias (`[out]`).
pub(crate) fn linear_from_pytorch(
    weight_out_in: &[f32],
    bias: &[f32],
    fan_in: usize,
    fan_out: usize,
    device: &Device,
) -> Linear {
    // burn's Linear weight is [in, out]: element (i, o) = PyTorch's (o, i).
    let mut weight_in_out = vec![0.0f32; fan_in * fan_out];
    for o in 0..fan_out {
        for i in 0..fan_in {
            weight_in_out[i * fan_out + o] = weight_out_in[o * fan_in + i];
        }
    }
    let weight = Tensor::<2>::from_data(TensorData::new(weight_in_out, [fan_in, fan_out]), device);
    let bias = Tensor::<1>::from_data(TensorData::new(bias.to_vec(), [fan_out]), device);
    Linear {
        weight: Param::from_tensor(weight),
        bias: Some(Param::from_tensor(bias)),
    }
}

/// One draw from `U(-bound, bound)` (`u * (to - from) + from`, as torch's `uniform_`), in f32.
pub(crate) fn uniform(rng: &mut ChaCha8Rng, bound: f64) -> f32 {
    let u: f64 = rng.random();
    (u * 2.0 * bound - bound) as f32
}
