//! The per-rank run on any group ([`run_rank`]) and on threads ([`train_threads`]), and what
//! `on-rank-failure` does when a rank fails: the survivors' shrink, their agreement on the
//! checkpoint to continue from, the world's growth with replacements and the hand-over of a
//! live rank's state.

use super::error::RunError;
use super::result::{RunTotals, WorkerResult};
use super::setup::effective_settings;
use super::state::{Progress, RankState, configured_start, job_rank};
use super::worker::train_from;
use crate::config::TrainConfig;
use localsgd_comm::{Group, GroupExt};
use localsgd_models::data::TrainTest;
use localsgd_pipeline::recovery::{MembershipChange, Recovery};
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
/// Failures are handled by the pipeline's [`Recovery`] (`localsgd_pipeline::recovery`), as a
/// user's loop would: with `on-rank-failure = "continue"`, a peer's failure during training does
/// not end the rank: the survivors shrink the group ([`ProcessGroup::shrink`](localsgd_comm::ProcessGroup::shrink)),
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
    let spec = cfg.algorithm_spec()?;
    // A replacement learns where to start, and the configured number of workers, from a live
    // rank; its predecessor's injected faults that already happened are dropped.
    let (mut recovery, start) = if group.joined() {
        let (recovery, joined) = Recovery::join(cfg.on_rank_failure, run_dir, spec, &group)?;
        let job_rank = job_rank(&group);
        state
            .faults
            .retain(|f| !(f.rank == job_rank && f.iteration <= joined.detected_at));
        (recovery, joined.start)
    } else {
        let recovery = Recovery::new(
            cfg.on_rank_failure,
            run_dir,
            spec,
            group.size(),
            group.rank(),
        );
        (recovery, configured_start(cfg, group.rank()))
    };
    let workers = recovery.workers();
    let job_rank = job_rank(&group);
    // `warmup-epochs` becomes steps once, on the configured world (a replacement: as the rank it
    // replaces did): the worlds after a failure keep the schedule.
    let mut fixed = effective_settings(cfg, data, workers, job_rank)?
        .0
        .into_owned();
    fixed.warmup_epochs = None;
    fixed.workers = workers;
    let cfg = &fixed;
    let (result, group) =
        recovery.run(group, start, is_peer_failure, |group, start, recovery| {
            let traffic_before = group.traffic();
            let trained = train_from(
                cfg,
                group.clone(),
                data,
                run_dir,
                start,
                &mut state,
                recovery,
            );
            if trained.is_err() {
                state.traffic += group.traffic() - traffic_before;
            }
            trained
        })?;
    let mut wall = [started.elapsed().as_secs_f64()];
    group.all_reduce_slice(&mut wall, localsgd_comm::ReduceOp::Max)?;
    let totals = RunTotals::gather(&group, &result)?;
    Ok(RankOutcome {
        result,
        totals,
        wall_seconds: wall[0],
        workers,
        membership: recovery.membership().to_vec(),
    })
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
