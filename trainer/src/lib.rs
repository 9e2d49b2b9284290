//! # localsgd-trainer
//!
//! The `localsgd` application: the run configuration ([`config`], TOML and flags), data sets
//! ([`data`]: images, generated blobs and byte-level text), the models ([`model`]'s MLP, [`cnn`]
//! with [`batch_norm`], the byte-level language model [`gpt`], all behind [`network`]), PyTorch
//! weight import and export ([`init_weights`], [`export`]), metrics,
//! plots and the per-rank run ([`run`]) that the binary launches; the cost model of `localsgd plan`
//! is the `localsgd-planner` crate.
//! The distributed loop itself is the library crate `localsgd-pipeline`; its modules
//! ([`pipeline`], [`algorithm`], [`checkpoint`], [`lr_schedule`], [`optim`]) are re-exported here under the
//! same names, so `localsgd_trainer::pipeline::Pipeline` keeps working. A library user who wants
//! only the loop depends on `localsgd-pipeline` and pulls in no command-line crate.
#![deny(missing_docs)]

pub use localsgd_pipeline::{algorithm, checkpoint, lr_schedule, optim, pipeline};

pub mod atomic;
pub mod batch_norm;
pub mod cli;
pub mod cnn;
pub mod config;
pub mod data;
pub mod denormals;
pub mod export;
pub mod fault;
pub mod gpt;
pub mod init_weights;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod network;
pub mod plot;
pub mod resume;
pub mod run;
