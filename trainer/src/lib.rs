//! # localsgd-trainer
//!
//! The phase-ordered training pipeline ([`pipeline`]), checkpoints ([`checkpoint`]), the run
//! configuration ([`config`]) and the pieces of the `localsgd` binary: data sets ([`data`]), the
//! models ([`model`]'s MLP, [`cnn`] with [`batch_norm`], both behind [`classifier`]), PyTorch
//! weight import and export ([`init_weights`]), metrics and plots.
#![deny(missing_docs)]

pub mod algorithm;
pub mod atomic;
pub mod batch_norm;
pub mod checkpoint;
pub mod classifier;
pub mod cli;
pub mod cnn;
pub mod config;
pub mod data;
pub mod denormals;
pub mod export;
pub mod fault;
pub mod init_weights;
pub mod limits;
pub mod lr_schedule;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod plan;
pub mod plot;
pub mod run;

/// The book's chapters as doctests: every Rust snippet in `book/` compiles and runs.
#[cfg(doctest)]
pub mod book;
