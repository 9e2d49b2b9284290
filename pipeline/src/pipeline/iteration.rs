//! What one iteration carries from phase to phase.

use burn::optim::GradientsParams;
use localsgd_comm::Traffic;
use localsgd_comm::params::ParamSelection;
use localsgd_hooks::InFlightGrads;
use std::time::Duration;

use super::phase::PhaseTimes;

/// The state of the iteration in progress, handed from each phase method to the next.
pub(crate) struct Iteration<B> {
    /// This step's micro-batches (fetch → forward/backward).
    pub batches: Vec<B>,
    /// Mean loss over the micro-batches, when the step reported every one.
    pub loss: Option<f32>,
    /// Summed gradients (forward/backward → gradient sync, or the optimizer without a hook).
    pub grads: Option<GradientsParams>,
    /// Buckets whose collectives the gradient sync started (→ optimizer step).
    pub in_flight: Option<InFlightGrads>,
    /// The parameters that had a gradient, noted for an averaging step (→ model averaging).
    pub selection: Option<ParamSelection>,
    /// The micro-batches the step trained on (forward/backward → the report).
    pub micro_batches: usize,
    /// The optimizer step was skipped (non-finite gradients).
    pub skipped_step: bool,
    /// The loss averaged over the ranks, on metrics iterations.
    pub global_loss: Option<f64>,
    /// The learning rate of the step.
    pub lr: f64,
    /// Time spent waiting for gradient collectives inside another phase, booked as
    /// gradient-sync time.
    pub waited: Duration,
    /// Wall time per phase.
    pub times: PhaseTimes,
    /// The world group's counters when the iteration started.
    pub traffic_start: Traffic,
}

impl<B> Iteration<B> {
    pub(crate) fn new(traffic_start: Traffic) -> Self {
        Self {
            batches: Vec::new(),
            loss: None,
            grads: None,
            in_flight: None,
            selection: None,
            micro_batches: 0,
            skipped_step: false,
            global_loss: None,
            lr: 0.0,
            waited: Duration::ZERO,
            times: PhaseTimes::default(),
            traffic_start,
        }
    }
}
