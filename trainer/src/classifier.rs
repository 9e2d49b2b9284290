//! The models the binary trains, behind one type: the [`Mlp`] (setting `model = "mlp"`, the
//! default) and the [`Cnn`] with batch normalization (`model = "cnn"`), and the [`Classify`]
//! trait the loss and the evaluation use.
//!
//! ```
//! use burn::tensor::{Device, Tensor};
//! use localsgd_trainer::classifier::{Classify, ModelSpec};
//! use localsgd_trainer::cnn::CnnConfig;
//!
//! let device = Device::flex();
//! let spec = ModelSpec::Cnn(CnnConfig { side: 8, channels: vec![4], classes: 10 });
//! let model = spec.init(3, &device).unwrap();
//! assert_eq!(model.logits(Tensor::<2>::zeros([2, 64], &device)).dims(), [2, 10]);
//! ```

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use crate::cnn::{Cnn, CnnConfig};
use crate::model::{Mlp, MlpConfig, ModelError};

/// A model that maps flattened inputs `[batch, features]` to logits `[batch, classes]`.
pub trait Classify: Module {
    /// The logits of a batch.
    fn logits(&self, x: Tensor<2>) -> Tensor<2>;
}

impl Classify for Mlp {
    fn logits(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward(x)
    }
}

impl Classify for Cnn {
    fn logits(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward(x)
    }
}

/// The shape of a [`Classifier`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// A multi-layer perceptron.
    Mlp(MlpConfig),
    /// A CNN with batch normalization.
    Cnn(CnnConfig),
}

/// One of the binary's models.
#[derive(Module, Debug)]
pub enum Classifier {
    /// A multi-layer perceptron.
    Mlp(Mlp),
    /// A CNN with batch normalization.
    Cnn(Cnn),
}

impl ModelSpec {
    /// Builds the model with PyTorch's default initialization from `seed`.
    pub fn init(&self, seed: u64, device: &Device) -> Result<Classifier, ModelError> {
        Ok(match self {
            ModelSpec::Mlp(c) => Classifier::Mlp(c.init(seed, device)?),
            ModelSpec::Cnn(c) => Classifier::Cnn(c.init(seed, device)?),
        })
    }

    /// Number of learnable parameters.
    pub fn num_params(&self) -> u64 {
        match self {
            ModelSpec::Mlp(c) => c.num_params(),
            ModelSpec::Cnn(c) => c.num_params(),
        }
    }

    /// Checks the shape.
    pub fn validate(&self) -> Result<(), ModelError> {
        match self {
            ModelSpec::Mlp(c) => c.validate(),
            ModelSpec::Cnn(c) => c.validate(),
        }
    }
}

impl Classify for Classifier {
    fn logits(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Classifier::Mlp(m) => m.forward(x),
            Classifier::Cnn(m) => m.forward(x),
        }
    }
}
