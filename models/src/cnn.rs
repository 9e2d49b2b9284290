//! A small convolutional classifier with batch normalization for square gray-scale images
//! (28x28 IDX data such as Fashion-MNIST, the bundled 8x8 digits), laid out and initialised as
//! its PyTorch twin:
//!
//! ```text
//! for each c in channels: Conv2d(prev, c, 3, padding=1) -> BatchNorm2d(c) -> ReLU -> MaxPool2d(2)
//! Flatten -> Linear(channels[-1] * (side / 2^len)^2, classes)
//! ```
//!
//! PyTorch's module names are `convs.{i}`, `norms.{i}` and `head` (see
//! [`crate::pytorch`]). Conv and Linear weights and biases are drawn as PyTorch's defaults
//! (uniform in `±1/sqrt(fan_in)`, `fan_in` = in-channels x 3 x 3 for a conv), from ChaCha8
//! seeded with the run's seed, layer by layer, weight then bias, in PyTorch's row-major order.
//!
//! ```
//! use burn::tensor::{Device, Tensor};
//! use localsgd_models::cnn::CnnConfig;
//!
//! let device = Device::flex();
//! let config = CnnConfig { side: 28, channels: vec![8, 16], classes: 10 };
//! assert_eq!(config.num_params(), 80 + 16 + 1168 + 32 + 7850);
//! let model = config.init(7, &device).unwrap();
//! let logits = model.forward(Tensor::<2>::zeros([3, 784], &device));
//! assert_eq!(logits.dims(), [3, 10]);
//! ```

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, PaddingConfig2d, Relu};
use burn::tensor::ops::MaxPoolOptions;
use burn::tensor::{Device, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::batch_norm::BatchNorm2d;
use crate::mlp::{ModelError, linear_from_pytorch, uniform};

/// The shape of a [`Cnn`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CnnConfig {
    /// Side of the square input image (the input has `side * side` features).
    pub side: usize,
    /// Output channels of each conv block; each block halves the image side.
    pub channels: Vec<usize>,
    /// Number of output logits (classes).
    pub classes: usize,
}

/// A stack of conv blocks (conv 3x3, batch norm, ReLU, 2x2 max pooling) and a Linear head.
#[derive(Module, Debug)]
pub struct Cnn {
    /// The 3x3 convolutions (padding 1), input side first.
    pub convs: Vec<Conv2d>,
    /// One batch normalization after each convolution.
    pub norms: Vec<BatchNorm2d>,
    /// The Linear classifier over the flattened last block.
    pub head: Linear,
    /// The activation after each batch normalization.
    pub activation: Relu,
    /// The input image side.
    pub side: usize,
}

impl CnnConfig {
    /// The config for inputs of `features` values (`side * side`).
    pub fn for_features(
        features: usize,
        channels: Vec<usize>,
        classes: usize,
    ) -> Result<Self, ModelError> {
        let side = features.isqrt();
        if side * side != features {
            return Err(ModelError::NotSquare { features });
        }
        let config = Self {
            side,
            channels,
            classes,
        };
        config.validate()?;
        Ok(config)
    }

    /// Side of the image after the last block.
    pub fn final_side(&self) -> usize {
        self.side >> self.channels.len()
    }

    /// Inputs of the Linear head.
    pub fn head_inputs(&self) -> usize {
        self.channels.last().copied().unwrap_or(1) * self.final_side() * self.final_side()
    }

    /// Number of learnable parameters (conv weights and biases, batch-norm scales and shifts,
    /// the head); the running statistics are not counted.
    pub fn num_params(&self) -> u64 {
        let mut prev = 1u64;
        let mut n = 0u64;
        for &c in &self.channels {
            let c = c as u64;
            n += c * prev * 9 + c + 2 * c;
            prev = c;
        }
        n + (self.head_inputs() as u64 + 1) * self.classes as u64
    }

    /// Checks the shape: at least one block, positive channels and classes, a side that every
    /// block can halve.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.channels.is_empty() || self.channels.contains(&0) || self.classes == 0 {
            return Err(ModelError::Channels {
                channels: self.channels.clone(),
                classes: self.classes,
            });
        }
        let blocks = self.channels.len();
        if blocks >= usize::BITS as usize
            || !self.side.is_multiple_of(1 << blocks)
            || self.side == 0
        {
            return Err(ModelError::SideNotDivisible {
                side: self.side,
                blocks,
            });
        }
        Ok(())
    }

    /// Builds the model with PyTorch's default initialization drawn from ChaCha8 seeded with
    /// `seed` (module docs). Same seed, same model, on any rank.
    pub fn init(&self, seed: u64, device: &Device) -> Result<Cnn, ModelError> {
        self.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut draw = |n: usize, fan_in: usize| -> Vec<f32> {
            let bound = 1.0 / (fan_in as f64).sqrt();
            (0..n).map(|_| uniform(&mut rng, bound)).collect()
        };
        let mut convs = Vec::with_capacity(self.channels.len());
        let mut norms = Vec::with_capacity(self.channels.len());
        let mut prev = 1;
        for &c in &self.channels {
            let weight = draw(c * prev * 9, prev * 9);
            let bias = draw(c, prev * 9);
            convs.push(conv_from_pytorch(&weight, &bias, prev, c, device));
            norms.push(BatchNorm2d::new(c, device));
            prev = c;
        }
        let features = self.head_inputs();
        let weight = draw(self.classes * features, features);
        let bias = draw(self.classes, features);
        Ok(Cnn {
            convs,
            norms,
            head: linear_from_pytorch(&weight, &bias, features, self.classes, device),
            activation: Relu::new(),
            side: self.side,
        })
    }
}

impl Cnn {
    /// Logits `[batch, classes]` for flattened images `[batch, side * side]` (row-major).
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let [batch, _] = x.dims();
        let mut h = x.reshape([batch, 1, self.side, self.side]);
        for (conv, norm) in self.convs.iter().zip(&self.norms) {
            h = self.activation.forward(norm.forward(conv.forward(h)));
            h = burn::tensor::module::max_pool2d(h, MaxPoolOptions::new([2, 2]));
        }
        let [batch, c, height, width] = h.dims();
        self.head.forward(h.reshape([batch, c * height * width]))
    }

    /// The shape of this model, read from its layers.
    pub fn config(&self) -> CnnConfig {
        CnnConfig {
            side: self.side,
            channels: self
                .convs
                .iter()
                .map(|c| c.weight.shape().dims::<4>()[0])
                .collect(),
            classes: self.head.weight.shape().dims::<2>()[1],
        }
    }
}

/// A 3x3, padding-1 burn Conv2d from a PyTorch-layout weight (`[out, in, 3, 3]`, row-major,
/// the same layout burn uses) and bias (`[out]`).
pub(crate) fn conv_from_pytorch(
    weight: &[f32],
    bias: &[f32],
    channels_in: usize,
    channels_out: usize,
    device: &Device,
) -> Conv2d {
    let mut conv = Conv2dConfig::new([channels_in, channels_out], [3, 3])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .init(device);
    conv.weight = Param::from_tensor(Tensor::<4>::from_data(
        TensorData::new(weight.to_vec(), [channels_out, channels_in, 3, 3]),
        device,
    ));
    conv.bias = Some(Param::from_tensor(Tensor::<1>::from_data(
        TensorData::new(bias.to_vec(), [channels_out]),
        device,
    )));
    conv
}
