//! # localsgd-learner
//!
//! Post-local SGD, local SGD, hierarchical averaging and DDP inside burn-train's
//! `SupervisedTraining`, as PyTorch Lightning's `DDPStrategy(ddp_comm_state=PostLocalSGDState(..),
//! model_averaging_period=..)` is for PyTorch: [`LocalSgdStrategy`] is a burn-train
//! `SupervisedLearningStrategy`, so a burn user keeps their model (`TrainStep` /
//! `InferenceStep`), loaders, metrics, checkpointers and early stopping, and swaps the strategy.
//!
//! Every iteration runs the phases of the localsgd pipeline in their order: all ranks agree
//! that each has a batch, forward and backward (the model's `TrainStep`), gradient sync through
//! the comm hook (DDP's all-reduce; post-local SGD's until `warmup`), the optimizer step, then
//! model averaging as its own phase. With burn-train's gradient accumulation, sync, step and
//! averaging happen once per optimizer step.
//!
//! ```
//! use burn::tensor::Device;
//! use localsgd_learner::{LocalSgdStrategy, StrategyConfig};
//!
//! // Lightning's DDPStrategy(ddp_comm_state=PostLocalSGDState(start_localSGD_iter=100, ...),
//! // model_averaging_period=4) on 2 thread ranks:
//! let strategy =
//!     LocalSgdStrategy::new(StrategyConfig::post_local_sgd(100, 4), Device::flex()).unwrap();
//! assert_eq!(strategy.config().workers, 2);
//! // Then: SupervisedTraining::new(dir, train_loader, valid_loader)
//! //     .with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))
//! //     .launch(Learner::new(model, optimizer, lr_scheduler));
//!
//! // A period of 0 is refused before anything trains, naming the setting:
//! let err = LocalSgdStrategy::new(StrategyConfig::post_local_sgd(100, 0), Device::flex());
//! assert!(err.unwrap_err().to_string().contains("period"));
//! ```
//!
//! The book's chapter "With burn-train's Learner" has a complete run, and
//! `examples/fashion_mnist.rs` a CNN on Fashion-MNIST.
#![deny(missing_docs)]

pub mod config;
mod rank;
pub mod state;
mod strategy;

pub use config::{AlgorithmKind, BufferPolicy, Levels, StrategyConfig, StrategyError};
pub use strategy::LocalSgdStrategy;

/// The book's chapter as a doctest: its example compiles and runs.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/learner.md")]
pub struct BookChapter;
