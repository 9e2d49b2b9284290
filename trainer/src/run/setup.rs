//! What a configuration makes before and for training: its data, the model checks that run
//! before anything is written, the model, optimizer, learning-rate schedule and pipeline.

use super::error::RunError;
use crate::config::{
    Backend, DatasetKind, LrScheduleKind, ModelKind, OptimizerKind, PipelineBuckets, SettingError,
    TrainConfig,
};
use crate::fault::Fault;
use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use localsgd_comm::Group;
use localsgd_models::cnn::CnnConfig;
use localsgd_models::data::{self, DataError, Dataset, ShardSampler, TrainTest};
use localsgd_models::gpt::GptConfig;
use localsgd_models::limits;
use localsgd_models::mlp::{MlpConfig, ModelError};
use localsgd_models::network::{ModelSpec, Network};
use localsgd_models::pytorch::load_pytorch_safetensors;
use localsgd_pipeline::algorithm::{self, AlgorithmSpec};
use localsgd_pipeline::checkpoint::{CheckpointError, Checkpoints, Publish, RunIdentity};
use localsgd_pipeline::lr_schedule::LrSchedule;
use localsgd_pipeline::optim::{FusedAdamConfig, FusedSgdConfig, OptimError};
use localsgd_pipeline::pipeline::{Accumulation, Pipeline, PipelineOptions};
use std::path::Path;

/// Load the configured data set.
pub fn load_data(cfg: &TrainConfig) -> Result<TrainTest, DataError> {
    match cfg.dataset {
        DatasetKind::Digits => data::digits::load(),
        DatasetKind::Synthetic => {
            // Features as f32 and a u32 label per sample, checked before anything is generated.
            let bytes = (cfg.synthetic_samples as u128)
                .saturating_mul(cfg.synthetic_dim as u128 * 4 + 4)
                .min(u64::MAX as u128) as u64;
            // Blame the larger of the two factors.
            let (setting, value, other, other_value) = if cfg.synthetic_dim > cfg.synthetic_samples
            {
                (
                    "synthetic-dim",
                    cfg.synthetic_dim,
                    "synthetic-samples",
                    cfg.synthetic_samples,
                )
            } else {
                (
                    "synthetic-samples",
                    cfg.synthetic_samples,
                    "synthetic-dim",
                    cfg.synthetic_dim,
                )
            };
            let need = limits::Need::new(
                setting,
                &format!("{value} (with `{other}` = {other_value})"),
                "the synthetic data",
                bytes,
            )
            .hint("use fewer `synthetic-samples` or a smaller `synthetic-dim`");
            limits::check(&need, limits::available_memory())?;
            let test = cfg.synthetic_samples / 5;
            data::synthetic::generate_split(
                cfg.synthetic_samples - test,
                test,
                cfg.synthetic_dim,
                cfg.synthetic_classes,
                cfg.seed,
            )
        }
        DatasetKind::Idx => {
            let dir = cfg.data_dir.as_deref().unwrap_or(Path::new("."));
            data::idx::load_dir(dir)
        }
        DatasetKind::Text => {
            let file = cfg.text_file.as_deref().unwrap_or(Path::new(""));
            data::text::load(file, cfg.context, data::text::DEFAULT_VALID_FRACTION)
        }
    }
}

/// Everything about the model a run can refuse before its directory is written: a malformed
/// `LOCALSGD_FAULT` ([`crate::fault`]), the memory the models need ([`localsgd_models::limits`]), the model
/// the data can feed ([`model_config`]) and, with `init-weights`, the file (read once here on the
/// CPU and checked against that model: names, shapes, element types). The binary calls it
/// before it creates the run directory.
pub fn preflight(cfg: &TrainConfig, train: &Dataset) -> Result<ModelSpec, RunError> {
    let per_epoch = epoch_steps(cfg, train.len(), cfg.workers, 0)?;
    let faults = Fault::from_env().map_err(RunError::Fault)?;
    if !faults.is_empty() {
        // The iterations this run trains: from the checkpoint it resumes, to `steps` or the end
        // of its epochs (every rank's shard has as many batches; a resumed run's epochs end
        // where its data position says, which only the run finds out).
        let start = match cfg.resume {
            true => localsgd_pipeline::checkpoint::CheckpointDir::new(&cfg.run_dir)
                .latest_iterations()?,
            false => 0,
        };
        let end = match (cfg.steps, cfg.resume) {
            (Some(steps), _) => Some(steps),
            (None, false) => Some(per_epoch.steps(cfg.epochs)),
            (None, true) => None,
        };
        for f in &faults {
            f.check(cfg.workers, start, end, cfg.checkpoint_every)
                .map_err(RunError::Fault)?;
        }
    }
    if cfg.resume && cfg.steps.is_none() {
        check_epochs_left(cfg, train.len())?;
    }
    let spec = model_config(cfg, train)?;
    if let Some(need) = model_memory(cfg, &spec, train.len()) {
        limits::check(&need, limits::available_memory())?;
    }
    if let Some(path) = &cfg.init_weights
        && !cfg.resume
    {
        load_pytorch_safetensors(path, &spec, &Device::flex())?;
    }
    Ok(spec)
}

/// Refuse a resume of a run limited by `epochs` whose latest checkpoint already holds them all
/// (an epoch counts once its last batch was trained, in the saving world's sharding).
fn check_epochs_left(cfg: &TrainConfig, samples: usize) -> Result<(), RunError> {
    let checkpoints = localsgd_pipeline::checkpoint::CheckpointDir::new(&cfg.run_dir);
    let meta = checkpoints.latest_rank_meta(0)?;
    let Some(position) = meta.data else {
        return Ok(());
    };
    let batches = ShardSampler::new(samples, meta.identity.world_size, 0)?
        .num_batches(cfg.batch_size)? as u64;
    let whole = position.start == 0 && position.next_batch >= batches;
    let done = position.epoch + u64::from(whole);
    if done >= cfg.epochs {
        return Err(RunError::Checkpoint(CheckpointError::Incompatible(
            format!(
                "`epochs` = {} is already reached: the latest checkpoint in {} holds {done} epochs \
             ({} iterations); give `epochs` above {done} (or `steps` above {}) to train on",
                cfg.epochs,
                cfg.run_dir.display(),
                meta.iterations_done,
                meta.iterations_done
            ),
        )));
    }
    Ok(())
}

/// What an MLP run needs at least in this process: on every worker the process runs (all of
/// them on the thread backend, one otherwise) the parameters, their gradients and the optimizer
/// state (a momentum buffer, or Adam's two moments) as f32, plus one batch's activations and
/// their gradients. `None` for the CNN, whose size `channels` bounds to a few MB per worker, and
/// on a GPU (`cuda`, `libtorch-cuda`), where the tensors are in GPU memory.
fn model_memory(cfg: &TrainConfig, spec: &ModelSpec, samples: usize) -> Option<limits::Need> {
    // Host memory only: on `cuda` the tensors live on the GPU.
    let ModelSpec::Mlp(mlp) = spec else {
        return None;
    };
    if cfg.device.is_gpu() {
        return None;
    }
    let widths: Vec<u128> = std::iter::once(mlp.input)
        .chain(mlp.hidden.iter().copied())
        .chain(std::iter::once(mlp.classes))
        .map(|w| w as u128)
        .collect();
    let params: u128 = widths
        .windows(2)
        .map(|w| (w[0] + 1).saturating_mul(w[1]))
        .fold(0, u128::saturating_add);
    let state = match cfg.optimizer {
        OptimizerKind::Sgd if cfg.momentum == 0.0 => 0,
        OptimizerKind::Sgd => 1,
        OptimizerKind::Adam | OptimizerKind::Adamw => 2,
    };
    let batch = cfg.batch_size.min(samples.max(1)) as u128;
    let activations = batch.saturating_mul(widths.iter().sum::<u128>()) * 2;
    let workers = match cfg.backend {
        Backend::Threads => cfg.workers.max(1) as u128,
        _ => 1,
    };
    let bytes = workers
        .saturating_mul(params.saturating_mul(2 + state).saturating_add(activations))
        .saturating_mul(4);
    let hidden: Vec<String> = mlp.hidden.iter().map(|w| w.to_string()).collect();
    Some(
        limits::Need::new(
            "hidden",
            &hidden.join(","),
            &format!(
                "{workers} worker(s) of a {params}-parameter MLP ({} -> {} -> {})",
                mlp.input,
                hidden.join(" -> "),
                mlp.classes
            ),
            bytes.min(u64::MAX as u128) as u64,
        )
        .hint("use smaller `hidden` widths (or fewer `workers` in one process)"),
    )
}

/// The model shape for a data set: the configured `model` over the data's features and
/// classes.
pub fn model_config(cfg: &TrainConfig, train: &Dataset) -> Result<ModelSpec, ModelError> {
    Ok(match cfg.model {
        ModelKind::Mlp => ModelSpec::Mlp(MlpConfig {
            input: train.dim(),
            hidden: cfg.hidden.clone(),
            classes: train.num_classes(),
        }),
        ModelKind::Cnn => ModelSpec::Cnn(CnnConfig::for_features(
            train.dim(),
            cfg.channels.clone(),
            train.num_classes(),
        )?),
        ModelKind::Gpt => {
            let spec = GptConfig {
                vocab: 256,
                context: cfg.context,
                d_model: cfg.d_model,
                heads: cfg.heads,
                layers: cfg.layers,
            };
            spec.validate()
                .map_err(|e| ModelError::Gpt(e.to_string()))?;
            ModelSpec::Gpt(spec)
        }
    })
}

/// What every checkpoint of a run of `spec` on `world` ranks records about the run, and what a
/// resumed run must match (world size and algorithm settings): [`RunIdentity::from_spec`].
pub fn run_identity(spec: &AlgorithmSpec, world: usize) -> RunIdentity {
    RunIdentity::from_spec(spec, world)
}

/// The optimizer of a configuration: PyTorch's SGD, Adam or AdamW (fused, in PyTorch's
/// arithmetic: [`localsgd_pipeline::optim`]) with PyTorch's defaults: SGD without dampening
/// or Nesterov, Adam / AdamW with eps 1e-8 and betas 0.9 / 0.999; weight decay as PyTorch
/// applies it (L2 added to the gradient for sgd and adam, decoupled for adamw, whose default
/// is 0.01). Errors on settings PyTorch refuses (a negative momentum or weight decay).
pub fn optimizer(cfg: &TrainConfig) -> Result<ModuleOptimizer, OptimError> {
    let weight_decay = cfg.weight_decay.unwrap_or(0.0);
    match cfg.optimizer {
        OptimizerKind::Sgd => FusedSgdConfig {
            momentum: cfg.momentum,
            weight_decay,
            ..FusedSgdConfig::default()
        }
        .init(),
        OptimizerKind::Adam => FusedAdamConfig {
            weight_decay,
            decay_matrices_only: cfg.weight_decay_matrices_only,
            ..FusedAdamConfig::adam()
        }
        .init(),
        OptimizerKind::Adamw => FusedAdamConfig {
            weight_decay: cfg.weight_decay.unwrap_or(0.01),
            decay_matrices_only: cfg.weight_decay_matrices_only,
            ..FusedAdamConfig::adamw()
        }
        .init(),
    }
}

/// The learning-rate schedule of a configuration over a run of `iterations` iterations.
pub fn lr_schedule(cfg: &TrainConfig, iterations: u64) -> LrSchedule {
    match cfg.lr_schedule {
        LrScheduleKind::Constant => LrSchedule::Constant { base: cfg.lr },
        LrScheduleKind::Step => LrSchedule::Step {
            base: cfg.lr,
            step_size: cfg.lr_step_size,
            gamma: cfg.lr_gamma,
        },
        LrScheduleKind::Cosine => LrSchedule::Cosine {
            base: cfg.lr,
            t_max: iterations.max(1),
            min: cfg.lr_min,
        },
        LrScheduleKind::LinearWarmup => LrSchedule::LinearWarmup {
            base: cfg.lr,
            start_factor: cfg.lr_warmup_start_factor,
            steps: cfg.lr_warmup_steps,
        },
    }
}

/// How an epoch's batches make optimizer steps ([`Accumulation`]'s rules): `batches` batches of
/// a rank's shard per epoch, `accumulate` per step.
#[derive(Debug, Clone, Copy)]
pub(super) struct EpochSteps {
    batches: u64,
    accumulate: u64,
    accumulation: Accumulation,
}

impl EpochSteps {
    /// Optimizer steps in `epochs` epochs: the micro-batches streamed across epochs (the last
    /// step takes what is left), or each epoch's own steps, the last of fewer.
    pub(super) fn steps(&self, epochs: u64) -> u64 {
        match self.accumulation {
            Accumulation::Stream => (epochs * self.batches).div_ceil(self.accumulate),
            Accumulation::EpochEnd => epochs * self.batches.div_ceil(self.accumulate),
        }
    }

    /// Optimizer steps in the `first` batches left of the current epoch and `epochs` whole
    /// epochs after it (a world that took over mid-epoch).
    pub(super) fn steps_after(&self, first: u64, epochs: u64) -> u64 {
        match self.accumulation {
            Accumulation::Stream => (first + epochs * self.batches).div_ceil(self.accumulate),
            Accumulation::EpochEnd => {
                first.div_ceil(self.accumulate) + epochs * self.batches.div_ceil(self.accumulate)
            }
        }
    }
}

/// Rank `rank` of `world`'s epochs on `samples` training samples as optimizer steps; refuses an
/// `accumulate` no step can fill (checked before anything is written, by [`preflight`]).
fn epoch_steps(
    cfg: &TrainConfig,
    samples: usize,
    world: usize,
    rank: usize,
) -> Result<EpochSteps, RunError> {
    let batches = ShardSampler::new(samples, world, rank)?.num_batches(cfg.batch_size)? as u64;
    let accumulate = cfg.accumulate.max(1) as u64;
    let available = match (cfg.accumulation, cfg.steps) {
        (Accumulation::EpochEnd, _) => Some((batches, "each rank's epoch has")),
        (Accumulation::Stream, None) => {
            Some((batches * cfg.epochs, "the run's epochs give each rank"))
        }
        // Streamed over as many epochs as the steps take: any number fills a step.
        (Accumulation::Stream, Some(_)) => None,
    };
    if let Some((available, what)) = available
        && accumulate > available
    {
        return Err(SettingError::new(
            "accumulate",
            cfg.accumulate,
            format!(
                "at most {available}: {what} {available} batches of {}",
                cfg.batch_size
            ),
        )
        .into());
    }
    Ok(EpochSteps {
        batches,
        accumulate,
        accumulation: cfg.accumulation,
    })
}

/// The settings a rank trains with, and how its epochs make steps: with `warmup-epochs`, the
/// warmup becomes the optimizer steps of that many epochs.
pub(super) fn effective_settings<'a>(
    cfg: &'a TrainConfig,
    data: &TrainTest,
    world: usize,
    rank: usize,
) -> Result<(std::borrow::Cow<'a, TrainConfig>, EpochSteps), RunError> {
    let per_epoch = epoch_steps(cfg, data.train.len(), world, rank)?;
    let Some(epochs) = cfg.warmup_epochs else {
        return Ok((std::borrow::Cow::Borrowed(cfg), per_epoch));
    };
    let mut c = cfg.clone();
    c.warmup = epochs
        .checked_mul(per_epoch.batches)
        .map(|_| per_epoch.steps(epochs))
        .filter(|w| i64::try_from(*w).is_ok())
        .ok_or_else(|| {
            SettingError::new(
                "warmup-epochs",
                epochs,
                format!(
                    "{epochs} epochs of {} batches overflow the warmup counter",
                    per_epoch.batches
                ),
            )
        })?;
    tracing::info!(
        epochs,
        steps = c.warmup,
        "warmup-epochs: the warmup is {} optimizer steps",
        c.warmup
    );
    Ok((std::borrow::Cow::Owned(c), per_epoch))
}

/// The pipeline of a rank: the optimizer, the algorithm's hook and averager, and (with a run
/// directory) the checkpointer. Collective (the algorithm's subgroups are created here).
pub(super) fn build_pipeline(
    cfg: &TrainConfig,
    spec: &AlgorithmSpec,
    group: &Group,
    checkpoints: Option<&Checkpoints>,
) -> Result<Pipeline<Network>, RunError> {
    let parts = algorithm::build(spec, group)?;
    if let Some((_, reducer)) = &parts.sync
        && spec.pipeline_buckets == PipelineBuckets::Auto
        && group.backend() != "threads"
        && group.rank() == 0
    {
        println!(
            "gradient sync: {} (pipeline-buckets auto: {})",
            if reducer.is_pipelined() {
                "pipelined"
            } else {
                "blocking"
            },
            if reducer.is_pipelined() {
                "ranks on more than one host"
            } else {
                "one host, or a rank whose host runs more ranks than cores"
            }
        );
    }
    let options = PipelineOptions {
        lr: cfg.lr,
        skip_non_finite: cfg.skip_non_finite,
        metrics_every: cfg.log_every,
        checkpoint_every: cfg.checkpoint_every,
        broadcast_start: cfg.broadcast_start,
        buffers: cfg.buffers,
        clip_grad_norm: (cfg.clip_grad_norm > 0.0).then_some(cfg.clip_grad_norm),
        accumulate: cfg.accumulate,
        accumulation: cfg.accumulation,
    };
    let mut pipeline = Pipeline::new(group.clone(), optimizer(cfg)?, options).with_parts(parts);
    if let Some(checkpoints) = checkpoints {
        // Sealed, not yet published: rank 0 publishes it once every rank's metrics rows are
        // synced (`train_worker`), so the rows a resume keeps are its iterations.
        pipeline = pipeline.with_checkpointer(checkpoints.checkpointer(Publish::Later));
    }
    Ok(pipeline)
}

/// A checkpoint error as the run reports it: a failed collective or a pipeline that refused
/// the saved state as they are reported elsewhere in the run (a peer's failure is told apart from
/// the failing rank's own error by [`train_threads`]), anything else as a checkpoint error.
pub(super) fn checkpoint_failure(e: CheckpointError) -> RunError {
    match e {
        CheckpointError::Comm(e) => RunError::Comm(e),
        CheckpointError::Restore(e) | CheckpointError::Pipeline(e) => RunError::Pipeline(e),
        e => RunError::Checkpoint(e),
    }
}
