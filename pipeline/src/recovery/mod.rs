//! Surviving a failed rank (book: Fault tolerance): when a peer fails, the survivors shrink
//! the group ([`ProcessGroup::shrink`](localsgd_comm::ProcessGroup::shrink)), agree on the
//! last published checkpoint every one of them holds, and (with [`OnRankFailure::Replace`])
//! grow the group back ([`ProcessGroup::grow`](localsgd_comm::ProcessGroup::grow)), the lowest
//! live rank handing each replacement the failed rank's file of that checkpoint; the new world
//! then resumes from it and trains on. A failure is handled as a resume on another number of
//! ranks: each survivor continues from its own saved file ([`Start::ResumeFrom`]), a
//! replacement from the bytes it received ([`Start::Received`]).
//!
//! [`Recovery`] is one rank's side of it, across the worlds of a job: [`Recovery::run`] calls
//! your training of one world again after each failure with the new group and where it
//! starts. The training tells it what happened through three calls:
//! [`started`](Recovery::started) once it resumed, [`completed`](Recovery::completed) after each
//! iteration, and [`remember_checkpoint`](Recovery::remember_checkpoint) once every rank wrote
//! its file of a checkpoint (before it is published). A replacement (its group
//! [`joined`](localsgd_comm::ProcessGroup::joined)) starts with [`Recovery::join`]. Rank 0
//! records each change in the run directory's `membership.csv` ([`MembershipChange`]).
//!
//! The checkpoints are the run directory's [`Checkpoints`] by default; an entry point that
//! keeps its state elsewhere hands its own [`CheckpointStore`] to
//! [`with_store`](Recovery::with_store) (the burn-train strategy does).
//!
//! A peer's failure is what [`PipelineError::is_peer_lost`](crate::pipeline::PipelineError::is_peer_lost)
//! and [`CheckpointError::is_peer_lost`] say, or for an error type of your own that wraps them
//! [`is_peer_lost`](crate::pipeline::is_peer_lost); any other error ends the rank.

mod agree;
mod handover;
mod membership;
mod store;

pub use membership::{MEMBERSHIP_FILE, MembershipChange, append_membership};
pub use store::{CheckpointDirStore, CheckpointStore};

use crate::algorithm::AlgorithmSpec;
use crate::checkpoint::{CheckpointError, Checkpoints, Resumed};
use crate::pipeline::Pipeline;
use crate::settings::SettingError;
use burn::module::Module;
use localsgd_comm::{CommError, Group};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What the surviving ranks do when a rank fails during training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum OnRankFailure {
    /// End the job with the failure (its last checkpoint can be resumed).
    Abort,
    /// Shrink to the surviving ranks, go back to the last checkpoint and train on.
    Continue,
    /// As `continue`, and start a replacement for each failed rank, which takes the failed
    /// rank's state from a live rank: the world trains on at its full size.
    Replace,
}

impl std::str::FromStr for OnRankFailure {
    type Err = SettingError;

    /// `abort`, `continue` or `replace` (the setting's values).
    fn from_str(s: &str) -> Result<Self, SettingError> {
        match s {
            "abort" => Ok(Self::Abort),
            "continue" => Ok(Self::Continue),
            "replace" => Ok(Self::Replace),
            other => Err(SettingError::new(
                "on-rank-failure",
                other,
                "`abort`, `continue` or `replace`",
            )),
        }
    }
}

impl OnRankFailure {
    /// Whether the survivors of a failure train on (`continue`, `replace`).
    pub fn survives(self) -> bool {
        matches!(self, Self::Continue | Self::Replace)
    }
}

/// Where a rank's training of a world starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// From the model's initial weights, at iteration 0.
    Fresh,
    /// From its own file of the latest checkpoint (a resume on as many ranks).
    Resume,
    /// From saved rank `.0`'s file of the latest checkpoint, written by another number of ranks
    /// (a resume on another number, or the survivors of a rank failure).
    ResumeFrom(usize),
    /// From saved rank `saved_rank`'s file of the latest checkpoint, received from a live rank
    /// (a replacement of a failed rank).
    Received {
        /// The file's bytes.
        bytes: Vec<u8>,
        /// The rank that wrote it in the saving world.
        saved_rank: usize,
    },
}

impl Start {
    /// Take up this start on a pipeline of `spec` (its algorithm on this world) with its
    /// checkpoints: the model and state of the checkpoint, restored into `pipeline`.
    /// Collective. A [`Start::Fresh`] has no checkpoint to take up (train the model as it is):
    /// it is refused as [`CheckpointError::Incompatible`].
    pub fn resume<M: Module>(
        &self,
        checkpoints: &Checkpoints,
        spec: &AlgorithmSpec,
        model: M,
        pipeline: &mut Pipeline<M>,
    ) -> Result<Resumed<M>, CheckpointError> {
        match self {
            Start::Fresh => Err(CheckpointError::Incompatible(
                "a fresh start takes up no checkpoint: train the initial model".into(),
            )),
            Start::Resume => checkpoints.resume(model, pipeline),
            Start::ResumeFrom(saved) => checkpoints.resume_from(*saved, spec, model, pipeline),
            Start::Received { bytes, .. } => {
                checkpoints.resume_received(bytes, spec, model, pipeline)
            }
        }
    }

    /// The saved rank whose file this start takes (`rank`, this rank in the world, for
    /// [`Start::Resume`]); `None` for a fresh start.
    pub fn saved_rank(&self, rank: usize) -> Option<usize> {
        match self {
            Start::Fresh => None,
            Start::Resume => Some(rank),
            Start::ResumeFrom(saved)
            | Start::Received {
                saved_rank: saved, ..
            } => Some(*saved),
        }
    }
}

/// Why a recovery could not go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    /// A collective of the recovery failed (other than a peer's failure while growing, which
    /// is recovered from in turn).
    #[error("communication: {0}")]
    Comm(#[from] CommError),
    /// The checkpoint to continue from could not be agreed, read or received.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The survivors have nothing to continue from (no run directory).
    #[error(transparent)]
    Setting(#[from] SettingError),
    /// Every rank is alive after the shrink: the failure was not a lost rank.
    #[error("no rank was lost")]
    NoRankLost,
    /// `membership.csv` could not be written.
    #[error("writing {MEMBERSHIP_FILE}: {0}")]
    Record(#[source] std::io::Error),
}

/// One rank's side of surviving failed ranks, across the worlds of a job (module docs).
#[derive(Debug)]
pub struct Recovery {
    policy: OnRankFailure,
    /// Where `membership.csv` is written.
    dir: Option<PathBuf>,
    /// The checkpoints the survivors continue from.
    store: Option<Box<dyn CheckpointStore>>,
    workers: usize,
    /// This rank's rank in its current world (the one that records changes is rank 0).
    rank: usize,
    /// The checkpoints this job can continue from (the newest last, at most a few): their
    /// iterations and this rank's file in each (its rank in the world that wrote it, or the
    /// saved rank it resumed from). A checkpoint in the run directory that is not one of them
    /// belongs to another job.
    checkpoints: Vec<(u64, usize)>,
    membership: Vec<MembershipChange>,
    /// When the last membership change was detected, until the new world completes an
    /// iteration.
    recovering: Option<Instant>,
    /// Iterations completed (the pipeline's counter), as of the last one.
    iteration: u64,
}

/// What [`Recovery::join`] tells a replacement.
#[derive(Debug)]
pub struct Joined {
    /// Where it starts: the failed rank's file of the checkpoint the world continues from, or
    /// the start.
    pub start: Start,
    /// Iterations the old world had completed when the failure reached the live rank: what the
    /// failed rank did up to there has happened (its rehearsed faults, say).
    pub detected_at: u64,
}

/// What [`Recovery::recover`] continues with.
#[derive(Debug)]
pub struct Recovered {
    /// The new world: the survivors, grown back with replacements under `Replace`.
    pub group: Group,
    /// Where this rank's training of it starts.
    pub start: Start,
}

impl Recovery {
    /// A rank of a job of `workers` ranks training `spec` (the configured algorithm), whose
    /// checkpoints ([`Checkpoints`]) and `membership.csv` are in `dir`, doing `policy` when a
    /// peer fails. `rank` is its rank in the first world.
    pub fn new(
        policy: OnRankFailure,
        dir: Option<&Path>,
        spec: AlgorithmSpec,
        workers: usize,
        rank: usize,
    ) -> Self {
        Self {
            policy,
            dir: dir.map(Path::to_path_buf),
            store: dir
                .map(|d| Box::new(CheckpointDirStore::new(d, spec)) as Box<dyn CheckpointStore>),
            workers,
            rank,
            checkpoints: Vec::new(),
            membership: Vec::new(),
            recovering: None,
            iteration: 0,
        }
    }

    /// A replacement's recovery (its group [`joined`](localsgd_comm::ProcessGroup::joined)):
    /// receives the live rank's hand-over (collective with the live ranks'
    /// [`recover`](Self::recover)), which carries the job's number of workers and membership
    /// changes and the file it continues from.
    pub fn join(
        policy: OnRankFailure,
        dir: Option<&Path>,
        spec: AlgorithmSpec,
        grown: &Group,
    ) -> Result<(Self, Joined), RecoveryError> {
        let (handover, start, since) = handover::receive(grown)?;
        let mut recovery = Self::new(policy, dir, spec, handover.workers, grown.rank());
        recovery.membership = handover.membership.clone();
        recovery.recovering = Some(since);
        if let Some(saved_rank) = start.saved_rank(grown.rank()) {
            // Should this world fail before its first checkpoint, this rank goes back to the
            // same one (its file is in the run directory like everyone's).
            recovery.remember_checkpoint(handover.iterations(), saved_rank);
        }
        Ok((
            recovery,
            Joined {
                start,
                detected_at: handover.detected_at,
            },
        ))
    }

    /// Continue from the checkpoints of `store` instead of the run directory's
    /// [`Checkpoints`] (`membership.csv` stays in the directory given to [`new`](Self::new) or
    /// [`join`](Self::join)).
    pub fn with_store(mut self, store: Box<dyn CheckpointStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// What this rank does when a peer fails.
    pub fn policy(&self) -> OnRankFailure {
        self.policy
    }

    /// The job's configured number of ranks (the world may be smaller after a failure that was
    /// not replaced).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The changes of the ranks the job trained on so far, in order.
    pub fn membership(&self) -> &[MembershipChange] {
        &self.membership
    }

    /// This job's checkpoint of `iterations` holds this rank's state as saved rank
    /// `saved_rank`: call it once every rank wrote its file (before the checkpoint is
    /// published), and for the final checkpoint. `latest` names one of the newest two a job
    /// sealed, so a few are kept.
    pub fn remember_checkpoint(&mut self, iterations: u64, saved_rank: usize) {
        self.checkpoints.retain(|&(i, _)| i != iterations);
        self.checkpoints.push((iterations, saved_rank));
        let keep = 4;
        if self.checkpoints.len() > keep {
            self.checkpoints.drain(..self.checkpoints.len() - keep);
        }
    }

    /// A world's training took up `start` as rank `rank`, resuming a checkpoint of `resumed`
    /// iterations (`None`: fresh, at 0). The membership change that made this world continues
    /// from there.
    pub fn started(&mut self, start: &Start, rank: usize, resumed: Option<u64>) {
        self.rank = rank;
        self.iteration = resumed.unwrap_or(0);
        if self.recovering.is_some()
            && let Some(change) = self.membership.last_mut()
        {
            change.iteration = self.iteration;
        }
        if let (Some(done), Some(saved_rank)) = (resumed, start.saved_rank(rank)) {
            self.remember_checkpoint(done, saved_rank);
        }
    }

    /// The world completed an iteration; `iterations` are done in all. The first after a
    /// change times its recovery and (rank 0) records it.
    pub fn completed(&mut self, iterations: u64) -> Result<(), RecoveryError> {
        self.iteration = iterations;
        self.finished()
    }

    /// The world ended its training (nothing was left to train, say): a change it took over
    /// is recorded now, timed to here.
    pub fn finished(&mut self) -> Result<(), RecoveryError> {
        match self.recovering.take() {
            Some(since) => self.record(Some(since)),
            None => Ok(()),
        }
    }

    /// Time the last change (`None`: its world completed no iteration) and, on rank 0, append
    /// it to `membership.csv`.
    fn record(&mut self, since: Option<Instant>) -> Result<(), RecoveryError> {
        let Some(change) = self.membership.last_mut() else {
            return Ok(());
        };
        change.recovery_seconds = since.map(|t| t.elapsed().as_secs_f64());
        if let (0, Some(dir)) = (self.rank, &self.dir) {
            append_membership(dir, change).map_err(RecoveryError::Record)?;
        }
        Ok(())
    }

    /// After a peer's failure on `group` (which this rank met): shrink to the survivors, agree
    /// on the checkpoint to continue from, and under `Replace` grow back and hand the
    /// replacements their state. A failure of another rank meanwhile is recovered from in turn
    /// (the world is shrunk again, and not grown: a replacement that cannot get going would be
    /// replaced forever). Collective over the survivors (and the replacements).
    pub fn recover(&mut self, group: &Group) -> Result<Recovered, RecoveryError> {
        let mut group = group.clone();
        loop {
            let detected = Instant::now();
            let unrecovered = self.recovering.take().is_some();
            let survivors = group.shrink()?;
            self.rank = survivors.rank();
            // A change whose new world failed before completing an iteration here is recorded
            // now (by the survivors' rank 0: the old world's may be the rank that left).
            if unrecovered {
                self.record(None)?;
            }
            let old: Vec<usize> = group.world_ranks().to_vec();
            let members: Vec<usize> = survivors.world_ranks().to_vec();
            let left: Vec<usize> = old
                .iter()
                .copied()
                .filter(|r| !members.contains(r))
                .collect();
            if left.is_empty() {
                return Err(RecoveryError::NoRankLost);
            }
            let (next, failed_again) = agree::continue_point(
                &self.checkpoints,
                &survivors,
                self.store.as_deref(),
                unrecovered,
            )?;
            let replace = self.policy == OnRankFailure::Replace && !failed_again;
            let mut failed_growing = false;
            let (next_group, joined) = match replace.then(|| survivors.grow(&left)) {
                Some(Ok(grown)) => (grown, left.clone()),
                Some(Err(e)) => {
                    if e.is_peer_lost() {
                        // A survivor failed meanwhile: the survivors' world failed in turn.
                        failed_growing = true;
                    } else {
                        tracing::warn!(
                            "could not start replacements for ranks {left:?} ({e}): the \
                             survivors continue without them"
                        );
                    }
                    (survivors, Vec::new())
                }
                None => (survivors, Vec::new()),
            };
            tracing::warn!(
                ?left,
                ?joined,
                world = next_group.size(),
                "a rank failed; the world continues from the last checkpoint"
            );
            let replacing = !joined.is_empty();
            self.membership.push(MembershipChange {
                // Set when the new world has resumed (0: no checkpoint, the start).
                iteration: 0,
                detected_at: self.iteration,
                left,
                joined,
                members: next_group.world_ranks().to_vec(),
                recovery_seconds: None,
            });
            self.recovering = Some(detected);
            self.rank = next_group.rank();
            if replacing {
                let prepared = handover::PreparedHandover::new(
                    &next,
                    self.iteration,
                    detected,
                    self.workers,
                    &self.membership,
                    self.store.as_deref(),
                );
                match handover::send(&next_group, prepared) {
                    Ok(()) => {}
                    // The replacement or a survivor failed during the hand-over: the new
                    // world failed; it is shrunk again (and not grown).
                    Err(e) if e.is_peer_lost() => failed_growing = true,
                    Err(e) => return Err(e.into()),
                }
            }
            if !failed_growing {
                return Ok(Recovered {
                    group: next_group,
                    start: next,
                });
            }
            group = next_group;
        }
    }

    /// Train world after world: `train(group, start, self)` trains one world from `start`
    /// (telling this recovery what happened: module docs) and returns its result; when it
    /// fails with a peer's failure (`is_peer_lost`) and the policy survives, the world is
    /// recovered ([`recover`](Self::recover)) and `train` called again on the new one.
    /// Returns the result and the final world. A failure that was not a lost rank after all
    /// (every rank alive) ends it with that failure. A policy that survives on a group that
    /// cannot shrink (NCCL) is refused before `train` runs.
    pub fn run<T, E>(
        &mut self,
        group: Group,
        start: Start,
        is_peer_lost: impl Fn(&E) -> bool,
        mut train: impl FnMut(&Group, Start, &mut Self) -> Result<T, E>,
    ) -> Result<(T, Group), E>
    where
        E: From<RecoveryError> + std::fmt::Display,
    {
        if self.policy.survives() && group.backend() == "nccl" {
            let value = match self.policy {
                OnRankFailure::Replace => "replace",
                _ => "continue",
            };
            return Err(RecoveryError::Setting(SettingError::new(
                "on-rank-failure",
                value,
                "`abort` with an NCCL group: continuing after a rank failure needs the thread \
                 backend, or MPI with ULFM (`mpirun --with-ft ulfm`); resume the last \
                 checkpoint on the surviving ranks instead",
            ))
            .into());
        }
        let (mut group, mut start) = (group, start);
        loop {
            let failure = match train(&group, start, self) {
                Ok(result) => return Ok((result, group)),
                Err(e) if self.policy.survives() && is_peer_lost(&e) => {
                    tracing::warn!("a rank failed ({e}): recovering");
                    e
                }
                Err(e) => return Err(e),
            };
            match self.recover(&group) {
                Ok(next) => {
                    group = next.group;
                    start = next.start;
                }
                Err(RecoveryError::NoRankLost) => return Err(failure),
                Err(e) => return Err(e.into()),
            }
        }
    }
}
