//! What a rank carries from one world to the next besides the library's [`Recovery`], and
//! where its first world starts.
//!
//! [`Recovery`]: localsgd_pipeline::recovery::Recovery

use super::error::RunError;
use crate::config::TrainConfig;
use crate::fault::Fault;
use localsgd_comm::{Group, Traffic};
use localsgd_pipeline::recovery::Start;

/// Progress callback: (iterations done, total iterations, last global loss).
pub type Progress = Box<dyn FnMut(u64, u64, Option<f64>) + Send>;

/// This rank's rank in the job's first world: what rehearsed faults and membership records name
/// (after ranks left, the same worker keeps it).
pub(super) fn job_rank(group: &Group) -> usize {
    let rank = group.rank();
    group.world_ranks().get(rank).copied().unwrap_or(rank)
}

/// The start a configuration asks `rank` for: fresh, or (`resume`) its own file of the latest
/// checkpoint, or (`resume-ranks`) the saved rank it names.
pub(super) fn configured_start(cfg: &TrainConfig, rank: usize) -> Start {
    match (cfg.resume, cfg.resume_ranks.get(rank)) {
        (false, _) => Start::Fresh,
        (true, None) => Start::Resume,
        (true, Some(&saved)) => Start::ResumeFrom(saved),
    }
}

/// What the binary carries across a change of its world ([`run_rank`](super::run_rank) with
/// `on-rank-failure = "continue"` or `"replace"`) beyond the recovery's own state: the progress
/// callback, the faults still to inject, and its totals so far.
pub(super) struct RankState {
    pub(super) progress: Option<Progress>,
    pub(super) faults: Vec<Fault>,
    /// Samples processed, in every world so far.
    pub(super) samples: u64,
    /// Rank 0's loss curve so far.
    pub(super) curve: Vec<(f64, f64)>,
    /// Communication of the worlds that ended in a failure.
    pub(super) traffic: Traffic,
    /// What the start broadcast sent (the first world's, before its first iteration; a world
    /// after a failure resumes and broadcasts nothing).
    pub(super) start_traffic: Traffic,
}

impl RankState {
    pub(super) fn new(progress: Option<Progress>) -> Result<Self, RunError> {
        Ok(Self {
            progress,
            faults: Fault::from_env().map_err(RunError::Fault)?,
            samples: 0,
            curve: Vec::new(),
            traffic: Traffic::default(),
            start_traffic: Traffic::default(),
        })
    }
}
