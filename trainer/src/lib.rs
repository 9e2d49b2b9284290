//! # localsgd-trainer
//!
//! The `localsgd` application: the run configuration ([`config`], TOML and flags), the per-rank
//! run ([`run`]) that the binary launches, resuming ([`resume`]), exporting a checkpoint's
//! weights ([`export`]), metrics and plots, and rehearsed faults ([`fault`]). Its public items are
//! those the binary's own tests drive.
//!
//! The pieces it puts together are libraries of their own: the distributed loop is
//! `localsgd-pipeline`, the models and data sets are `localsgd-models`, the cost model of
//! `localsgd plan` is `localsgd-planner`.

#![deny(missing_docs)]

pub mod cli;
pub mod config;
pub mod denormals;
pub mod export;
pub mod fault;
pub mod history;
pub mod lists;
pub mod metrics;
pub mod plot;
pub mod resume;
pub mod run;
