//! Training data: an in-memory [`Dataset`], its sources ([`digits`], [`synthetic`], [`idx`],
//! [`text`]) and the PyTorch-compatible per-rank sharding and batching ([`ShardSampler`]).
//!
//! ```
//! use burn::tensor::Device;
//! use localsgd_models::data::{digits, ShardSampler};
//!
//! let split = digits::load().unwrap();
//! assert_eq!((split.train.len(), split.test.len()), (1437, 360));
//! // Rank 1 of 4, no shuffling: the rows DistributedSampler would give it, in batches of 32.
//! let sampler = ShardSampler::new(split.train.len(), 4, 1).unwrap();
//! let batches = sampler.batches(0, 32).unwrap();
//! let (x, y) = split.train.batch_tensors(&batches[0], &Device::flex()).unwrap();
//! assert_eq!(x.dims(), [32, 64]);
//! assert_eq!(y.dims(), [32]);
//! ```

mod dataset;
pub mod digits;
mod error;
pub mod idx;
mod sampler;
pub mod synthetic;
pub mod text;

pub use dataset::{Dataset, TrainTest};
pub use error::DataError;
pub use sampler::ShardSampler;
