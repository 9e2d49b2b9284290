//! What watches a rank's training loop between iterations ([`IterationObserver`]): the rank's
//! metrics rows, rank 0's progress, loss curve and test-set evaluations, checkpoint
//! publishing, and rehearsed faults ([`crate::fault`]).

use super::error::{RunError, output_error};
use super::evaluation::accuracy;
use super::inject::inject;
use super::loader::ShardEnd;
use super::state::RankState;
use crate::config::TrainConfig;
use crate::fault::{Fault, FaultKind};
use crate::metrics::{EvalWriter, MetricsWriter};
use burn::tensor::Device;
use localsgd_comm::Group;
use localsgd_models::data::Dataset;
use localsgd_models::network::Network;
use localsgd_pipeline::checkpoint::Checkpoints;
use localsgd_pipeline::pipeline::{IterationObserver, IterationReport, ObserverError};
use localsgd_pipeline::recovery::Recovery;
use std::cell::Cell;
use std::time::Duration;

/// The binary's [`IterationObserver`] on one rank of one world.
pub(super) struct RunObserver<'a> {
    pub(super) cfg: &'a TrainConfig,
    pub(super) group: &'a Group,
    /// The rank in the job's first world: what faults and membership records name.
    pub(super) job_rank: usize,
    /// What spans worlds: faults left, samples, the loss curve, progress.
    pub(super) state: &'a mut RankState,
    /// The recovery's record: completed iterations, checkpoints every rank holds, membership.
    pub(super) recovery: &'a mut Recovery,
    /// This rank's metrics file (with a run directory).
    pub(super) metrics: Option<MetricsWriter>,
    /// Rank 0's `eval.csv` (with a run directory and `eval-every`).
    pub(super) evals: Option<EvalWriter>,
    /// The run's checkpoints, when it writes any.
    pub(super) checkpoints: Option<&'a Checkpoints>,
    /// The group the ranks meet on before rank 0 publishes a checkpoint (not counted as
    /// training traffic).
    pub(super) publish_sync: Option<Group>,
    pub(super) test: &'a Dataset,
    pub(super) device: &'a Device,
    /// The run's iterations in all (resumed ones included).
    pub(super) total: u64,
    /// A `step` fault for the forward pass of the iteration about to start.
    pub(super) mid_step: &'a Cell<Option<Fault>>,
    /// Ends the loader's epoch (a `short` fault).
    pub(super) shard_end: ShardEnd,
    /// The phases' wall time in this world so far (what `eval.csv` records).
    pub(super) trained: Duration,
    /// The last all-reduced mean loss.
    pub(super) last_global: Option<f64>,
}

impl RunObserver<'_> {
    /// Sync this rank's metrics file and (rank 0) the evaluation file: before a checkpoint is
    /// published, and at the end.
    pub(super) fn sync_files(&mut self) -> Result<(), RunError> {
        if let Some(w) = &mut self.metrics {
            w.sync().map_err(output_error("metrics"))?;
        }
        if let Some(e) = &mut self.evals {
            e.sync().map_err(output_error("eval.csv"))?;
        }
        Ok(())
    }

    /// Remove and return this rank's fault of `kind` (or any kind but `checkpoint`) due at
    /// `iteration`.
    fn take_fault(&mut self, iteration: u64, checkpoint: bool) -> Option<Fault> {
        let i = self.state.faults.iter().position(|f| {
            (f.kind == FaultKind::Checkpoint) == checkpoint && f.due(self.job_rank, iteration)
        })?;
        Some(self.state.faults.remove(i))
    }

    fn before(&mut self, iteration: u64) -> Result<(), RunError> {
        if let Some(f) = self.take_fault(iteration, false) {
            if f.kind == FaultKind::Step {
                self.mid_step.set(Some(f));
            } else {
                inject(f, self.cfg, self.group, &self.shard_end)?;
            }
        }
        Ok(())
    }

    fn after(&mut self, report: &IterationReport, model: &Network) -> Result<(), RunError> {
        let rank = self.group.rank();
        let done = report.iteration + 1;
        self.trained += report.times.total();
        self.recovery.completed(done)?;
        // Each micro-batch a batch (the last of an epoch may hold fewer rows).
        self.state.samples += (report.micro_batches * self.cfg.batch_size) as u64;
        if report.global_loss.is_some() {
            self.last_global = report.global_loss;
        }
        if let Some(w) = &mut self.metrics {
            let epoch = report.data.map_or(0, |d| d.epoch);
            w.record(epoch, report.lr, report)
                .map_err(output_error("metrics"))?;
        }
        if rank == 0 {
            self.state
                .curve
                .push((report.iteration as f64, report.loss as f64));
            if let Some(p) = &mut self.state.progress {
                p(done, self.total, self.last_global);
            }
            if let Some(e) = &mut self.evals
                && (done.is_multiple_of(self.cfg.eval_every) || done == self.total)
            {
                let acc = accuracy(model, self.test, self.device)?;
                e.record(done, self.trained.as_secs_f64(), acc)
                    .map_err(output_error("eval.csv"))?;
            }
        }
        // The checkpoint phase sealed a checkpoint of `done` iterations: make every rank's
        // rows up to it durable, then let a resume take it.
        if let Some(checkpoints) = self.checkpoints
            && self.cfg.checkpoint_every > 0
            && done.is_multiple_of(self.cfg.checkpoint_every)
        {
            if let Some(f) = self.take_fault(done, true) {
                inject(f, self.cfg, self.group, &self.shard_end)?;
            }
            self.sync_files()?;
            if let Some(g) = &self.publish_sync {
                g.barrier()?;
            }
            // Every rank wrote its file: this world may continue from it.
            self.recovery.remember_checkpoint(done, rank);
            if rank == 0 {
                checkpoints.publish(done)?;
            }
        }
        Ok(())
    }
}

impl IterationObserver<Network> for RunObserver<'_> {
    fn before_iteration(&mut self, iteration: u64) -> Result<(), ObserverError> {
        self.before(iteration).map_err(Into::into)
    }

    fn after_iteration(
        &mut self,
        report: &IterationReport,
        model: &Network,
    ) -> Result<bool, ObserverError> {
        self.after(report, model)?;
        Ok(true)
    }
}

/// A pipeline error as the run reports it: an observer's own [`RunError`] unwrapped (so that
/// a peer's failure met while publishing a checkpoint is recognized as one), anything else as
/// the pipeline's.
pub(super) fn observed(e: localsgd_pipeline::pipeline::PipelineError) -> RunError {
    use localsgd_pipeline::pipeline::PipelineError;
    match e {
        PipelineError::Observer(b) => match b.downcast::<RunError>() {
            Ok(e) => *e,
            Err(b) => RunError::Pipeline(PipelineError::Observer(b)),
        },
        e => RunError::Pipeline(e),
    }
}
