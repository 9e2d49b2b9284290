//! # localsgd-averagers
//!
//! Model averaging for local SGD on burn, numerically equal to PyTorch's
//! `torch.distributed.algorithms.model_averaging`:
//!
//! - [`PeriodicModelAverager`]: average over one group every `period` steps after a warmup
//!   (schedule relative to the warmup).
//! - [`HierarchicalModelAverager`]: several levels `(period, group size)`, e.g. pairs of ranks
//!   every 2 steps and everyone every 8 (schedule in absolute steps).
//! - [`OuterAverager`]: DiLoCo and SlowMo — an outer optimizer step on the global parameters
//!   with the replicas' average displacement as gradient (see [`outer`]); SlowMo also with
//!   fairscale's two frequencies ([`OuterAverager::slowmo`], [`SlowMoConfig`]).
//! - [`average_in_group`]: one averaging of a module's selected parameters — flatten in
//!   traversal order, divide by the group size, one fused all-reduce (sum), write back.
//!
//! All three implement [`ModelAverager`] (object safe: `Box<dyn ModelAverager>`); the
//! generic [`AverageParameters::average_parameters`] works on any burn [`Module`] and is meant to
//! be called exactly once per training iteration, *after* the optimizer step, with the
//! parameters that had a gradient this step. The step counter is saved and restored through
//! [`AveragerState`].
//!
//! Two workers (threads of this process) train a linear model on different data and average
//! every 4 steps; the last step (8) averages, so both end with the same parameters:
//!
//! ```
//! use burn::nn::loss::{MseLoss, Reduction};
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::{GradientsParams, SgdConfig};
//! use burn::prelude::*;
//! use localsgd_averagers::comm::ThreadWorld;
//! use localsgd_averagers::{
//!     AverageParameters, AveragerError, ModelAverager, ParamSelection, PeriodicModelAverager,
//! };
//!
//! let results = ThreadWorld::new(2)?.run(|world| -> Result<Vec<f32>, AveragerError> {
//!     let device = Device::flex().autodiff();
//!     let mut model: Linear = LinearConfig::new(3, 1).init(&device);
//!     let mut optim = SgdConfig::new().init();
//!     let mut averager = PeriodicModelAverager::new(4, 0, world.clone())?;
//!     // Each worker has its own data.
//!     let x = Tensor::<2>::ones([8, 3], &device) * (world.rank() as f32 + 1.0);
//!     let y = Tensor::<2>::zeros([8, 1], &device);
//!     for _ in 0..9 {
//!         let pred = model.forward(x.clone());
//!         let loss = MseLoss::new().forward(pred, y.clone(), Reduction::Mean);
//!         let grads = GradientsParams::from_grads(loss.backward(), &model);
//!         let selection = ParamSelection::with_grads(&model, &grads);
//!         model = optim.step(0.01, model, grads);
//!         // Averages at steps 0, 4 and 8; counts every step.
//!         model = averager.average_parameters(model, &selection)?;
//!     }
//!     assert_eq!(averager.step(), 9);
//!     Ok(model.weight.val().into_data().try_into_vec::<f32>().unwrap_or_default())
//! })?;
//! let weights = results.into_iter().collect::<Result<Vec<_>, _>>()?;
//! assert_eq!(weights[0], weights[1]);
//! assert_eq!(weights[0].len(), 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Module`]: burn::module::Module
#![deny(missing_docs)]

pub mod average;
pub mod average_parameters;
pub mod averager;
pub mod error;
pub mod group;
pub mod hierarchical;
pub mod outer;
pub mod overlap;
pub mod periodic;
pub mod schedule;
pub mod state;

pub use average::{average_if_member, average_in_group, broadcast_in_group};
pub use average_parameters::AverageParameters;
pub use averager::ModelAverager;
pub use error::{AveragerError, RankParams};
pub use group::new_group;
pub use hierarchical::{Hierarchical, HierarchicalModelAverager, validate_levels};
pub use outer::{
    AverageCompression, OuterAverager, OuterOptimizer, OuterSgd, OuterSgdConfig, OuterState,
    PseudoGradient, SlowMoConfig, StreamingConfig,
};
pub use overlap::{Overlap, PendingAverage};
pub use periodic::{Periodic, PeriodicModelAverager};
pub use schedule::{Schedule, Scheduled};
pub use state::{AveragerConfig, AveragerState, Level};

/// The communication crate this one builds on (groups, [`ThreadWorld`](comm::ThreadWorld), ...).
pub use localsgd_comm as comm;
pub use localsgd_comm::Group;
pub use localsgd_comm::params::ParamSelection;

/// The book's Concepts chapter as a doctest: its examples use only this crate and the comm
/// crate.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/concepts.md")]
pub struct BookConcepts;
