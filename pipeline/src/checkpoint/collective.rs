//! Collective save and resume of any burn [`Module`]: what a training loop calls (see the
//! [module documentation](super) for an example).

use super::{CheckpointDir, CheckpointError, RankCheckpoint, RunIdentity};
use crate::algorithm::AlgorithmSpec;
use crate::pipeline::{
    CheckpointContext, Checkpointer, DataPosition, Phase, Pipeline, PipelineError, RestoredState,
    refresh_buffers,
};
use burn::module::Module;
use localsgd_comm::params::ParamSelection;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether a save points `checkpoints/latest` at its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Publish {
    /// Seal and publish: from the save's last barrier on, a resume continues from it.
    #[default]
    Now,
    /// Only seal (the checkpoint is complete on disk, `latest` still names the previous one):
    /// the caller makes durable first what must survive with it, then calls
    /// [`Checkpoints::publish`] on one rank. The `localsgd` binary syncs every rank's metrics
    /// rows up to the checkpoint in between, so the rows a resume keeps are its iterations.
    Later,
}

/// The checkpoints of one run: its `run_dir/checkpoints/` directory and the [`RunIdentity`]
/// every checkpoint records and a resume must match. Gives the checkpoint phase its
/// [`checkpointer`](Self::checkpointer), saves the current state outside it
/// ([`save_state`](Self::save_state), [`save_final`](Self::save_final)) and
/// [`resume`](Self::resume)s a fresh model and pipeline.
///
/// Every rank builds one (with the same directory and identity) and calls the saves at the same
/// iteration: they are collective. Clones share what was saved and resumed (which
/// [`save_final`](Self::save_final) consults): build one per run and clone it into the
/// checkpointer.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    dir: CheckpointDir,
    identity: RunIdentity,
    /// How many of the newest checkpoints publishing keeps (0: all).
    keep: usize,
    /// Iterations held by the newest checkpoint this run saved or resumed from (0: none).
    latest: Arc<AtomicU64>,
}

/// What [`Checkpoints::resume`] hands back besides the restored pipeline.
#[derive(Debug)]
pub struct Resumed<M> {
    /// The model with this rank's saved parameters (and their saved `ParamId`s, so the restored
    /// optimizer state stays attached).
    pub model: M,
    /// Where this rank's batch source stood: start the source there. `None` when the saving
    /// source could not say ([`IterSource`](crate::pipeline::IterSource) records no position):
    /// then skip the batches of the [`iterations_done`](Self::iterations_done) steps yourself.
    pub data: Option<DataPosition>,
    /// Iterations the checkpoint holds (the pipeline's [`iteration`](Pipeline::iteration) from
    /// now on).
    pub iterations_done: u64,
    /// The identity of the run that saved the checkpoint: its world size (which differs from
    /// this run's after [`Checkpoints::resume_from`]) and members.
    pub saved: RunIdentity,
}

impl Checkpoints {
    /// How many of the newest checkpoints a run keeps unless told otherwise
    /// ([`keep_last`](Self::keep_last)).
    pub const DEFAULT_KEEP: usize = 3;

    /// The checkpoints of the run in `run_dir` (they live in `run_dir/checkpoints/`), by a run
    /// with `identity` ([`RunIdentity::from_spec`]), keeping the newest
    /// [`DEFAULT_KEEP`](Self::DEFAULT_KEEP). Touches nothing on disk.
    pub fn new(run_dir: impl AsRef<Path>, identity: RunIdentity) -> Self {
        Self {
            dir: CheckpointDir::new(run_dir.as_ref()),
            identity,
            keep: Self::DEFAULT_KEEP,
            latest: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Keep the newest `keep` checkpoints (0: every one): each publish deletes the older ones
    /// ([`CheckpointDir::prune`]; never the one `latest` names, which a resume or a recovery
    /// after a failed rank continues from, nor one newer than it).
    pub fn keep_last(mut self, keep: usize) -> Self {
        self.keep = keep;
        self
    }

    /// The `checkpoints/` directory (lower-level: the files of one rank, the latest
    /// checkpoint's manifest).
    pub fn dir(&self) -> &CheckpointDir {
        &self.dir
    }

    /// What every checkpoint of this run records and a resume must match.
    pub fn identity(&self) -> &RunIdentity {
        &self.identity
    }

    /// Save the state in `ctx`, on every rank together: rank 0 prepares the staging directory,
    /// every rank writes its file, rank 0 seals the checkpoint and with [`Publish::Now`] points
    /// `latest` at it; a barrier after each step keeps them in order (three barriers on the
    /// world group). Returns the sealed checkpoint's directory (the same on every rank).
    ///
    /// A rank that fails returns its error without the remaining barriers; its peers' next
    /// collective then fails naming it (as in any collective).
    pub fn save<M: Module>(
        &self,
        ctx: &CheckpointContext<'_, M>,
        publish: Publish,
    ) -> Result<PathBuf, CheckpointError> {
        let rank = ctx.group.rank();
        let done = ctx.iterations_done;
        if rank == 0 {
            self.dir.begin(done)?;
        }
        ctx.group.barrier()?;
        let ckpt = RankCheckpoint::capture(
            rank,
            self.identity.clone(),
            done,
            ctx.skipped_steps,
            ctx.data,
            ctx.averager.clone(),
            ctx.pending_average.clone(),
            ctx.outer.clone(),
            ctx.hook.clone(),
            ctx.model,
            ctx.optimizer,
        )?;
        self.dir.write_rank(done, &ckpt)?;
        ctx.group.barrier()?;
        if rank == 0 {
            self.dir.seal(done, &self.identity)?;
            if publish == Publish::Now {
                self.publish(done)?;
            }
        }
        ctx.group.barrier()?;
        self.latest.store(done, Ordering::Relaxed);
        Ok(self.dir.step(done))
    }

    /// The checkpoint phase's saver, for [`Pipeline::with_checkpointer`]: [`save`](Self::save)
    /// every `checkpoint_every` iterations ([`PipelineOptions`](crate::pipeline::PipelineOptions)).
    /// Its errors stop the iteration: a failed barrier as [`PipelineError::Comm`] of the
    /// checkpoint phase, anything else as [`PipelineError::Checkpoint`].
    pub fn checkpointer<M: Module>(&self, publish: Publish) -> Checkpointer<M> {
        let checkpoints = self.clone();
        Box::new(move |ctx: &CheckpointContext<'_, M>| {
            checkpoints
                .save(ctx, publish)
                .map(|_| ())
                .map_err(into_pipeline_error)
        })
    }

    /// Save the pipeline's and `model`'s current state outside the checkpoint phase (after the
    /// last iteration, or at any iteration every rank has reached): [`current_context`] with
    /// `model`'s buffers' latest values (as the checkpoint phase saves them), then
    /// [`save`](Self::save). `data` is where the batch source stands
    /// ([`BatchSource::position`](crate::pipeline::BatchSource::position)). Collective.
    pub fn save_state<M: Module>(
        &self,
        pipeline: &mut Pipeline<M>,
        model: &M,
        data: Option<DataPosition>,
        publish: Publish,
    ) -> Result<PathBuf, CheckpointError> {
        // burn's `RunningState` keeps a forward pass's update pending; settling a clone applies
        // it to the state the clone shares with `model` (the next forward pass would), so both
        // read the same values.
        let settled;
        let model = if ParamSelection::buffers(model).is_empty() {
            model
        } else {
            settled = refresh_buffers(model.clone());
            &settled
        };
        let ctx = current_context(pipeline, model, data)?;
        self.save(&ctx, publish)
    }

    /// Save and publish the final state so a resume can continue from it ([`save_state`]),
    /// unless no checkpoint is needed: nothing was trained, or the newest checkpoint this run
    /// saved (the checkpoint phase's at the last iteration) or resumed from (a resumed run that
    /// trained nothing) already holds this iteration, which saving again would replace. The
    /// sealed directory, or `None` when nothing was saved. Collective: every rank decides alike.
    ///
    /// [`save_state`]: Self::save_state
    pub fn save_final<M: Module>(
        &self,
        pipeline: &mut Pipeline<M>,
        model: &M,
        data: Option<DataPosition>,
    ) -> Result<Option<PathBuf>, CheckpointError> {
        let done = pipeline.iteration();
        if done == 0 || self.latest.load(Ordering::Relaxed) == done {
            return Ok(None);
        }
        self.save_state(pipeline, model, data, Publish::Now)
            .map(Some)
    }

    /// Point `latest` at the sealed checkpoint of `iterations_done` iterations (after a save
    /// with [`Publish::Later`]), then delete the checkpoints beyond the newest
    /// [`keep_last`](Self::keep_last). Call it on one rank, once the checkpoint's save returned
    /// there.
    pub fn publish(&self, iterations_done: u64) -> Result<(), CheckpointError> {
        self.dir.publish(iterations_done)?;
        // The checkpoint is published: a directory that cannot be deleted (a file system that
        // refuses) costs disk, not the run.
        if let Err(e) = self.dir.prune(self.keep) {
            tracing::warn!("keeping older checkpoints: {e}");
        }
        Ok(())
    }

    /// Continue this run from its latest published checkpoint: load this rank's file (the rank
    /// of `pipeline`'s group), check that the checkpoint was written by a run with this
    /// identity (world size and algorithm settings, from the manifest first), put its
    /// parameters and their `ParamId`s into `model`, load its optimizer record into the
    /// pipeline's optimizer (configured as the saving run's), and [`Pipeline::restore`] the
    /// rest (iterations, skipped steps, averager and hook state, a pending overlapped average,
    /// the outer averager's `θ` and momentum). Call it before the first iteration, on a
    /// pipeline built as the saving run's; start the batch source at [`Resumed::data`].
    ///
    /// [`CheckpointError::Missing`] when the run has no checkpoint yet (start fresh then);
    /// [`CheckpointError::Incompatible`] for another run's checkpoint or another model's
    /// shapes; [`CheckpointError::Restore`] when the pipeline refuses the saved states;
    /// [`CheckpointError::Unsupported`] for a pipeline whose optimizer it does not hold
    /// ([`Pipeline::with_inner_optimizer`]).
    pub fn resume<M: Module>(
        &self,
        model: M,
        pipeline: &mut Pipeline<M>,
    ) -> Result<Resumed<M>, CheckpointError> {
        let ckpt = self
            .dir
            .load_rank(pipeline.group().rank(), &self.identity)?;
        let saved = ckpt.meta.identity.clone();
        self.restore(ckpt, saved, model, pipeline)
    }

    /// Continue from the latest checkpoint on another number of ranks: this rank takes saved
    /// rank `saved_rank`'s state (parameters, optimizer, averager and hook counters, a pending
    /// overlapped average, the outer averager's `θ`, momentum and residuals), as
    /// [`resume`](Self::resume) does with its own. The algorithm settings must match; the
    /// world size may differ, and several ranks may take the same saved rank (a replica of a
    /// peer). The batch source is the caller's to re-deal over the new ranks from
    /// [`Resumed::data`] and [`Resumed::saved`]'s world size. Call it on a pipeline built on the
    /// new group (the algorithm's subgroups are the new world's). `spec` is this run's algorithm
    /// (its settings on the saving world must be the checkpoint's: [`AlgorithmSpec::for_world`]).
    ///
    /// What a resumed world computes is defined in the book's Fault tolerance chapter: every
    /// average from here on is over the new ranks; counters continue.
    pub fn resume_from<M: Module>(
        &self,
        saved_rank: usize,
        spec: &AlgorithmSpec,
        model: M,
        pipeline: &mut Pipeline<M>,
    ) -> Result<Resumed<M>, CheckpointError> {
        let (ckpt, saved) = self.dir.load_rank_resized(saved_rank, spec)?;
        self.restore(ckpt, saved, model, pipeline)
    }

    /// Continue from a rank file a live rank sent ([`CheckpointDir::latest_rank_bytes`]'s
    /// bytes): a replacement that joined a running world takes that saved rank's state, as
    /// [`resume_from`](Self::resume_from) takes it from disk. The file must carry `spec`'s
    /// settings on the world that saved it ([`AlgorithmSpec::for_world`]); its world size may
    /// differ from this run's.
    ///
    /// [`CheckpointError::Incompatible`] for another run's file or another model's shapes;
    /// [`CheckpointError::Restore`] when the pipeline refuses the saved states.
    pub fn resume_received<M: Module>(
        &self,
        bytes: &[u8],
        spec: &AlgorithmSpec,
        model: M,
        pipeline: &mut Pipeline<M>,
    ) -> Result<Resumed<M>, CheckpointError> {
        let source = Path::new("(a rank file received from a peer)");
        let ckpt = RankCheckpoint::decode(source, bytes)?;
        let saved = ckpt.meta.identity.clone();
        let expected = RunIdentity::from_spec(&spec.for_world(saved.world_size), saved.world_size);
        super::check_identity(source, &saved, &expected)?;
        self.restore(ckpt, saved, model, pipeline)
    }

    fn restore<M: Module>(
        &self,
        ckpt: RankCheckpoint,
        saved: RunIdentity,
        model: M,
        pipeline: &mut Pipeline<M>,
    ) -> Result<Resumed<M>, CheckpointError> {
        // The pipeline's own optimizer (fresh before the first iteration) takes the record.
        let optimizer = pipeline.optimizer().cloned().ok_or_else(|| {
            CheckpointError::Unsupported(
                "resuming loads the optimizer record into the pipeline's optimizer, and this \
                 pipeline steps an InnerOptimizer whose state it does not hold: restore that \
                 optimizer where it lives, and the pipeline with Pipeline::restore"
                    .into(),
            )
        })?;
        let (model, optimizer) = ckpt.restore(model, optimizer)?;
        let done = ckpt.meta.iterations_done;
        pipeline
            .restore(RestoredState {
                iterations_done: done,
                skipped_steps: ckpt.meta.skipped_steps,
                optimizer: Some(optimizer),
                averager: ckpt.meta.averager.clone(),
                hook: ckpt.meta.hook.clone(),
                pending_average: ckpt.pending_average(),
                outer: ckpt.outer.clone(),
            })
            .map_err(CheckpointError::Restore)?;
        self.latest.store(done, Ordering::Relaxed);
        Ok(Resumed {
            model,
            data: ckpt.meta.data,
            iterations_done: done,
            saved,
        })
    }
}

/// The [`CheckpointContext`] of `pipeline` and `model` now, as the checkpoint phase builds it at
/// the end of an iteration: counters, optimizer, averager and hook state, an overlapped average
/// still pending (its collective completed, not applied) and the outer averager's state (a
/// Streaming DiLoCo pseudo-gradient in flight waited for). Collective when an average or
/// pseudo-gradient is in flight: call it on every rank at the same iteration. Pass `model` with
/// its buffers settled ([`refresh_buffers`]); [`Checkpoints::save_state`] does both.
///
/// [`CheckpointError::Unsupported`] for a pipeline built with an
/// [`InnerOptimizer`](crate::pipeline::InnerOptimizer), whose optimizer state it does not hold.
pub fn current_context<'a, M: Module>(
    pipeline: &'a mut Pipeline<M>,
    model: &'a M,
    data: Option<DataPosition>,
) -> Result<CheckpointContext<'a, M>, CheckpointError> {
    let pending_average = pipeline
        .pending_average()
        .map_err(CheckpointError::Pipeline)?;
    let outer = pipeline.outer_state().map_err(CheckpointError::Pipeline)?;
    let pipeline: &'a Pipeline<M> = pipeline;
    let optimizer = pipeline.optimizer().ok_or_else(|| {
        CheckpointError::Unsupported(
            "the pipeline steps an `InnerOptimizer` whose state it does not hold (burn-train's \
             `Learner`): save it with its owner"
                .into(),
        )
    })?;
    Ok(CheckpointContext {
        iterations_done: pipeline.iteration(),
        skipped_steps: pipeline.skipped_steps(),
        model,
        optimizer,
        averager: pipeline.averager().map(|a| a.state()),
        pending_average,
        outer,
        hook: pipeline.hook().map(|h| h.state()),
        data,
        group: pipeline.group(),
    })
}

/// A save's error as the checkpoint phase reports it: a failed barrier is a communication
/// failure of the phase (so a loop tells a dead peer from a full disk), a pipeline error is
/// itself, anything else a checkpoint failure.
fn into_pipeline_error(e: CheckpointError) -> PipelineError {
    match e {
        CheckpointError::Comm(source) => PipelineError::Comm {
            phase: Phase::Checkpoint.name(),
            source,
        },
        CheckpointError::Pipeline(e) | CheckpointError::Restore(e) => e,
        e => PipelineError::Checkpoint(Box::new(e)),
    }
}
