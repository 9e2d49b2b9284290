//! A GPT-style decoder-only transformer over bytes (vocabulary 256: any text trains with no
//! tokenizer), laid out and initialised as its PyTorch twin `GPT` in `scripts/gpt_twin.py`:
//! nanoGPT without weight tying and without dropout, with a bias in every Linear (the head
//! included) and in every LayerNorm.
//!
//! ```text
//! x = wte(tokens) + wpe(0..T)                                  [B, T, d]
//! for each block h.{i}:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
//!     attn: c_attn (d -> 3d), split q, k, v into heads, softmax(q kᵀ / sqrt(d / heads) with
//!           -inf above the diagonal) v, merge heads, c_proj (d -> d)
//!     mlp:  c_fc (d -> 4d), GELU (exact, erf form: PyTorch's nn.GELU()), c_proj (4d -> d)
//! logits = lm_head(ln_f(x))                                    [B, T, vocab]
//! ```
//!
//! LayerNorms use eps 1e-5 (PyTorch's default). The loss is the mean cross-entropy in nats over
//! all `B * T` positions.
//!
//! **Initialization** (nanoGPT's): Linear and Embedding weights N(0, 0.02); the residual
//! projections `attn.c_proj` and `mlp.c_proj` N(0, 0.02 / sqrt(2 * layers)); biases 0; LayerNorm
//! weights 1, biases 0. The normal draws come from ChaCha8 seeded with the run's seed (Box–Muller
//! on its f64 uniforms, both values of each pair used), tensor by tensor in the `state_dict`
//! order of [`GptConfig::pytorch_layout`], each weight in PyTorch's row-major `[out, in]` order:
//! the same seed gives the same model on every rank. (The values are not torch's: to start from
//! the twin's weights, load its safetensors with [`Gpt::load_safetensors`].)
//!
//! **PyTorch names** (the twin's `state_dict`, all F32): `wte.weight` `[vocab, d]`, `wpe.weight`
//! `[context, d]`; for each block `h.{i}.ln_1.{weight,bias}` `[d]`,
//! `h.{i}.attn.c_attn.{weight [3d, d], bias [3d]}`, `h.{i}.attn.c_proj.{weight [d, d], bias}`,
//! `h.{i}.ln_2.{weight,bias}`, `h.{i}.mlp.c_fc.{weight [4d, d], bias [4d]}`,
//! `h.{i}.mlp.c_proj.{weight [d, 4d], bias [d]}`; then `ln_f.{weight,bias}` and
//! `lm_head.{weight [vocab, d], bias [vocab]}`. Linear weights are transposed to and from burn's
//! `[in, out]` layout.
//!
//! **Windows.** The binary stores a text window as one row of `context + 1` f32 byte values;
//! [`Gpt::window_loss`] trains on columns `0..T` as inputs and `1..T+1` as targets, and
//! [`Gpt::window_eval`] sums the loss and counts correct next-byte predictions.
//!
//! ```
//! use burn::tensor::{Device, Tensor, TensorData};
//! use localsgd_models::gpt::GptConfig;
//!
//! let device = Device::flex();
//! let config = GptConfig { vocab: 256, context: 8, d_model: 16, heads: 2, layers: 1 };
//! let model = config.init(7, &device)?;
//! // Two windows of context + 1 = 9 bytes.
//! let bytes: Vec<f32> = b"localsgd!gpt model".iter().map(|&b| f32::from(b)).collect();
//! let windows = Tensor::<2>::from_data(TensorData::new(bytes, [2, 9]), &device);
//! let loss = model.window_loss(windows)?.into_scalar::<f32>();
//! // Near ln(256) = 5.55 nats at initialization.
//! assert!((loss - 256f32.ln()).abs() < 0.1, "{loss}");
//! assert_eq!(model.config(), config);
//! # Ok::<(), localsgd_models::gpt::GptError>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::{Embedding, LayerNorm, LayerNormConfig, Linear};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use localsgd_pipeline::fused;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::mlp::linear_from_pytorch;
use crate::pytorch::format::{self, NamedTensor, WeightsError, push_linear, push_norm, to_f32_vec};

/// Standard deviation of nanoGPT's normal initialization.
const INIT_STD: f64 = 0.02;

/// LayerNorm epsilon (PyTorch's default).
const LN_EPS: f64 = 1e-5;

/// The shape of a [`Gpt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GptConfig {
    /// Vocabulary size: 256 for bytes. Token ids must be below it.
    pub vocab: usize,
    /// Longest input (tokens per row); the learned position embedding has this many rows.
    pub context: usize,
    /// Width of the residual stream (embedding size).
    pub d_model: usize,
    /// Attention heads per block; must divide `d_model`.
    pub heads: usize,
    /// Number of transformer blocks.
    pub layers: usize,
}

/// An invalid [`GptConfig`], input or weights file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GptError {
    /// A size setting is 0.
    #[error("GPT setting `{setting}` = 0; it must be at least 1 (e.g. {example})")]
    Zero {
        /// The setting's name (`vocab`, `context`, `d-model`, `heads`, `layers`).
        setting: &'static str,
        /// A value that works, for the message.
        example: usize,
    },
    /// The heads do not divide the model width.
    #[error(
        "GPT setting `heads` = {heads} does not divide `d-model` = {d_model}; use heads that divide it (e.g. {suggestion})"
    )]
    HeadsNotDividing {
        /// The heads asked for.
        heads: usize,
        /// The model width.
        d_model: usize,
        /// The largest divisor of `d_model` not above `heads`.
        suggestion: usize,
    },
    /// An input row is empty or longer than the context.
    #[error("GPT input of {tokens} tokens per row; the model takes 1 to {context} (its `context`)")]
    Length {
        /// Tokens per row given.
        tokens: usize,
        /// The model's context.
        context: usize,
    },
    /// A window (`context + 1` byte values per row) has the wrong width.
    #[error(
        "GPT window of {width} values per row; windows hold 2 to {} values (inputs and the next byte, `context` + 1)",
        context + 1
    )]
    WindowWidth {
        /// Values per row given.
        width: usize,
        /// The model's context.
        context: usize,
    },
    /// A token id is outside the vocabulary.
    #[error("GPT token {value} is outside the vocabulary 0..{vocab}")]
    Token {
        /// The offending value (the smallest below 0 or the largest at or above `vocab`).
        value: f64,
        /// The vocabulary size.
        vocab: usize,
    },
    /// Reading or writing the weights failed, or they do not fit the configuration.
    #[error(transparent)]
    Weights(#[from] WeightsError),
}

impl GptConfig {
    /// The suggested default: context 64, d-model 128, 4 heads, 2 layers, bytes: 470,784
    /// parameters, small enough that a thousand steps of batch 16 train in minutes on one CPU
    /// core (book: Training a language model).
    pub fn small() -> Self {
        Self {
            vocab: 256,
            context: 64,
            d_model: 128,
            heads: 4,
            layers: 2,
        }
    }

    /// Checks every size is at least 1 and that `heads` divides `d_model`.
    pub fn validate(&self) -> Result<(), GptError> {
        let defaults = Self::small();
        for (setting, value, example) in [
            ("vocab", self.vocab, defaults.vocab),
            ("context", self.context, defaults.context),
            ("d-model", self.d_model, defaults.d_model),
            ("heads", self.heads, defaults.heads),
            ("layers", self.layers, defaults.layers),
        ] {
            if value == 0 {
                return Err(GptError::Zero { setting, example });
            }
        }
        if !self.d_model.is_multiple_of(self.heads) {
            let suggestion = (1..=self.heads)
                .rev()
                .find(|h| self.d_model.is_multiple_of(*h))
                .unwrap_or(1);
            return Err(GptError::HeadsNotDividing {
                heads: self.heads,
                d_model: self.d_model,
                suggestion,
            });
        }
        Ok(())
    }

    /// Number of learnable parameters (every tensor of [`GptConfig::pytorch_layout`]).
    pub fn num_params(&self) -> u64 {
        self.pytorch_layout()
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>() as u64)
            .sum()
    }

    /// Every parameter's PyTorch `state_dict` name and PyTorch shape, in `state_dict` order
    /// (module docs).
    pub fn pytorch_layout(&self) -> Vec<(String, Vec<usize>)> {
        self.layout()
            .into_iter()
            .map(|(name, shape, _)| (name, shape))
            .collect()
    }

    /// Names, PyTorch shapes and initial values' kind, in `state_dict` order.
    fn layout(&self) -> Vec<(String, Vec<usize>, Init)> {
        let (v, c, d) = (self.vocab, self.context, self.d_model);
        let residual = Init::Normal(INIT_STD / ((2 * self.layers) as f64).sqrt());
        let normal = Init::Normal(INIT_STD);
        let mut out = vec![
            ("wte.weight".to_string(), vec![v, d], normal),
            ("wpe.weight".to_string(), vec![c, d], normal),
        ];
        let linear = |out: &mut Vec<_>, name: String, fan_in: usize, fan_out: usize, w| {
            out.push((format!("{name}.weight"), vec![fan_out, fan_in], w));
            out.push((format!("{name}.bias"), vec![fan_out], Init::Zeros));
        };
        let norm = |out: &mut Vec<(String, Vec<usize>, Init)>, name: String| {
            out.push((format!("{name}.weight"), vec![d], Init::Ones));
            out.push((format!("{name}.bias"), vec![d], Init::Zeros));
        };
        for i in 0..self.layers {
            norm(&mut out, format!("h.{i}.ln_1"));
            linear(&mut out, format!("h.{i}.attn.c_attn"), d, 3 * d, normal);
            linear(&mut out, format!("h.{i}.attn.c_proj"), d, d, residual);
            norm(&mut out, format!("h.{i}.ln_2"));
            linear(&mut out, format!("h.{i}.mlp.c_fc"), d, 4 * d, normal);
            linear(&mut out, format!("h.{i}.mlp.c_proj"), 4 * d, d, residual);
        }
        norm(&mut out, "ln_f".to_string());
        linear(&mut out, "lm_head".to_string(), d, v, normal);
        out
    }

    /// Builds the model with nanoGPT's initialization drawn from ChaCha8 seeded with `seed`
    /// (module docs). Same seed, same model, on any rank.
    pub fn init(&self, seed: u64, device: &Device) -> Result<Gpt, GptError> {
        self.validate()?;
        let mut normal = Normal::new(seed);
        let tensors = self
            .layout()
            .into_iter()
            .map(|(name, shape, init)| {
                let n = shape.iter().product();
                let values = match init {
                    Init::Normal(std) => (0..n).map(|_| (normal.next() * std) as f32).collect(),
                    Init::Zeros => vec![0.0; n],
                    Init::Ones => vec![1.0; n],
                };
                (name, (shape, values))
            })
            .collect();
        build(self, tensors, device)
    }
}

/// How a parameter starts.
#[derive(Debug, Clone, Copy)]
enum Init {
    Normal(f64),
    Zeros,
    Ones,
}

/// Standard normal draws from ChaCha8: Box–Muller on pairs of f64 uniforms, both values used.
struct Normal {
    rng: ChaCha8Rng,
    spare: Option<f64>,
}

impl Normal {
    fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            spare: None,
        }
    }

    fn next(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        // u1 in (0, 1] keeps the logarithm finite.
        let u1 = 1.0 - self.rng.random::<f64>();
        let u2: f64 = self.rng.random();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * theta.sin());
        r * theta.cos()
    }
}

/// `ln` applied to `x` as one fused operation each way (burn's `LayerNorm::forward`, with the
/// model's epsilon).
fn norm<const D: usize>(ln: &LayerNorm, x: Tensor<D>) -> Tensor<D> {
    fused::layer_norm(x, ln.gamma.val(), ln.beta.as_ref().map(|b| b.val()), LN_EPS)
}

/// `layer` applied to `[B, T, in]` as one `[B·T, in] × [in, out]` product, PyTorch's `addmm`
/// form. burn's `Linear` keeps a 3-D input batched where `T` is a multiple of its row tile
/// (contexts of 64 and 128 are), so the weight broadcasts to `[1, in, out]` and its gradient
/// becomes `B` small products and a sum over them.
fn linear(layer: &Linear, x: Tensor<3>) -> Tensor<3> {
    let [b, t, d] = x.dims();
    let y = layer.forward(x.reshape([b * t, d]));
    let [_, out] = y.dims();
    y.reshape([b, t, out])
}

/// `[B·T, out]` back to `[B, T, out]`.
fn linear_2d_to_3d(y: Tensor<2>, b: usize, t: usize) -> Tensor<3> {
    let [_, out] = y.dims();
    y.reshape([b, t, out])
}

/// Causal multi-head self-attention with one fused q, k, v projection.
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// The fused projection `d -> 3d` (q, k, v in that order along the output).
    pub c_attn: Linear,
    /// The output projection `d -> d`.
    pub c_proj: Linear,
    /// Number of heads.
    pub heads: usize,
}

impl CausalSelfAttention {
    /// `[B, T, d]` to `[B, T, d]`; position `t` attends to positions `0..=t`.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [b, t, d] = x.dims();
        let hd = d / self.heads;
        let qkv = linear(&self.c_attn, x);
        let head = |part: usize| {
            qkv.clone()
                .narrow(2, part * d, d)
                .reshape([b, t, self.heads, hd])
                .swap_dims(1, 2)
        };
        // softmax(q kᵀ / √hd) with the future masked, as one fused operation each way.
        let scores = head(0).matmul(head(1).swap_dims(2, 3));
        let p = fused::causal_softmax(scores, 1.0 / (hd as f64).sqrt());
        let y = p.matmul(head(2));
        linear(&self.c_proj, y.swap_dims(1, 2).reshape([b, t, d]))
    }
}

/// The feed-forward part of a block: `c_fc`, exact GELU, `c_proj`.
#[derive(Module, Debug)]
pub struct GptMlp {
    /// `d -> 4d`.
    pub c_fc: Linear,
    /// `4d -> d`.
    pub c_proj: Linear,
}

impl GptMlp {
    /// `[B, T, d]` to `[B, T, d]`.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        // The exact (erf) form, as PyTorch's `nn.GELU()` default, vectorized on the CPU.
        let [b, t, d] = x.dims();
        let h = self.c_fc.forward(x.reshape([b * t, d]));
        linear_2d_to_3d(self.c_proj.forward(localsgd_pipeline::gelu::gelu(h)), b, t)
    }
}

/// One pre-LayerNorm transformer block.
#[derive(Module, Debug)]
pub struct Block {
    /// LayerNorm before attention.
    pub ln_1: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// LayerNorm before the MLP.
    pub ln_2: LayerNorm,
    /// The MLP.
    pub mlp: GptMlp,
}

impl Block {
    /// `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let x = x.clone() + self.attn.forward(norm(&self.ln_1, x));
        x.clone() + self.mlp.forward(norm(&self.ln_2, x))
    }
}

/// The GPT-style language model (module docs).
#[derive(Module, Debug)]
pub struct Gpt {
    /// Token embedding `[vocab, d]`.
    pub wte: Embedding,
    /// Learned position embedding `[context, d]`.
    pub wpe: Embedding,
    /// The transformer blocks.
    pub h: Vec<Block>,
    /// The final LayerNorm.
    pub ln_f: LayerNorm,
    /// The head `d -> vocab`, with bias.
    pub lm_head: Linear,
}

/// What [`Gpt::window_eval`] counts over a batch of windows.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WindowEval {
    /// Sum over every predicted position of the cross-entropy in nats (each position's value
    /// computed in f32 by burn, summed in f64).
    pub loss_sum: f64,
    /// Positions whose most likely next byte (first maximum) is the actual one.
    pub correct: u64,
    /// Positions predicted: rows times (window width - 1).
    pub tokens: u64,
}

impl WindowEval {
    /// Adds another batch's counts.
    pub fn add(&mut self, other: WindowEval) {
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
        self.tokens += other.tokens;
    }

    /// Mean loss in nats per byte (0 for no tokens).
    pub fn nats_per_byte(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.loss_sum / self.tokens as f64
        }
    }

    /// Mean loss in bits per byte (nats / ln 2).
    pub fn bits_per_byte(&self) -> f64 {
        self.nats_per_byte() / std::f64::consts::LN_2
    }

    /// Fraction of positions predicted right (0 for no tokens).
    pub fn accuracy(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.correct as f64 / self.tokens as f64
        }
    }
}

impl Gpt {
    /// The shape of this model, read from its parameters.
    pub fn config(&self) -> GptConfig {
        let [vocab, d_model] = self.wte.weight.shape().dims();
        let [context, _] = self.wpe.weight.shape().dims();
        GptConfig {
            vocab,
            context,
            d_model,
            heads: self.h.first().map_or(1, |b| b.attn.heads),
            layers: self.h.len(),
        }
    }

    /// Logits `[B, T, vocab]` for token ids `[B, T]`. `T` must be 1 to `context` and every id
    /// below `vocab`, else a [`GptError::Length`] or [`GptError::Token`] (checking the ids reads
    /// their minimum and maximum back from the device).
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Result<Tensor<3>, GptError> {
        let config = self.config();
        let [_, t] = tokens.dims();
        if t == 0 || t > config.context {
            return Err(GptError::Length {
                tokens: t,
                context: config.context,
            });
        }
        let (min, max) = (
            tokens.clone().min().into_scalar::<i64>(),
            tokens.clone().max().into_scalar::<i64>(),
        );
        check_range(min as f64, max as f64, config.vocab)?;
        Ok(self.forward_unchecked(tokens))
    }

    /// [`Gpt::forward`] without its checks (the caller has made sure of them).
    fn forward_unchecked(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let [_, t] = tokens.dims();
        let [_, d] = self.wpe.weight.shape().dims();
        let positions = self.wpe.weight.val().narrow(0, 0, t).reshape([1, t, d]);
        let mut x = self.wte.forward(tokens) + positions;
        for block in &self.h {
            x = block.forward(x);
        }
        linear(&self.lm_head, norm(&self.ln_f, x))
    }

    /// Mean cross-entropy in nats over all `B * T` positions of `logits` `[B, T, vocab]`
    /// against `targets` `[B, T]` (PyTorch's `F.cross_entropy` on the flattened positions).
    pub fn loss(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
        let [b, t, v] = logits.dims();
        fused::cross_entropy(logits.reshape([b * t, v]), targets.reshape([b * t]))
    }

    /// The logits for windows `[B, W]` of f32 token values (`W` = 2 to `context + 1`; the binary
    /// uses `context + 1` bytes): inputs are columns `0..W-1`, and the targets `[B, W-1]` are
    /// columns `1..W`, the next token at each position. Values are truncated to integers; any
    /// outside `0..vocab` is a [`GptError::Token`].
    pub fn window_logits_and_targets(
        &self,
        windows: Tensor<2>,
    ) -> Result<(Tensor<3>, Tensor<2, Int>), GptError> {
        let config = self.config();
        let [b, width] = windows.dims();
        if width < 2 || width > config.context + 1 {
            return Err(GptError::WindowWidth {
                width,
                context: config.context,
            });
        }
        let (min, max) = (
            windows.clone().min().into_scalar::<f32>(),
            windows.clone().max().into_scalar::<f32>(),
        );
        check_range(f64::from(min), f64::from(max), config.vocab)?;
        let ids = windows.int();
        let t = width - 1;
        let inputs = ids.clone().slice([0..b, 0..t]);
        let targets = ids.slice([0..b, 1..width]);
        Ok((self.forward_unchecked(inputs), targets))
    }

    /// Mean next-token cross-entropy (nats) of windows `[B, W]` (see
    /// [`Gpt::window_logits_and_targets`]): the training loss.
    pub fn window_loss(&self, windows: Tensor<2>) -> Result<Tensor<1>, GptError> {
        let (logits, targets) = self.window_logits_and_targets(windows)?;
        Ok(Self::loss(logits, targets))
    }

    /// Summed loss and correct next-token predictions over windows `[B, W]`, for evaluation
    /// (call it on `model.valid()` so that no graph is recorded).
    pub fn window_eval(&self, windows: Tensor<2>) -> Result<WindowEval, GptError> {
        let (logits, targets) = self.window_logits_and_targets(windows)?;
        let [b, t, v] = logits.dims();
        let logits = logits.reshape([b * t, v]);
        let targets = targets.reshape([b * t, 1]);
        let predicted = logits.clone().argmax(1);
        let correct = predicted
            .equal(targets.clone())
            .int()
            .sum()
            .into_scalar::<i64>();
        let nll = log_softmax(logits, 1).gather(1, targets);
        let nll = to_f32_vec(nll)?;
        Ok(WindowEval {
            loss_sum: -nll.iter().map(|&x| f64::from(x)).sum::<f64>(),
            correct: correct.max(0) as u64,
            tokens: (b * t) as u64,
        })
    }

    /// Every parameter as (PyTorch name, PyTorch shape, row-major values), in `state_dict`
    /// order (module docs); Linear weights transposed to `[out, in]`.
    pub fn to_named_tensors(&self) -> Result<Vec<NamedTensor>, GptError> {
        let mut out = Vec::new();
        let param = |out: &mut Vec<_>, name: &str, t: Tensor<2>| -> Result<(), GptError> {
            let shape = t.dims().to_vec();
            out.push((name.to_string(), shape, to_f32_vec(t)?));
            Ok(())
        };
        param(&mut out, "wte.weight", self.wte.weight.val())?;
        param(&mut out, "wpe.weight", self.wpe.weight.val())?;
        for (i, block) in self.h.iter().enumerate() {
            push_norm(&mut out, &format!("h.{i}.ln_1"), &block.ln_1)?;
            push_linear(&mut out, &format!("h.{i}.attn.c_attn"), &block.attn.c_attn)?;
            push_linear(&mut out, &format!("h.{i}.attn.c_proj"), &block.attn.c_proj)?;
            push_norm(&mut out, &format!("h.{i}.ln_2"), &block.ln_2)?;
            push_linear(&mut out, &format!("h.{i}.mlp.c_fc"), &block.mlp.c_fc)?;
            push_linear(&mut out, &format!("h.{i}.mlp.c_proj"), &block.mlp.c_proj)?;
        }
        push_norm(&mut out, "ln_f", &self.ln_f)?;
        push_linear(&mut out, "lm_head", &self.lm_head)?;
        Ok(out)
    }

    /// A model shaped like `config` from (PyTorch name, PyTorch shape, values) triples, as
    /// [`Gpt::to_named_tensors`] gives them (any order). Every name of
    /// [`GptConfig::pytorch_layout`] must be present with its shape, and no other.
    pub fn from_named_tensors(
        config: &GptConfig,
        tensors: Vec<NamedTensor>,
        device: &Device,
    ) -> Result<Gpt, GptError> {
        config.validate()?;
        let layout = config.pytorch_layout();
        let expected: BTreeSet<&str> = layout.iter().map(|(n, _)| n.as_str()).collect();
        let extra: Vec<String> = tensors
            .iter()
            .filter(|(n, _, _)| !expected.contains(n.as_str()))
            .map(|(n, _, _)| n.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if !extra.is_empty() {
            return Err(WeightsError::UnexpectedTensors {
                names: extra,
                expected: expected.iter().map(|n| n.to_string()).collect(),
            }
            .into());
        }
        let mut by_name: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
        for (name, shape, values) in tensors {
            if shape.iter().product::<usize>() != values.len() {
                return Err(WeightsError::TensorData(format!(
                    "tensor {name:?}: shape {shape:?} holds {} values, {} given",
                    shape.iter().product::<usize>(),
                    values.len()
                ))
                .into());
            }
            by_name.insert(name, (shape, values));
        }
        for (name, shape) in &layout {
            match by_name.get(name) {
                None => {
                    return Err(WeightsError::MissingTensor {
                        name: name.clone(),
                        expected: shape.clone(),
                        found: by_name.keys().cloned().collect(),
                    }
                    .into());
                }
                Some((found, _)) if found != shape => {
                    return Err(WeightsError::ShapeMismatch {
                        name: name.clone(),
                        expected: shape.clone(),
                        found: found.clone(),
                    }
                    .into());
                }
                Some(_) => {}
            }
        }
        build(config, by_name, device)
    }

    /// Loads a model shaped like `config` from a safetensors file in the twin's layout (what
    /// `scripts/gpt_twin.py` and [`Gpt::save_safetensors`] write; F32 or F64).
    pub fn load_safetensors(
        path: &Path,
        config: &GptConfig,
        device: &Device,
    ) -> Result<Gpt, GptError> {
        let bytes = format::read_file(path)?;
        Self::from_safetensors_bytes(&bytes, path, config, device)
    }

    /// Like [`Gpt::load_safetensors`] on bytes already in memory; `origin` only names them in
    /// errors.
    pub fn from_safetensors_bytes(
        bytes: &[u8],
        origin: &Path,
        config: &GptConfig,
        device: &Device,
    ) -> Result<Gpt, GptError> {
        let tensors = format::all_tensors(&format::parse(bytes, origin)?)?;
        Self::from_named_tensors(config, tensors, device)
    }

    /// Writes this model in the twin's layout as F32 safetensors (atomically), so that
    /// `model.load_state_dict(...)` loads it into the PyTorch `GPT`.
    pub fn save_safetensors(&self, path: &Path) -> Result<(), GptError> {
        Ok(format::write(path, &self.to_named_tensors()?)?)
    }
}

/// `min..=max` must lie in `0..vocab`.
fn check_range(min: f64, max: f64, vocab: usize) -> Result<(), GptError> {
    if min.is_nan() || min < 0.0 {
        return Err(GptError::Token { value: min, vocab });
    }
    if max.is_nan() || max >= vocab as f64 {
        return Err(GptError::Token { value: max, vocab });
    }
    Ok(())
}

/// The model from PyTorch-layout values by name (names and shapes already checked).
fn build(
    config: &GptConfig,
    mut tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    device: &Device,
) -> Result<Gpt, GptError> {
    let d = config.d_model;
    let mut take = |name: &str| -> Result<Vec<f32>, GptError> {
        tensors.remove(name).map(|(_, v)| v).ok_or_else(|| {
            WeightsError::MissingTensor {
                name: name.to_string(),
                expected: Vec::new(),
                found: Vec::new(),
            }
            .into()
        })
    };
    let embedding = |values: Vec<f32>, rows: usize| Embedding {
        weight: Param::from_tensor(Tensor::<2>::from_data(
            TensorData::new(values, [rows, d]),
            device,
        )),
    };
    let wte = embedding(take("wte.weight")?, config.vocab);
    let wpe = embedding(take("wpe.weight")?, config.context);
    let mut linear = |name: &str, fan_in: usize, fan_out: usize| -> Result<Linear, GptError> {
        let w = take(&format!("{name}.weight"))?;
        let b = take(&format!("{name}.bias"))?;
        Ok(linear_from_pytorch(&w, &b, fan_in, fan_out, device))
    };
    let mut h = Vec::with_capacity(config.layers);
    for i in 0..config.layers {
        let c_attn = linear(&format!("h.{i}.attn.c_attn"), d, 3 * d)?;
        let c_proj = linear(&format!("h.{i}.attn.c_proj"), d, d)?;
        let c_fc = linear(&format!("h.{i}.mlp.c_fc"), d, 4 * d)?;
        let mlp_proj = linear(&format!("h.{i}.mlp.c_proj"), 4 * d, d)?;
        h.push((c_attn, c_proj, c_fc, mlp_proj));
    }
    let lm_head = linear("lm_head", d, config.vocab)?;
    let mut norm = |name: &str| -> Result<LayerNorm, GptError> {
        let mut ln = LayerNormConfig::new(d).with_epsilon(LN_EPS).init(device);
        let w = take(&format!("{name}.weight"))?;
        let b = take(&format!("{name}.bias"))?;
        ln.gamma = Param::from_tensor(Tensor::<1>::from_data(TensorData::new(w, [d]), device));
        ln.beta = Some(Param::from_tensor(Tensor::<1>::from_data(
            TensorData::new(b, [d]),
            device,
        )));
        Ok(ln)
    };
    let mut blocks = Vec::with_capacity(config.layers);
    for (i, (c_attn, c_proj, c_fc, mlp_proj)) in h.into_iter().enumerate() {
        blocks.push(Block {
            ln_1: norm(&format!("h.{i}.ln_1"))?,
            attn: CausalSelfAttention {
                c_attn,
                c_proj,
                heads: config.heads,
            },
            ln_2: norm(&format!("h.{i}.ln_2"))?,
            mlp: GptMlp {
                c_fc,
                c_proj: mlp_proj,
            },
        });
    }
    Ok(Gpt {
        wte,
        wpe,
        h: blocks,
        ln_f: norm("ln_f")?,
        lm_head,
    })
}
