//! What a rank carries from one world to the next, and where each world starts.

use super::error::{RunError, output_error};
use crate::fault::Fault;
use crate::metrics::MembershipChange;
use localsgd_comm::Traffic;
use std::path::Path;
use std::time::Instant;

use crate::config::TrainConfig;

/// Progress callback: (iterations done, total iterations, last global loss).
pub type Progress = Box<dyn FnMut(u64, u64, Option<f64>) + Send>;

/// Where a rank's training starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Start {
    /// From the model's initial weights, at iteration 0.
    Fresh,
    /// From its own file of the latest checkpoint (a `resume` on as many workers).
    Resume,
    /// From saved rank `.0`'s file of the latest checkpoint, written by another number of ranks
    /// (`resume-ranks`, or the survivors of a rank failure).
    ResumeFrom(usize),
    /// From saved rank `saved_rank`'s file of the latest checkpoint, received from a live rank
    /// (a replacement of a failed rank: `on-rank-failure = "replace"`).
    Received { bytes: Vec<u8>, saved_rank: usize },
}

impl Start {
    /// The start a configuration asks `rank` for.
    pub(super) fn configured(cfg: &TrainConfig, rank: usize) -> Self {
        match (cfg.resume, cfg.resume_ranks.get(rank)) {
            (false, _) => Self::Fresh,
            (true, None) => Self::Resume,
            (true, Some(&saved)) => Self::ResumeFrom(saved),
        }
    }
}

/// What a rank carries across a change of its world ([`run_rank`] with `on-rank-failure =
/// "continue"` or `"replace"`): the progress callback, the faults still to inject, the
/// membership changes so far and where training stood.
pub(super) struct RankState {
    pub(super) progress: Option<Progress>,
    pub(super) faults: Vec<Fault>,
    pub(super) membership: Vec<MembershipChange>,
    /// When the last membership change was detected, until the new world completes an
    /// iteration.
    pub(super) recovering: Option<Instant>,
    /// Iterations completed (the pipeline's counter), as of the last one.
    pub(super) iteration: u64,
    /// Samples processed, in every world so far.
    pub(super) samples: u64,
    /// Rank 0's loss curve so far.
    pub(super) curve: Vec<(f64, f64)>,
    /// Communication of the worlds that ended in a failure.
    pub(super) traffic: Traffic,
    /// What the start broadcast sent (the first world's, before its first iteration; a world
    /// after a failure resumes and broadcasts nothing).
    pub(super) start_traffic: Traffic,
    /// The checkpoints this job can continue from (the newest last, at most a few): their
    /// iterations and this rank's file in each (its rank in the world that wrote it, or the
    /// saved rank it resumed from). A checkpoint in the run directory that is not one of them
    /// belongs to another job.
    pub(super) checkpoints: Vec<(u64, usize)>,
}

impl RankState {
    pub(super) fn new(progress: Option<Progress>) -> Result<Self, RunError> {
        Ok(Self {
            progress,
            faults: Fault::from_env().map_err(RunError::Fault)?,
            membership: Vec::new(),
            recovering: None,
            iteration: 0,
            samples: 0,
            curve: Vec::new(),
            traffic: Traffic::default(),
            start_traffic: Traffic::default(),
            checkpoints: Vec::new(),
        })
    }

    /// This job's checkpoint of `iterations` holds this rank's state as saved rank
    /// `saved_rank`. `latest` names one of the newest two a job sealed, so a few are enough.
    pub(super) fn remember_checkpoint(&mut self, iterations: u64, saved_rank: usize) {
        self.checkpoints.retain(|&(i, _)| i != iterations);
        self.checkpoints.push((iterations, saved_rank));
        let keep = 4;
        if self.checkpoints.len() > keep {
            self.checkpoints.drain(..self.checkpoints.len() - keep);
        }
    }
}

/// The new world completed its first iteration after a membership change (`since`: when the
/// failure reached this rank), or ended or failed again before one (`None`): time the
/// recovery, and (rank 0) append the change to the run directory's `membership.csv`.
pub(super) fn recovered(
    membership: &mut [MembershipChange],
    since: Option<Instant>,
    rank: usize,
    run_dir: Option<&Path>,
) -> Result<(), RunError> {
    let Some(change) = membership.last_mut() else {
        return Ok(());
    };
    change.recovery_seconds = since.map(|t| t.elapsed().as_secs_f64());
    if let (0, Some(dir)) = (rank, run_dir) {
        crate::metrics::append_membership(dir, change).map_err(output_error("membership.csv"))?;
    }
    Ok(())
}
