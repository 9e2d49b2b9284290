//! The algorithms the cost model knows, and their names.

use localsgd_averagers::{AverageCompression, Level};
use localsgd_pipeline::settings::Levels;
use serde::Serialize;

/// The algorithms the model knows.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "algorithm", rename_all = "kebab-case")]
pub enum Algorithm {
    /// Gradient all-reduce every iteration.
    Ddp,
    /// Periodic model averaging over the world (`gradient_warmup`: post-local SGD, whose
    /// warmup all-reduces gradients; without it, local SGD).
    Periodic {
        /// Averaging period.
        period: u64,
        /// Whether the warmup iterations all-reduce gradients (post-local SGD).
        gradient_warmup: bool,
        /// Overlapped averaging delay (`overlap`; 0: blocking): each average's all-reduce runs
        /// behind the next `overlap` iterations' compute, and the first one also creates the
        /// helper's communicator (one 8-byte control collective). 0 with `compression`.
        overlap: u64,
        /// The averages' wire format (`average-compression`; `None`: the f32 parameters, 4 bytes
        /// a parameter): each average sends the delta from the last one, as [`Algorithm::Outer`]
        /// sends its pseudo-gradient: half precision all-reduced (2 bytes a parameter), or a
        /// lossy codec's messages of [`AverageCompression::wire_bytes`] all-gathered.
        compression: Option<AverageCompression>,
    },
    /// Hierarchical averaging (post-local SGD hook during warmup).
    Hierarchical {
        /// The levels, periods increasing (each a multiple of the previous), the last group
        /// the world.
        levels: Vec<Level>,
        /// The wire format of the averages of the level whose group is the world
        /// (`average-compression`; `None`: f32), as [`Algorithm::Periodic`]'s; the levels of
        /// smaller groups always all-reduce the f32 parameters.
        compression: Option<AverageCompression>,
    },
    /// An outer-optimizer step over the world after every `period` local steps (DiLoCo,
    /// SlowMo: gradient all-reduce during the warmup, then syncs after iterations
    /// `warmup + period − 1`, `warmup + 2·period − 1`, ...). A sync sends what an average
    /// does: the layout check and one all-reduce of the parameters (pseudo-gradients); with a
    /// lossy codec, the layout check and one all-gather of every rank's message.
    Outer {
        /// Local steps between syncs.
        period: u64,
        /// SlowMo's slow step (`slowmo`) rather than DiLoCo's outer SGD (`diloco`); the
        /// traffic is the same.
        slowmo: bool,
        /// The pseudo-gradients' wire format (`average-compression`; `None`: f32, 4 bytes a
        /// parameter): half precision all-reduced (2 bytes a parameter), or a lossy codec's
        /// messages of [`AverageCompression::wire_bytes`] all-gathered.
        compression: Option<AverageCompression>,
    },
}

impl Algorithm {
    /// The name used by `localsgd train --algorithm`.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Ddp => "ddp",
            Algorithm::Periodic {
                gradient_warmup: true,
                ..
            } => "post-local-sgd",
            Algorithm::Periodic { .. } => "local-sgd",
            Algorithm::Hierarchical { .. } => "hierarchical",
            Algorithm::Outer { slowmo: false, .. } => "diloco",
            Algorithm::Outer { slowmo: true, .. } => "slowmo",
        }
    }

    /// The algorithm as `localsgd plan` labels its row: the name with the period and overlap,
    /// or the levels (`post-local-sgd period 4 overlap 1`, `hierarchical 4:2,16:8`).
    pub fn label(&self) -> String {
        match self {
            Algorithm::Periodic {
                period, overlap: 0, ..
            } => format!("{} period {period}", self.name()),
            Algorithm::Periodic {
                period, overlap, ..
            } => format!("{} period {period} overlap {overlap}", self.name()),
            Algorithm::Hierarchical { levels, .. } => {
                format!("hierarchical {}", Levels::from(levels.clone()))
            }
            Algorithm::Outer { period, .. } => format!("{} period {period}", self.name()),
            Algorithm::Ddp => "ddp".to_string(),
        }
    }
}
