//! The models the binary trains, behind one type [`Network`]: the [`Mlp`] (setting
//! `model = "mlp"`, the default), the [`Cnn`] with batch normalization (`model = "cnn"`) and the
//! byte-level language model [`Gpt`] (`model = "gpt"`); the [`Classify`] trait of the
//! classifiers, and the [`Objective`] (loss and evaluation of a batch) the loop uses.
//!
//! ```
//! use burn::tensor::{Device, Tensor};
//! use localsgd_models::network::{Classify, ModelSpec, Network};
//! use localsgd_models::cnn::CnnConfig;
//!
//! let device = Device::flex();
//! let spec = ModelSpec::Cnn(CnnConfig { side: 8, channels: vec![4], classes: 10 });
//! let Network::Cnn(model) = spec.init(3, &device).unwrap() else { unreachable!() };
//! assert_eq!(model.logits(Tensor::<2>::zeros([2, 64], &device)).dims(), [2, 10]);
//! ```

use burn::module::Module;
use burn::nn::loss::CrossEntropyLoss;
use burn::tensor::{Device, Int, Tensor};

use crate::cnn::{Cnn, CnnConfig};
use crate::gpt::{Gpt, GptConfig};
use crate::mlp::{Mlp, MlpConfig, ModelError};

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

/// What one batch's evaluation counts: summed loss over its predictions, the right ones, and how
/// many there are (samples for a classifier, predicted bytes for a language model).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BatchEval {
    /// Sum of the per-prediction cross-entropies, in nats (computed in f64 from f32 logits).
    pub loss_sum: f64,
    /// Predictions whose most likely class (first maximum) is the right one.
    pub correct: u64,
    /// Predictions made.
    pub count: u64,
}

/// How the loop trains and evaluates a model: the mean loss of a batch of rows
/// `(features [B, F], labels [B])`, and one batch's evaluation counts. Every [`Classify`] model
/// has it (cross-entropy of the logits); the [`Gpt`] reads each row as a window of bytes and
/// predicts every byte after the first.
pub trait Objective: Module {
    /// The mean loss of a batch (PyTorch's `CrossEntropyLoss()` default: mean over predictions).
    fn batch_loss(&self, x: Tensor<2>, y: Tensor<1, Int>) -> Tensor<1>;

    /// The evaluation counts of a batch whose labels are `labels` (call on `valid()`).
    fn batch_eval(&self, x: Tensor<2>, labels: &[u32]) -> Result<BatchEval, String>;
}

/// The mean loss of a model on a batch: cross-entropy of a classifier's logits (PyTorch's
/// `CrossEntropyLoss()` default), or a language model's mean next-byte cross-entropy.
pub fn loss<M: Objective>(model: &M, batch: &(Tensor<2>, Tensor<1, Int>)) -> Tensor<1> {
    let (x, y) = batch;
    model.batch_loss(x.clone(), y.clone())
}

impl<M: Classify> Objective for M {
    fn batch_loss(&self, x: Tensor<2>, y: Tensor<1, Int>) -> Tensor<1> {
        let logits = self.logits(x);
        CrossEntropyLoss::new(None, &logits.device()).forward(logits, y)
    }

    fn batch_eval(&self, x: Tensor<2>, labels: &[u32]) -> Result<BatchEval, String> {
        let logits = self.logits(x);
        let classes = logits.dims()[1];
        let values: Vec<f32> = logits
            .into_data()
            .try_into_vec()
            .map_err(|e| format!("{e:?}"))?;
        let mut eval = BatchEval::default();
        for (row, &label) in values.chunks(classes).zip(labels) {
            let label = label as usize;
            let mut best = 0;
            for c in 1..classes {
                if row[c] > row[best] {
                    best = c;
                }
            }
            if best == label {
                eval.correct += 1;
            }
            // -log softmax(row)[label], shifted by the row's maximum for stability.
            let max = f64::from(row[best]);
            let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            let picked = row.get(label).map_or(f64::NAN, |&v| f64::from(v));
            eval.loss_sum += max + sum.ln() - picked;
            eval.count += 1;
        }
        Ok(eval)
    }
}

/// The shape of a [`Network`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// A multi-layer perceptron.
    Mlp(MlpConfig),
    /// A CNN with batch normalization.
    Cnn(CnnConfig),
    /// A byte-level GPT-style language model.
    Gpt(GptConfig),
}

/// One of the binary's models.
// One value per rank, built once: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Network {
    /// A multi-layer perceptron.
    Mlp(Mlp),
    /// A CNN with batch normalization.
    Cnn(Cnn),
    /// A byte-level GPT-style language model.
    Gpt(Gpt),
}

impl ModelSpec {
    /// Builds the model with its initialization from `seed` (PyTorch's defaults for the MLP and
    /// the CNN, nanoGPT's for the GPT).
    pub fn init(&self, seed: u64, device: &Device) -> Result<Network, ModelError> {
        Ok(match self {
            ModelSpec::Mlp(c) => Network::Mlp(c.init(seed, device)?),
            ModelSpec::Cnn(c) => Network::Cnn(c.init(seed, device)?),
            ModelSpec::Gpt(c) => Network::Gpt(
                c.init(seed, device)
                    .map_err(|e| ModelError::Gpt(e.to_string()))?,
            ),
        })
    }

    /// Number of learnable parameters.
    pub fn num_params(&self) -> u64 {
        match self {
            ModelSpec::Mlp(c) => c.num_params(),
            ModelSpec::Cnn(c) => c.num_params(),
            ModelSpec::Gpt(c) => c.num_params(),
        }
    }

    /// Checks the shape.
    pub fn validate(&self) -> Result<(), ModelError> {
        match self {
            ModelSpec::Mlp(c) => c.validate(),
            ModelSpec::Cnn(c) => c.validate(),
            ModelSpec::Gpt(c) => c.validate().map_err(|e| ModelError::Gpt(e.to_string())),
        }
    }

    /// Whether the model is a language model (its evaluation counts predicted bytes).
    pub fn is_language_model(&self) -> bool {
        matches!(self, ModelSpec::Gpt(_))
    }
}

impl Objective for Network {
    fn batch_loss(&self, x: Tensor<2>, y: Tensor<1, Int>) -> Tensor<1> {
        match self {
            Network::Mlp(m) => m.batch_loss(x, y),
            Network::Cnn(m) => m.batch_loss(x, y),
            // The text data set's rows are windows of `context + 1` bytes for the model's own
            // `context` (`run::model_config` builds both from the same setting), so the window
            // always fits.
            Network::Gpt(m) => match m.window_loss(x) {
                Ok(loss) => loss,
                Err(e) => unreachable!("a text window longer than the GPT's context: {e}"),
            },
        }
    }

    fn batch_eval(&self, x: Tensor<2>, labels: &[u32]) -> Result<BatchEval, String> {
        match self {
            Network::Mlp(m) => m.batch_eval(x, labels),
            Network::Cnn(m) => m.batch_eval(x, labels),
            Network::Gpt(m) => {
                let e = m.window_eval(x).map_err(|e| e.to_string())?;
                Ok(BatchEval {
                    loss_sum: e.loss_sum,
                    correct: e.correct,
                    count: e.tokens,
                })
            }
        }
    }
}
