//! # localsgd-pipeline
//!
//! The distributed training loop as a library, for your own burn loop: the phase-ordered
//! [`pipeline`] (fetch, agree on data, forward/backward, gradient sync, optimizer step, model
//! averaging, metrics, checkpoint), the [`algorithm`] settings and the hook and averager each
//! algorithm builds ([`settings`] holds the plain setting types), PyTorch-style learning-rate
//! schedules ([`lr_schedule`]), and per-rank [`checkpoint`]s of any burn module (collective save
//! and resume in one call each: [`checkpoint::Checkpoints`]); and, for the step itself, fused
//! optimizers ([`optim`]), an exact GELU vectorized on the CPU ([`gelu`]) and fused LayerNorm,
//! causal softmax and cross-entropy ([`fused`]); and the one atomic file writer every crate of the
//! workspace writes run files with ([`atomic`]). It depends on burn and the
//! workspace's comm, hooks and averagers crates, and on no command-line crate (`clap` only with
//! the `clap` feature). The models and data sets (`localsgd-models`), the `localsgd` application
//! (`localsgd-trainer`) and the burn-train strategy (`localsgd-learner`) are built on it.
//!
//! ```
//! use localsgd_comm::ThreadWorld;
//! use localsgd_pipeline::algorithm::{AlgorithmSpec, build};
//! use localsgd_pipeline::settings::AlgorithmKind;
//!
//! let spec = AlgorithmSpec {
//!     kind: AlgorithmKind::PostLocalSgd,
//!     warmup: 10,
//!     period: Some(4),
//!     ..AlgorithmSpec::default()
//! };
//! let kinds = ThreadWorld::new(2)?.run(|world| {
//!     let parts = build(&spec, &world).unwrap();
//!     parts.averager.map(|a| a.state().config.to_string())
//! })?;
//! assert_eq!(kinds[0].as_deref(), Some("periodic(period 4, warmup_steps 10)"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod algorithm;
pub mod atomic;
pub mod checkpoint;
mod cpu;
pub mod fused;
pub mod gelu;
pub mod lr_schedule;
pub mod optim;
pub mod pipeline;
pub mod recovery;
pub mod settings;

/// The book's chapter on this crate as a doctest: its examples compile and run against the
/// library crates alone (no `localsgd-trainer`).
#[cfg(doctest)]
#[doc = include_str!("../../book/src/pipeline.md")]
pub struct BookPipeline;

/// The book's averagers chapter as a doctest: its hand-written loop uses the hooks crate beside
/// the averagers, and this is the lowest crate that has both.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/averagers.md")]
pub struct BookAveragers;
