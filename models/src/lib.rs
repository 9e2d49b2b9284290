//! # localsgd-models
//!
//! The models and data sets that `localsgd train`, the burn-train examples of `localsgd-learner`
//! and the workspace's tests train, as a library of their own:
//!
//! - the models, behind one type [`network::Network`]: the [`mlp::Mlp`], the [`cnn::Cnn`] with
//!   [`batch_norm::BatchNorm2d`], and the byte-level language model [`gpt::Gpt`] (nanoGPT's
//!   architecture, on the fused operations of `localsgd_pipeline::fused`);
//! - PyTorch weights in and out: [`pytorch`] (safetensors files with PyTorch's names and
//!   layouts for every model);
//! - the data: [`data`]'s in-memory `Dataset` with its sources (the bundled digits, IDX files
//!   such as MNIST and Fashion-MNIST, byte-level text, generated blobs) and the per-rank
//!   `ShardSampler` of PyTorch's `DistributedSampler`; [`limits`], the memory check that turns an
//!   oversized setting into an error naming it.
//!
//! Nothing here knows about command lines or the distributed loop: a model is a burn `Module`,
//! a batch a pair of tensors.
//!
//! ```
//! use burn::tensor::Device;
//! use localsgd_models::data::{ShardSampler, digits};
//! use localsgd_models::network::{ModelSpec, Network, Objective};
//! use localsgd_models::mlp::MlpConfig;
//!
//! let device = Device::flex();
//! let split = digits::load().unwrap();
//! let sampler = ShardSampler::new(split.train.len(), 1, 0).unwrap();
//! let batch = &sampler.batches(0, 32).unwrap()[0];
//! let (x, y) = split.train.batch_tensors(batch, &device).unwrap();
//! let spec = ModelSpec::Mlp(MlpConfig { input: 64, hidden: vec![32], classes: 10 });
//! let model: Network = spec.init(1, &device).unwrap();
//! let loss: f32 = model.batch_loss(x, y).into_scalar();
//! assert!(loss > 1.5 && loss < 3.5, "{loss}"); // about ln 10 at initialization
//! ```

#![deny(missing_docs)]

pub mod batch_norm;
pub mod cnn;
pub mod data;
pub mod gpt;
pub mod limits;
pub mod mlp;
pub mod network;
pub mod pytorch;
