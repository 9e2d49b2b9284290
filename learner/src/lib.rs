//! # localsgd-learner
//!
//! Every algorithm of the localsgd pipeline inside burn-train's `SupervisedTraining`: DDP,
//! local SGD, post-local SGD, hierarchical averaging, DiLoCo, Streaming DiLoCo and SlowMo, with
//! overlapped averaging, compression and pipelined buckets, as PyTorch Lightning's
//! `DDPStrategy(ddp_comm_state=PostLocalSGDState(..), model_averaging_period=..)` is for
//! PyTorch. [`LocalSgdStrategy`] is a burn-train `SupervisedLearningStrategy`, so a burn user
//! keeps their model (`TrainStep` / `InferenceStep`), loaders, metrics, checkpointers and early
//! stopping, and swaps the strategy.
//!
//! Every iteration is one [`Pipeline`](localsgd_pipeline::pipeline::Pipeline) iteration, the
//! same as the `localsgd` binary's: all ranks agree that each has a batch, forward and backward
//! (the model's `TrainStep`), gradient sync through the comm hook, the optimizer step (the
//! `Learner`'s optimizer and scheduler), then model averaging or the outer step as its own
//! phase. With burn-train's gradient accumulation, sync, step and averaging happen once per
//! optimizer step. The model `fit` returns is the world average of the ranks' models.
//!
//! ```
//! use burn::tensor::Device;
//! use localsgd_learner::{AlgorithmSpec, LocalSgdStrategy, StrategyConfig};
//!
//! // DiLoCo (outer Nesterov SGD, lr 0.7, momentum 0.9) every 50 local steps on 2 thread ranks:
//! let strategy =
//!     LocalSgdStrategy::new(StrategyConfig::new(AlgorithmSpec::diloco(50)), Device::flex())
//!         .unwrap();
//! assert_eq!(strategy.config().workers, 2);
//! // Then: SupervisedTraining::new(dir, train_loader, valid_loader)
//! //     .with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))
//! //     .launch(Learner::new(model, optimizer, lr_scheduler));
//!
//! // A period of 0 is refused before anything trains, naming the setting:
//! let err = LocalSgdStrategy::new(
//!     StrategyConfig::new(AlgorithmSpec::post_local_sgd(100, 0)),
//!     Device::flex(),
//! );
//! assert!(err.unwrap_err().to_string().contains("period"));
//! ```
//!
//! The book's chapter "With burn-train's Learner" has a complete run, and
//! `examples/fashion_mnist.rs` a CNN on Fashion-MNIST.
#![deny(missing_docs)]

pub mod config;
mod console;
mod error;
mod rank;
mod recovery;
mod report;
pub mod state;
mod strategy;

pub use config::{
    AlgorithmKind, AlgorithmSpec, AverageCompression, AverageCompressionKind, BufferPolicy, Levels,
    OnRankFailure, OuterSettings, StrategyConfig,
};
pub use console::ConsoleRenderer;
pub use error::StrategyError;
pub use report::{RankReport, StrategyReport};
pub use strategy::LocalSgdStrategy;

/// The book's chapter as a doctest: its example compiles and runs.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/learner.md")]
pub struct BookChapter;
