//! # localsgd-hooks
//!
//! Gradient communication hooks (section 4 of the reference semantics): a backward pass's
//! gradients are cut into buckets (reverse traversal order, byte caps like PyTorch DDP: 1 MiB
//! for the first bucket, 25 MiB after), and a [`CommHook`] communicates one bucket at a time.
//!
//! - [`AllReduceHook`]: plain data parallelism (mean over a group).
//! - [`PostLocalSgdHook`]: global averaging for `start_local_sgd_iter` iterations, then averaging
//!   within a subgroup (default: the ranks on this host) or none at all. Its `iter` counter is
//!   part of its [`HookState`], so checkpoints resume the schedule exactly.
//! - [`CompressHook`]: fp16 / bf16 compression around any hook.
//!
//! [`GradientReducer`] plans the buckets of a burn module once, runs the hook over them and
//! returns [`GradientsParams`](burn::optim::GradientsParams) for the optimizer. All flattening
//! goes through [`localsgd_comm::params`].
//!
//! ```
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::GradientsParams;
//! use burn::prelude::*;
//! use localsgd_comm::ThreadWorld;
//! use localsgd_hooks::{AllReduceHook, CommHook, GradientReducer, HookError, PostLocalSgdHook};
//!
//! // Two workers; each one's loss is scaled by (rank + 1), so the mean gradient of the bias
//! // (batch of 1, loss = sum of outputs * scale) is (1 + 2) / 2 = 1.5.
//! let out = ThreadWorld::new(2)?.run(|world| -> Result<Vec<f32>, HookError> {
//!     let device = Device::flex().autodiff();
//!     let model: Linear = LinearConfig::new(3, 2).init(&device);
//!     let scale = (world.rank() + 1) as f32;
//!     let loss = model.forward(Tensor::<2>::ones([1, 3], &device)).sum() * scale;
//!     let grads = GradientsParams::from_grads(loss.backward(), &model);
//!
//!     let mut hook = AllReduceHook::new(world.clone());
//!     let mut reducer = GradientReducer::default();
//!     let grads = reducer.reduce(&model, grads, &mut hook)?;
//!     let bias: Tensor<1> = grads.get(model.bias.as_ref().unwrap().id).unwrap();
//!
//!     // The post-local SGD hook counts iterations during its warmup.
//!     let post_local = PostLocalSgdHook::new(world, None, 10, true);
//!     assert_eq!(post_local.iter(), 0);
//!     Ok(bias.into_data().try_into_vec::<f32>().unwrap())
//! })?;
//! assert_eq!(out[0], Ok(vec![1.5, 1.5]));
//! assert_eq!(out[1], Ok(vec![1.5, 1.5]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod allreduce;
pub mod bucket;
pub mod bucket_plan;
pub mod compress;
pub mod error;
pub mod hook;
pub mod in_flight;
pub mod post_local;
pub mod reducer;

pub use allreduce::AllReduceHook;
pub use bucket::{BucketData, BucketParam, GradBucket};
pub use bucket_plan::{BucketCaps, BucketPlan, BucketSpec, PlannedParam};
pub use compress::{CompressHook, Precision};
pub use error::HookError;
pub use hook::{CommHook, HookState, PostLocalSgdState};
pub use in_flight::InFlightGrads;
pub use post_local::PostLocalSgdHook;
pub use reducer::GradientReducer;

/// The book's chapter on this crate as a doctest: its examples compile and run against burn,
/// this crate and the comm crate alone.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/hooks.md")]
pub struct BookHooks;
