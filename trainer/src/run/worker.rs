//! One world's training of one rank: setup, resume, the loop, the final state.

use super::device::compute_device;
use super::error::{RunError, output_error};
use super::evaluation::final_models;
use super::inject::fail_mid_step;
use super::loader::ShardLoader;
use super::observer::{RunObserver, observed};
use super::result::WorkerResult;
use super::setup::{
    build_pipeline, checkpoint_failure, effective_settings, lr_schedule, model_config, run_identity,
};
use super::state::{RankState, job_rank};
use crate::config::TrainConfig;
use crate::fault::Fault;
use crate::metrics::{EvalWriter, MetricsWriter};
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::tensor::{Int, Tensor};
use localsgd_comm::{Group, Traffic};
use localsgd_models::data::{ShardSampler, TrainTest};
use localsgd_models::network::Network;
use localsgd_models::pytorch::load_pytorch_safetensors;
use localsgd_pipeline::checkpoint::{CheckpointError, Checkpoints};
use localsgd_pipeline::pipeline::{BatchSource, DataPosition, EpochEnd, LossFn};
use localsgd_pipeline::recovery::{Recovery, Start};
use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One rank's training of one world from `start`, with the state a rank keeps across world
/// changes (the binary's and the recovery's). `run_dir` is written by rank 0, except the
/// checkpoint rank files and the per-rank metrics files ([`MetricsWriter::file_name`]), which
/// every rank writes. A rank failure ends it with the failure: [`run_rank`](super::run_rank)
/// recovers from it.
pub(super) fn train_from(
    cfg: &TrainConfig,
    group: Group,
    data: &TrainTest,
    run_dir: Option<&Path>,
    start: Start,
    state: &mut RankState,
    recovery: &mut Recovery,
) -> Result<WorkerResult, RunError> {
    let rank = group.rank();
    let world = group.size();
    let job_rank = job_rank(&group);
    if cfg.flush_denormals {
        crate::denormals::flush_on_compute_threads()?;
    }
    let device = compute_device(cfg.device, &group)?;
    let mcfg = model_config(cfg, &data.train)?;
    // A resumed rank overwrites every parameter from its checkpoint: its initial weights are
    // drawn, not read (the file may be gone since the run started).
    let model = match (&cfg.init_weights, &start) {
        (Some(path), Start::Fresh) => load_pytorch_safetensors(path, &mcfg, &device)?,
        _ => mcfg.init(cfg.seed, &device)?,
    };
    let (cfg, per_epoch) = effective_settings(cfg, data, world, rank)?;
    let cfg = cfg.as_ref();
    // On the configured number of workers, the configuration's settings; on fewer (the
    // survivors of a rank failure), the same with the whole-world level on the new world.
    let spec = cfg.algorithm_spec()?.for_world(world);
    spec.validate(world)?;
    let identity = run_identity(&spec, world).with_members(group.world_ranks());
    let checkpoints =
        run_dir.map(|dir| Checkpoints::new(dir, identity).keep_last(cfg.keep_checkpoints));
    let mut pipeline = build_pipeline(cfg, &spec, &group, checkpoints.as_ref())?;
    let (model, position, resume_done, saved_world) = match (&start, &checkpoints) {
        (Start::Fresh, _) => (model, DataPosition::default(), None, world),
        (_, None) => {
            return Err(CheckpointError::Missing(Path::new("(no run directory)").into()).into());
        }
        (start, Some(c)) => {
            let r = start
                .resume(c, &spec, model, &mut pipeline)
                .map_err(checkpoint_failure)?;
            // The binary's loader always records where it stands.
            let position = r.data.unwrap_or_default();
            (
                r.model,
                position,
                Some(r.iterations_done),
                r.saved.world_size,
            )
        }
    };
    recovery.started(&start, rank, resume_done);

    let train = Arc::new(data.train.clone());
    let mut sampler = ShardSampler::new(train.len(), world, rank)?;
    if cfg.shuffle {
        sampler = sampler.with_shuffle(cfg.seed);
    }
    // Without `steps` the run is `epochs` epochs of data; with it, as many as its steps take.
    let epochs = cfg.steps.is_none().then_some(cfg.epochs);
    // A checkpoint of another number of ranks: the rest of its epoch is dealt over this world.
    let position = sampler.redeal(position, saved_world, cfg.batch_size)?;
    let mut loader = ShardLoader::new(
        train,
        sampler,
        cfg.batch_size,
        device.clone(),
        position,
        epochs,
    )?;
    let total = match (cfg.steps, resume_done) {
        (Some(steps), _) => steps,
        // The epochs left, counted in this world's batches (after a change of the number of
        // ranks, earlier or now, the run's epochs had other lengths).
        (None, Some(done)) => {
            let left_now = loader.batches_per_epoch() as u64
                - position.next_batch.min(loader.batches_per_epoch() as u64);
            done + per_epoch.steps_after(left_now, cfg.epochs.saturating_sub(position.epoch + 1))
        }
        (None, _) => per_epoch.steps(cfg.epochs),
    };
    let mut pipeline =
        pipeline.with_lr_scheduler(ModuleLrScheduler::new(lr_schedule(cfg, total).scheduler()));

    let metrics = match run_dir {
        Some(dir) => Some(
            MetricsWriter::create(dir, cfg.metrics_format, job_rank, resume_done)
                .map_err(output_error("metrics"))?,
        ),
        None => None,
    };
    // Rank 0 publishes a checkpoint once every rank's metrics rows up to it are synced; the
    // ranks meet on a group of their own, so the barrier is not counted as training traffic.
    let publish_sync = match (&checkpoints, cfg.checkpoint_every, world) {
        (Some(_), every, w) if every > 0 && w > 1 => Some(group.dedicated()?),
        _ => None,
    };
    let evals = match (rank, run_dir, cfg.eval_every) {
        (0, Some(dir), every) if every > 0 => {
            Some(EvalWriter::create(dir, resume_done).map_err(output_error("eval.csv"))?)
        }
        _ => None,
    };

    let traffic_start = group.traffic();
    let started = Instant::now();
    // DDP's start broadcast (a fresh run's), before any fault of iteration 0 fires.
    let mut model = pipeline.start(model)?;
    if pipeline.start_traffic() != Traffic::default() {
        state.start_traffic = pipeline.start_traffic();
    }
    // Rank 0's loss curve: the iterations a new world took over are its own.
    let resumed_at = resume_done.unwrap_or(0) as f64;
    state.curve.retain(|(i, _)| *i < resumed_at);
    // A `step` fault fires inside the iteration's forward pass, after the ranks agreed on data.
    let mid_step: Cell<Option<Fault>> = Cell::new(None);
    let loss_fn = |m: &Network, b: &(Tensor<2>, Tensor<1, Int>)| {
        if let Some(f) = mid_step.take() {
            fail_mid_step(f, &group);
        }
        localsgd_models::network::loss(m, b)
    };
    let mut observer = RunObserver {
        cfg,
        group: &group,
        job_rank,
        state: &mut *state,
        recovery: &mut *recovery,
        metrics,
        evals,
        checkpoints: checkpoints.as_ref(),
        publish_sync,
        test: &data.test,
        device: &device,
        total,
        mid_step: &mid_step,
        shard_end: loader.shard_end(),
        trained: Duration::ZERO,
        last_global: None,
    };
    // The one loop: an epoch at a time until the run's iterations (or, without `steps`, its
    // epochs) are done.
    while pipeline.iteration() < total && (cfg.steps.is_some() || loader.epoch() < cfg.epochs) {
        let (m, end) = pipeline
            .run_epoch(
                model,
                &mut loader,
                &mut LossFn(&loss_fn),
                &mut observer,
                Some(total),
            )
            .map_err(observed)?;
        model = m;
        match end {
            EpochEnd::EndOfData => loader.advance_epoch()?,
            EpochEnd::Budget | EpochEnd::Stopped => break,
        }
    }
    // An overlapped average still in flight finishes its collective inside the timed run; it
    // is saved pending (so a longer resumed run applies it where this one would have) and then
    // applied to the final model.
    pipeline.pending_average()?;
    pipeline.outer_state()?;
    let wall = started.elapsed();
    observer.sync_files()?;
    let last_global = observer.last_global;
    drop(observer);
    let traffic = group.traffic() - traffic_start + state.traffic;
    // The final state is always saved when there is a run directory, so `resume` can continue;
    // buffers (BatchNorm's running statistics) with the last forward's update, as the
    // checkpoint phase saves them.
    let model = localsgd_pipeline::pipeline::refresh_buffers(model);
    if let Some(checkpoints) = &checkpoints
        && checkpoints
            .save_final(&mut pipeline, &model, loader.position())
            .map_err(checkpoint_failure)?
            .is_some()
    {
        recovery.remember_checkpoint(pipeline.iteration(), rank);
    }

    let model = pipeline.finish(model)?;
    let (local, world, params) = final_models(cfg, model, &pipeline, run_dir, data, &device)?;
    // A world that took over with nothing left to train still records its change.
    recovery.finished()?;
    Ok(WorkerResult {
        rank,
        iterations: pipeline.iteration(),
        skipped_steps: pipeline.skipped_steps(),
        test_accuracy: world.accuracy,
        local_test_accuracy: local.accuracy,
        test_loss: world.loss,
        local_test_loss: local.loss,
        last_global_loss: last_global,
        traffic,
        start_traffic: state.start_traffic,
        phase_times: *pipeline.phase_times(),
        wall,
        samples: state.samples,
        params,
        loss_curve: state.curve.clone(),
    })
}
