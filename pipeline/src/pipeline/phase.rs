//! The phases of one training iteration, in the one order every rank runs them.

use std::fmt;
use std::time::Duration;

/// One phase of a training iteration. Only phases marked [`Phase::communicates`] issue
/// collectives, and they do so one at a time, in [`ITERATION_ORDER`], on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Take the next local batch (a background prefetcher may read ahead; it never communicates).
    FetchBatch,
    /// One small collective: does every rank still have data? Uneven shards end the epoch
    /// together instead of hanging.
    AgreeHasData,
    /// Forward pass, loss, backward pass (local).
    ForwardBackward,
    /// Gradient communication through the configured comm hook (bucket by bucket).
    GradientSync,
    /// The optimizer step (local), optionally skipped for non-finite gradients.
    OptimizerStep,
    /// Model averaging (periodic or hierarchical), its own phase after the optimizer step.
    ModelAveraging,
    /// Metrics; every `metrics_every` iterations the loss is all-reduced across ranks.
    Metrics,
    /// Checkpoint every `checkpoint_every` iterations.
    Checkpoint,
}

/// The fixed order of the phases of one iteration. The pipeline runs exactly this sequence; it is
/// the only place the order is written down.
pub const ITERATION_ORDER: [Phase; 8] = [
    Phase::FetchBatch,
    Phase::AgreeHasData,
    Phase::ForwardBackward,
    Phase::GradientSync,
    Phase::OptimizerStep,
    Phase::ModelAveraging,
    Phase::Metrics,
    Phase::Checkpoint,
];

impl Phase {
    /// Whether this phase may issue collectives.
    pub fn communicates(self) -> bool {
        matches!(
            self,
            Phase::AgreeHasData
                | Phase::GradientSync
                | Phase::ModelAveraging
                | Phase::Metrics
                | Phase::Checkpoint
        )
    }

    /// Stable snake_case name (metrics columns, reports).
    pub fn name(self) -> &'static str {
        match self {
            Phase::FetchBatch => "fetch_batch",
            Phase::AgreeHasData => "agree_has_data",
            Phase::ForwardBackward => "forward_backward",
            Phase::GradientSync => "gradient_sync",
            Phase::OptimizerStep => "optimizer_step",
            Phase::ModelAveraging => "model_averaging",
            Phase::Metrics => "metrics",
            Phase::Checkpoint => "checkpoint",
        }
    }

    fn index(self) -> usize {
        ITERATION_ORDER
            .iter()
            .position(|p| *p == self)
            .unwrap_or_else(|| unreachable!("every phase is in ITERATION_ORDER"))
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Wall time spent in each phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    times: [Duration; 8],
}

impl PhaseTimes {
    /// Add `d` to `phase`.
    pub fn add(&mut self, phase: Phase, d: Duration) {
        self.times[phase.index()] += d;
    }

    /// Time spent in `phase`.
    pub fn get(&self, phase: Phase) -> Duration {
        self.times[phase.index()]
    }

    /// Sum over all phases.
    pub fn total(&self) -> Duration {
        self.times.iter().sum()
    }

    /// Accumulate another set of times.
    pub fn accumulate(&mut self, other: &PhaseTimes) {
        for (a, b) in self.times.iter_mut().zip(other.times.iter()) {
            *a += *b;
        }
    }

    /// (phase, time) pairs in iteration order.
    pub fn iter(&self) -> impl Iterator<Item = (Phase, Duration)> + '_ {
        ITERATION_ORDER.iter().map(|p| (*p, self.get(*p)))
    }
}
