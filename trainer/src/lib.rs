//! # localsgd-trainer
//!
//! The phase-ordered training pipeline and the `localsgd` binary. (Being written.)
#![deny(missing_docs)]

pub mod data;
pub mod init_weights;
pub mod model;
pub mod plot;
