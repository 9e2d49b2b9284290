//! The per-rank run on any group ([`run_rank`]) and on threads ([`train_threads`]), and what
//! `on-rank-failure` does when a rank fails: the survivors' shrink, their agreement on the
//! checkpoint to continue from, the world's growth with replacements and the hand-over of a
//! live rank's state.

use super::error::RunError;
use super::result::{RunTotals, WorkerResult};
use super::setup::effective_settings;
use super::state::{Progress, RankState, Start, recovered};
use super::worker::train_from;
use crate::config::{RankFailure, SettingError, TrainConfig};
use crate::metrics::MembershipChange;
use localsgd_comm::{CommError, Group, GroupExt};
use localsgd_models::data::TrainTest;
use localsgd_pipeline::checkpoint::CheckpointError;
use std::path::Path;
use std::time::{Duration, Instant};

/// What one rank's run ends with: its own result, the totals over every rank, and the job's
/// training wall time (the slowest rank's).
#[derive(Debug, Clone)]
pub struct RankOutcome {
    /// This rank's own result.
    pub result: WorkerResult,
    /// Communication, samples and per-rank evaluations summed over the group (the same on every
    /// rank).
    pub totals: RunTotals,
    /// The slowest rank's training wall time in seconds (the job is as fast as its slowest
    /// rank; the same on every rank).
    pub wall_seconds: f64,
    /// The configured number of workers (the world's size at the start; a replacement learns
    /// it from the rank that handed it its state).
    pub workers: usize,
    /// The changes of the ranks the run trained on, in order (`on-rank-failure =
    /// "continue"` or `"replace"`; empty when every rank finished). The same on every rank of
    /// the final world except `recovery_seconds`, each rank's own.
    pub membership: Vec<MembershipChange>,
}

/// The per-rank run every backend executes (threads: one per thread, [`train_threads`]; MPI and
/// NCCL: one per process): [`train_worker`], then the slowest rank's wall time and
/// [`RunTotals::gather`]. Collective.
///
/// With `on-rank-failure = "continue"`, a peer's failure during training does not end the
/// rank: the survivors shrink the group ([`ProcessGroup::shrink`](localsgd_comm::ProcessGroup::shrink)),
/// take up the last published checkpoint (each its own saved state; none: the start) and train
/// on; the totals are then the survivors'. With `"replace"` they first grow the group back
/// ([`ProcessGroup::grow`](localsgd_comm::ProcessGroup::grow)) and the lowest live rank hands
/// each new rank the failed rank's file of that checkpoint; a new rank (its group
/// [`joined`](localsgd_comm::ProcessGroup::joined)) calls this too and starts by receiving it.
/// A failure while growing, or of a world that has not trained an iteration yet, is handled as
/// with `"continue"` (no new replacement).
pub fn run_rank(
    cfg: &TrainConfig,
    group: Group,
    data: &TrainTest,
    run_dir: Option<&Path>,
    progress: Option<Progress>,
) -> Result<RankOutcome, RunError> {
    let started = Instant::now();
    let mut state = RankState::new(progress)?;
    let mut group = group;
    // A replacement learns where to start, and the configured number of workers, from a live
    // rank.
    let (mut start, workers) = if group.joined() {
        receive_handover(&group, &mut state)?
    } else {
        (Start::configured(cfg, group.rank()), group.size())
    };
    let job_rank = group
        .world_ranks()
        .get(group.rank())
        .copied()
        .unwrap_or(group.rank());
    // `warmup-epochs` becomes steps once, on the configured world (a replacement: as the rank it
    // replaces did): the worlds after a failure keep the schedule.
    let mut fixed = effective_settings(cfg, data, workers, job_rank)?
        .0
        .into_owned();
    fixed.warmup_epochs = None;
    fixed.workers = workers;
    let cfg = &fixed;
    // A failure met while growing the world back, to handle before training again.
    let mut pending: Option<RunError> = None;
    let result = loop {
        let failure = match pending.take() {
            Some(failure) => failure,
            None => {
                let traffic_before = group.traffic();
                match train_from(cfg, group.clone(), data, run_dir, start, &mut state) {
                    Ok(result) => break result,
                    Err(e) if cfg.on_rank_failure.survives() && is_peer_failure(&e) => {
                        state.traffic += group.traffic() - traffic_before;
                        e
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let detected = Instant::now();
        let unrecovered = state.recovering.take().is_some();
        let survivors = group.shrink()?;
        // A change whose new world failed before completing an iteration here is recorded now
        // (by the survivors' rank 0: the old world's may be the rank that left).
        if unrecovered {
            recovered(&mut state.membership, None, survivors.rank(), run_dir)?;
        }
        let old: Vec<usize> = group.world_ranks().to_vec();
        let members: Vec<usize> = survivors.world_ranks().to_vec();
        let left: Vec<usize> = old
            .iter()
            .copied()
            .filter(|r| !members.contains(r))
            .collect();
        if left.is_empty() {
            // Every rank is alive: the failure was not a lost rank after all.
            return Err(failure);
        }
        let (next, failed_again) = continue_point(&state, &survivors, run_dir, unrecovered)?;
        // A world that failed again before training an iteration is not grown again (a
        // replacement that cannot get going would be replaced forever): it continues as is.
        let replace = cfg.on_rank_failure == RankFailure::Replace && !failed_again;
        let mut grow_failure = None;
        let (next_group, joined) = match replace.then(|| survivors.grow(&left)) {
            Some(Ok(grown)) => (grown, left.clone()),
            Some(Err(e)) => {
                if e.is_peer_lost() {
                    // A survivor failed meanwhile: the survivors' world failed in turn.
                    grow_failure = Some(RunError::from(e));
                } else {
                    tracing::warn!(
                        "could not start replacements for ranks {left:?} ({e}): the survivors \
                         continue without them"
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
            "a rank failed ({failure}); the world continues from the last checkpoint"
        );
        let replacing = !joined.is_empty();
        state.membership.push(MembershipChange {
            // Set when the new world has resumed (0: no checkpoint, the start).
            iteration: 0,
            detected_at: state.iteration,
            left,
            joined,
            members: next_group.world_ranks().to_vec(),
            recovery_seconds: None,
        });
        state.recovering = Some(detected);
        if replacing {
            let handover = Handover::prepare(cfg, &state, &next, detected, run_dir);
            if let Err(e) = send_handover(&next_group, handover) {
                // The replacement or a survivor failed during the hand-over: the new world
                // failed; it is shrunk again (and not grown).
                grow_failure = Some(e);
            }
        }
        start = next;
        group = next_group;
        if let Some(e) = grow_failure {
            if !is_peer_failure(&e) {
                return Err(e);
            }
            pending = Some(e);
        }
    };
    let mut wall = [started.elapsed().as_secs_f64()];
    group.all_reduce_slice(&mut wall, localsgd_comm::ReduceOp::Max)?;
    let totals = RunTotals::gather(&group, &result)?;
    Ok(RankOutcome {
        result,
        totals,
        wall_seconds: wall[0],
        workers: cfg.workers,
        membership: state.membership,
    })
}

/// What a live rank hands a replacement that joined the world (`on-rank-failure = "replace"`),
/// before the rank file it continues from.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Handover {
    /// The saved rank whose file of the latest checkpoint follows (`None`: the world starts
    /// over from the initial weights, there being no checkpoint of this job).
    saved_rank: Option<usize>,
    /// Iterations that checkpoint holds (0 without one).
    iterations: u64,
    /// Iterations the old world had completed when the failure reached it: the replaced
    /// rank's injected faults up to there have happened.
    detected_at: u64,
    /// Seconds from the failure reaching the sender to the hand-over (the replacement's
    /// recovery time starts that much earlier).
    since_detected: f64,
    /// The configured number of workers (the world may be smaller after a failure that was
    /// not replaced).
    workers: usize,
    /// The run's membership changes so far, this one last.
    membership: Vec<MembershipChange>,
    /// Why the sender could not hand over the state (the replacement then leaves, and the
    /// world goes on without it).
    error: Option<String>,
}

impl Handover {
    /// What the sender hands a replacement: `start` is where the world continues (the
    /// sender's own saved rank of the latest checkpoint, or the start).
    fn prepare(
        cfg: &TrainConfig,
        state: &RankState,
        start: &Start,
        detected: Instant,
        run_dir: Option<&Path>,
    ) -> PreparedHandover {
        PreparedHandover {
            header: Self {
                saved_rank: None,
                iterations: 0,
                detected_at: state.iteration,
                since_detected: 0.0,
                workers: cfg.workers,
                membership: state.membership.clone(),
                error: None,
            },
            own: match start {
                Start::ResumeFrom(own) => Some(*own),
                _ => None,
            },
            detected,
            dir: run_dir.map(Path::to_path_buf),
            spec: cfg.algorithm_spec().map_err(|e| e.to_string()),
        }
    }
}

/// A [`Handover`] before the sender picks each replacement's file.
struct PreparedHandover {
    header: Handover,
    /// The sender's saved rank in the latest checkpoint (`None`: no checkpoint).
    own: Option<usize>,
    detected: Instant,
    dir: Option<std::path::PathBuf>,
    spec: Result<localsgd_pipeline::algorithm::AlgorithmSpec, String>,
}

impl PreparedHandover {
    /// The message for the replacement of world rank `job_rank`: the header, then the file of
    /// the rank that held `job_rank` in the saving world (or, when it held none, the sender's
    /// own), or the header with `error` set.
    fn message(&self, job_rank: usize) -> Vec<u8> {
        let mut header = Handover {
            since_detected: self.detected.elapsed().as_secs_f64(),
            membership: self.header.membership.clone(),
            error: None,
            ..self.header
        };
        let file = (|| -> Result<Option<(usize, Vec<u8>, u64)>, String> {
            let (Some(own), Some(dir)) = (self.own, &self.dir) else {
                return Ok(None);
            };
            let spec = self.spec.as_ref().map_err(String::clone)?;
            let checkpoints = localsgd_pipeline::checkpoint::CheckpointDir::new(dir);
            let (_, saved) = checkpoints.latest_identity().map_err(|e| e.to_string())?;
            let saved_rank = saved
                .member_ranks()
                .iter()
                .position(|&m| m == job_rank)
                .unwrap_or(own);
            let (bytes, iterations) = checkpoints
                .latest_rank_bytes(saved_rank, spec)
                .map_err(|e| e.to_string())?;
            Ok(Some((saved_rank, bytes, iterations)))
        })();
        let bytes = match file {
            Ok(Some((saved_rank, bytes, iterations))) => {
                header.saved_rank = Some(saved_rank);
                header.iterations = iterations;
                bytes
            }
            Ok(None) => Vec::new(),
            Err(e) => {
                header.error = Some(e);
                Vec::new()
            }
        };
        // A plain struct of numbers, strings and lists always serializes.
        let json = serde_json::to_vec(&header).unwrap_or_default();
        let mut message = Vec::with_capacity(8 + json.len() + bytes.len());
        message.extend_from_slice(&(json.len() as u64).to_le_bytes());
        message.extend_from_slice(&json);
        message.extend_from_slice(&bytes);
        message
    }
}

/// The live ranks' side of a replacement joining `grown` (collective over it, with
/// [`receive_handover`] on the new ranks): the lowest live rank sends each new rank, in rank
/// order, its [`Handover`] message. It always sends one, with `error` set when it could not
/// read the file, so that no rank waits for a message that never comes.
fn send_handover(grown: &Group, handover: PreparedHandover) -> Result<(), RunError> {
    let (joined, root) = handover_layout(grown)?;
    for &new in &joined {
        let mut message = if grown.rank() == root {
            handover.message(grown.world_ranks()[new])
        } else {
            Vec::new()
        };
        grown.broadcast_bytes(&mut message, root)?;
    }
    Ok(())
}

/// A replacement's side of [`send_handover`]: where it starts (the file it received, or the
/// start) and the configured number of workers, and the run's state it takes over
/// (membership changes, the recovery's start; its predecessor's injected faults that already
/// happened are dropped). A message with `error` set ends it with that error.
fn receive_handover(grown: &Group, state: &mut RankState) -> Result<(Start, usize), RunError> {
    let (joined, root) = handover_layout(grown)?;
    let mut mine = None;
    for &new in &joined {
        let mut message = Vec::new();
        grown.broadcast_bytes(&mut message, root)?;
        if new == grown.rank() {
            mine = Some(message);
        }
    }
    let bad = |why: &str| {
        RunError::Checkpoint(CheckpointError::Incompatible(format!(
            "the state a live rank handed this replacement is unusable: {why}"
        )))
    };
    let message = mine.ok_or_else(|| bad("no hand-over for this rank"))?;
    let (header, file) = message
        .split_first_chunk::<8>()
        .and_then(|(len, rest)| {
            let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
            (len <= rest.len()).then(|| rest.split_at(len))
        })
        .ok_or_else(|| bad("shorter than its header"))?;
    let handover: Handover = serde_json::from_slice(header).map_err(|e| bad(&e.to_string()))?;
    if let Some(e) = handover.error {
        return Err(bad(&e));
    }
    let job_rank = grown.world_ranks()[grown.rank()];
    state
        .faults
        .retain(|f| !(f.rank == job_rank && f.iteration <= handover.detected_at));
    state.membership = handover.membership;
    // The recovery started at the failure (the sender's time to it, not counting the
    // transfer).
    let now = Instant::now();
    state.recovering = Some(
        Duration::try_from_secs_f64(handover.since_detected)
            .ok()
            .and_then(|d| now.checked_sub(d))
            .unwrap_or(now),
    );
    let start = match handover.saved_rank {
        Some(saved_rank) => {
            // Should this world fail before its first checkpoint, this rank goes back to the
            // same one (its file is in the run directory like everyone's).
            state.remember_checkpoint(handover.iterations, saved_rank);
            Start::Received {
                bytes: file.to_vec(),
                saved_rank,
            }
        }
        None => Start::Fresh,
    };
    Ok((start, handover.workers))
}

/// The new ranks of a grown world (group ranks, ascending) and the live rank that hands them
/// their state (the lowest rank that did not join). Collective.
fn handover_layout(grown: &Group) -> Result<(Vec<usize>, usize), RunError> {
    let flags = grown.all_gather_u64(&[u64::from(grown.joined())])?;
    let joined: Vec<usize> = (0..grown.size()).filter(|&r| flags[r] == 1).collect();
    let root = (0..grown.size()).find(|&r| flags[r] == 0).ok_or_else(|| {
        RunError::Comm(CommError::InvalidConfig(
            "a grown world without a live rank to hand the replacements their state".into(),
        ))
    })?;
    Ok((joined, root))
}

/// Where the survivors continue after a rank failure: the last published checkpoint, if it is
/// one of this job's (this rank's file in it: [`RankState::remember_checkpoint`]); the start
/// when there is none, or when `latest` names another job's checkpoint (a run directory used
/// before) that this job neither wrote nor resumed from.
fn continue_point(
    state: &RankState,
    survivors: &Group,
    run_dir: Option<&Path>,
    failed_again: bool,
) -> Result<(Start, bool), RunError> {
    let dir = run_dir.ok_or_else(|| {
        RunError::Config(SettingError::new(
            "on-rank-failure",
            "continue",
            "`abort`, or a run directory: the survivors continue from its last checkpoint",
        ))
    })?;
    let latest = match localsgd_pipeline::checkpoint::CheckpointDir::new(dir).latest_iterations() {
        Ok(i) => Some(i),
        Err(CheckpointError::Missing(_)) => None,
        Err(e) => return Err(e.into()),
    };
    // Every survivor must continue from the same checkpoint: a file system that shows the
    // hosts different `latest` files (stale metadata caches) would part them. Whether the
    // world failed again before an iteration is agreed too (a survivor may have completed the
    // iteration another did not).
    let gathered =
        survivors.all_gather_u64(&[latest.unwrap_or(u64::MAX), u64::from(failed_again)])?;
    let failed_again = gathered.chunks(2).any(|g| g[1] == 1);
    let seen: Vec<u64> = gathered.chunks(2).map(|g| g[0]).collect();
    if seen.iter().any(|&s| s != seen[0]) {
        let named: Vec<String> = seen
            .iter()
            .map(|&s| match s {
                u64::MAX => "none".to_string(),
                s => s.to_string(),
            })
            .collect();
        return Err(RunError::Checkpoint(CheckpointError::Incompatible(
            format!(
                "the survivors see different latest checkpoints in {} (by rank: {}): the run \
             directory must be on a file system that shows every rank the same files",
                dir.display(),
                named.join(", ")
            ),
        )));
    }
    let Some(latest) = latest else {
        return Ok((Start::Fresh, failed_again));
    };
    let start = match state.checkpoints.iter().find(|&&(i, _)| i == latest) {
        Some(&(_, saved_rank)) => Start::ResumeFrom(saved_rank),
        None => {
            tracing::warn!(
                latest,
                "the latest checkpoint in {} is not this job's: the survivors start over",
                dir.display()
            );
            Start::Fresh
        }
    };
    Ok((start, failed_again))
}

/// Run all ranks as threads of this process; results in rank order. A worker that panics is
/// reported as a communication failure of its peers plus the panic itself. With
/// `on-rank-failure = "continue"`, ranks that fail (a panic or an error of their own) leave and
/// the survivors' outcomes are returned, in their final rank order; the run fails only when no
/// rank finished.
pub fn train_threads(
    cfg: &TrainConfig,
    data: &TrainTest,
    run_dir: Option<&Path>,
    progress: Option<Progress>,
) -> Result<Vec<RankOutcome>, RunError> {
    let world = localsgd_comm::ThreadWorld::new(cfg.workers)?
        .with_timeout(Duration::from_secs(cfg.timeout_secs));
    let progress = std::sync::Mutex::new(progress);
    let results: Vec<Result<RankOutcome, RunError>> = world
        .run_each(|group| {
            let p = if group.rank() == 0 {
                progress.lock().ok().and_then(|mut p| p.take())
            } else {
                None
            };
            run_rank(cfg, group, data, run_dir, p)
        })
        .into_iter()
        .map(|r| {
            r.map_err(|p| RunError::WorkerPanicked {
                rank: p.rank,
                message: p.message,
            })
            .and_then(|r| r)
        })
        .collect();
    if cfg.on_rank_failure.survives() && results.iter().any(Result::is_ok) {
        let mut ok = Vec::new();
        for r in results {
            match r {
                Ok(o) => ok.push(o),
                Err(e) => tracing::warn!("a rank left the run: {e}"),
            }
        }
        ok.sort_by_key(|o| o.result.rank);
        return Ok(ok);
    }
    if cfg.on_rank_failure.survives() {
        // No rank finished: the survivors' own reason to stop (a level that no longer fits
        // their world, say) is the root cause, not the failure they survived.
        let mut results = results;
        if let Some(i) = results.iter().position(|r| {
            r.as_ref().is_err_and(|e| {
                !matches!(e, RunError::WorkerPanicked { .. }) && !is_peer_failure(e)
            })
        }) && let Err(e) = results.swap_remove(i)
        {
            return Err(e);
        }
        return first_error(results);
    }
    first_error(results)
}

/// The outcomes, or the root cause of a failure: a panic first, then a rank's own error before
/// its peers' "rank N failed" errors.
fn first_error(results: Vec<Result<RankOutcome, RunError>>) -> Result<Vec<RankOutcome>, RunError> {
    let mut ok = Vec::with_capacity(results.len());
    let mut first_err: Option<RunError> = None;
    for r in results {
        match r {
            Ok(w) => ok.push(w),
            Err(e) => {
                let replace = match &first_err {
                    None => true,
                    Some(prev) => {
                        !matches!(prev, RunError::WorkerPanicked { .. })
                            && (matches!(e, RunError::WorkerPanicked { .. })
                                || (is_peer_failure(prev) && !is_peer_failure(&e)))
                    }
                };
                if replace {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(ok),
    }
}

/// A peer's failure as this rank sees it, wherever it surfaced (a phase's collective, the
/// gradient hook, the averager, a checkpoint's barriers, setup): the libraries' own
/// `is_peer_lost`.
fn is_peer_failure(e: &RunError) -> bool {
    match e {
        RunError::Pipeline(p) => p.is_peer_lost(),
        RunError::Checkpoint(c) => c.is_peer_lost(),
        RunError::Comm(c) => c.is_peer_lost(),
        _ => false,
    }
}
