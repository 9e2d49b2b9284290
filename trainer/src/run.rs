//! A complete training run of one of the built-in models (MLP, CNN or GPT), as the `localsgd` binary does it: data, model,
//! algorithm, pipeline, checkpoints, metrics and evaluation, on every rank.
//!
//! `run_rank` is the whole per-rank run for any `Group` (`train_worker`, then totals
//! gathered once by `RunTotals::gather`); `train_worker` loops over `run_iteration`, with fault
//! injection (`fault.rs`), checkpoint publishing and test-set evaluations between iterations.
//! With `on-rank-failure = "continue"`, `run_rank` catches a peer's failure, shrinks the group
//! and starts `train_worker`'s body again on the survivors from the last published checkpoint,
//! each from its own saved file (`Start::ResumeFrom`): a failure is handled as a resume on
//! another number of ranks, the one code path `resume-ranks` also takes (book: Fault
//! tolerance). `RankState` carries what spans worlds (faults left, membership changes, samples,
//! traffic, the loss curve). With `"replace"` the survivors then `grow` the group back and the
//! lowest live rank hands each new rank (which starts in `receive_handover`) a `Handover` and
//! the failed rank's file of that checkpoint over `broadcast_bytes`; the new rank resumes from
//! those bytes (`Start::Received`, `Checkpoints::resume_received`) and everyone continues at
//! full size. `compute_device` / `device_on_host`: the device a rank computes on (`device`:
//! burn's `flex`, its CUDA backend, or its LibTorch backend on the CPU or a GPU with LibTorch's
//! intra-op threads shared out among the host's ranks).

use crate::config::{
    Backend, DatasetKind, DeviceKind, LrScheduleKind, ModelKind, OptimizerKind, PipelineBuckets,
    RankFailure, SettingError, TrainConfig,
};
use crate::fault::{Fault, FaultKind};
use crate::metrics::{EvalWriter, MembershipChange, MetricsWriter};
use burn::optim::ModuleOptimizer;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::tensor::{Device, Int, Tensor};
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_comm::{CommError, Group, GroupExt, Traffic};
use localsgd_models::cnn::CnnConfig;
use localsgd_models::data::{self, DataError, Dataset, ShardSampler, TrainTest};
use localsgd_models::gpt::GptConfig;
use localsgd_models::limits;
use localsgd_models::mlp::{MlpConfig, ModelError};
use localsgd_models::network::{BatchEval, ModelSpec, Network, Objective};
use localsgd_models::pytorch::{WeightsError, load_pytorch_safetensors, save_pytorch_safetensors};
use localsgd_pipeline::algorithm::{self, AlgorithmSpec};
use localsgd_pipeline::checkpoint::{CheckpointError, Checkpoints, Publish, RunIdentity};
use localsgd_pipeline::lr_schedule::LrSchedule;
use localsgd_pipeline::optim::{FusedAdamConfig, FusedSgdConfig, OptimError};
use localsgd_pipeline::pipeline::{
    Accumulation, BatchSource, DataPosition, Outcome, PhaseTimes, Pipeline, PipelineError,
    PipelineOptions, SourceError,
};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The file in the run directory that holds rank 0's final model as PyTorch safetensors
/// (names and layout of [`localsgd_models::pytorch`]; loads with `--init-weights` and with
/// `model.load_state_dict(safetensors.torch.load_file(...))` into the PyTorch twin).
pub const MODEL_FILE: &str = "model.safetensors";

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A setting is invalid (the message names it).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Loading data failed.
    #[error("data: {0}")]
    Data(#[from] DataError),
    /// The model configuration is invalid.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// `init-weights` could not be loaded.
    #[error("init-weights: {0}")]
    InitWeights(#[from] WeightsError),
    /// The pipeline failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// A checkpoint could not be saved or loaded.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A collective outside the pipeline failed (setup, evaluation).
    #[error("communication: {0}")]
    Comm(#[from] CommError),
    /// `flush-denormals` on a CPU this build cannot set it on.
    #[error(transparent)]
    Denormals(#[from] crate::denormals::UnsupportedArch),
    /// The optimizer's settings are outside what PyTorch accepts.
    #[error("optimizer: {0}")]
    Optimizer(#[from] OptimError),
    /// The configured compute device is not available in this build.
    #[error("device: {0}")]
    Device(String),
    /// The models would not fit in this machine's memory.
    #[error(transparent)]
    TooLarge(#[from] localsgd_models::limits::TooLarge),
    /// `LOCALSGD_FAULT` is set to something that is not a fault ([`crate::fault`]).
    #[error("fault injection: {0}")]
    Fault(String),
    /// A thread worker panicked (its peers then fail with "rank R failed").
    #[error("rank {rank} panicked: {message}")]
    WorkerPanicked {
        /// The world rank of the worker.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// Writing metrics or plots failed.
    #[error("writing {what}: {message}")]
    Output {
        /// The file.
        what: String,
        /// The error.
        message: String,
    },
}

/// What one rank reports at the end of a run.
#[derive(Debug, Clone)]
pub struct WorkerResult {
    /// World rank.
    pub rank: usize,
    /// Iterations completed (including resumed ones).
    pub iterations: u64,
    /// Optimizer steps skipped for non-finite gradients.
    pub skipped_steps: u64,
    /// Test accuracy of the world-averaged model, in [0, 1].
    pub test_accuracy: f64,
    /// Test accuracy of this rank's own model.
    pub local_test_accuracy: f64,
    /// Test loss (mean cross-entropy) of the world-averaged model.
    pub test_loss: f64,
    /// Test loss of this rank's own model.
    pub local_test_loss: f64,
    /// Last all-reduced mean loss, if any was logged.
    pub last_global_loss: Option<f64>,
    /// Communication this rank issued during training (excluding evaluation).
    pub traffic: Traffic,
    /// The part of `traffic` that the start broadcast sent (rank 0's parameters and buffers
    /// before a fresh run's first iteration), in this world.
    pub start_traffic: Traffic,
    /// Wall time per phase.
    pub phase_times: PhaseTimes,
    /// Wall time of the training loop.
    pub wall: Duration,
    /// Samples this rank processed.
    pub samples: u64,
    /// This rank's final parameters, flattened in traversal order.
    pub params: FlatBuffer,
    /// (iteration, loss) of every iteration, for the loss curve (rank 0 only).
    pub loss_curve: Vec<(f64, f64)>,
}

/// Communication and work summed over every rank of a run, and each rank's own result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunTotals {
    /// Bytes of collective payload issued, all ranks together.
    pub bytes: u64,
    /// The float-data part of `bytes` (gradients, parameters, losses), all ranks together.
    pub data_bytes: u64,
    /// Collectives issued, all ranks together.
    pub collectives: u64,
    /// The part of `bytes` that the start broadcast sent, all ranks together.
    pub start_bytes: u64,
    /// Training samples processed, all ranks together.
    pub samples: u64,
    /// Each rank's own final model on the test set, in rank order (after local steps the
    /// replicas differ; this is what PyTorch's per-rank numbers compare with).
    pub ranks: Vec<Evaluation>,
}

impl RunTotals {
    /// Sum every rank's result over the group (one small all-gather; collective). The one way
    /// totals are computed, on every backend ([`run_rank`]).
    pub fn gather(group: &Group, mine: &WorkerResult) -> Result<Self, RunError> {
        let all = group.all_gather_u64(&[
            mine.traffic.bytes,
            mine.traffic.data_bytes,
            mine.traffic.collectives,
            mine.samples,
            mine.local_test_accuracy.to_bits(),
            mine.local_test_loss.to_bits(),
            mine.start_traffic.bytes,
        ])?;
        let mut t = Self::default();
        for c in all.chunks(7) {
            t.bytes += c[0];
            t.data_bytes += c[1];
            t.collectives += c[2];
            t.samples += c[3];
            t.ranks.push(Evaluation {
                accuracy: f64::from_bits(c[4]),
                loss: f64::from_bits(c[5]),
            });
            t.start_bytes += c[6];
        }
        Ok(t)
    }
}

/// The autodiff device a rank computes on: burn's `flex` CPU backend; (trainer feature `cuda`)
/// the GPU whose index is the rank's position among the ranks on its host (one GPU per rank);
/// (trainer feature `libtorch`) LibTorch on the CPU, or on that GPU. Collective for the GPU and
/// LibTorch kinds (they split the world by host).
pub fn compute_device(kind: DeviceKind, group: &Group) -> Result<Device, RunError> {
    match kind {
        DeviceKind::Cpu => Ok(Device::flex().autodiff()),
        DeviceKind::Cuda | DeviceKind::Libtorch | DeviceKind::LibtorchCuda => {
            let node = group.intra_node()?;
            device_on_host(kind, node.rank(), node.size())
        }
    }
}

/// [`compute_device`] for the rank at `local_rank` of the `local_ranks` that compute on this host.
/// LibTorch's intra-op threads: the host's cores shared out among them, unless
/// `OMP_NUM_THREADS` is set (PyTorch's own rule); burn's `flex` threads are set by the caller
/// (rayon's pool).
pub fn device_on_host(
    kind: DeviceKind,
    local_rank: usize,
    local_ranks: usize,
) -> Result<Device, RunError> {
    match kind {
        DeviceKind::Cpu => Ok(Device::flex().autodiff()),
        DeviceKind::Cuda => cuda_device(local_rank),
        DeviceKind::Libtorch | DeviceKind::LibtorchCuda => {
            libtorch_device(kind == DeviceKind::LibtorchCuda, local_rank, local_ranks)
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(local_rank: usize) -> Result<Device, RunError> {
    Ok(Device::cuda(local_rank).autodiff())
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_local_rank: usize) -> Result<Device, RunError> {
    Err(RunError::Device(
        "`cuda` needs a binary built with the trainer feature `cuda`; use `cpu`".into(),
    ))
}

#[cfg(feature = "libtorch")]
// burn marks its LibTorch backend deprecated (for its CubeCL ones); `device = "libtorch"` is the
// choice of PyTorch's own CPU kernels.
#[allow(deprecated)]
fn libtorch_device(gpu: bool, local_rank: usize, local_ranks: usize) -> Result<Device, RunError> {
    if gpu {
        let gpus = tch::Cuda::device_count().max(0) as usize;
        if local_rank >= gpus {
            return Err(RunError::Device(format!(
                "`libtorch-cuda`: rank {local_rank} on this host needs GPU {local_rank}, and \
                 LibTorch sees {gpus} (a CUDA build of PyTorch and one GPU per rank; `libtorch` \
                 computes on the CPU)"
            )));
        }
    }
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Per calling thread under OpenMP: every rank of a thread-backend process sets it.
        tch::set_num_threads((cores / local_ranks.max(1)).max(1) as i32);
    }
    Ok(if gpu {
        Device::libtorch_cuda(local_rank).autodiff()
    } else {
        Device::libtorch().autodiff()
    })
}

#[cfg(not(feature = "libtorch"))]
fn libtorch_device(
    _gpu: bool,
    _local_rank: usize,
    _local_ranks: usize,
) -> Result<Device, RunError> {
    Err(RunError::Device(
        "`libtorch` and `libtorch-cuda` need a binary built with the trainer feature `libtorch`; use `cpu`".into(),
    ))
}

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

/// A model's test accuracy and loss.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Evaluation {
    /// Fraction predicted correctly, in [0, 1]: samples for a classifier, next bytes for a
    /// language model.
    pub accuracy: f64,
    /// Mean cross-entropy in nats per prediction (per sample, or per byte for a language
    /// model; computed in f64 from the f32 logits).
    pub loss: f64,
}

impl Evaluation {
    /// The loss in bits per prediction (bits per byte for a language model).
    pub fn bits(&self) -> f64 {
        self.loss / std::f64::consts::LN_2
    }
}

/// Fraction of `data` the model predicts correctly, in evaluation mode (`Module::valid`:
/// no autodiff, batch normalization from its running statistics, which are left unchanged).
pub fn accuracy<M: Objective>(model: &M, data: &Dataset, device: &Device) -> Result<f64, RunError> {
    Ok(evaluate(model, data, device)?.accuracy)
}

/// [`accuracy`] and the mean cross-entropy of `data`, in one pass. An empty data set gives
/// zeros.
pub fn evaluate<M: Objective>(
    model: &M,
    data: &Dataset,
    device: &Device,
) -> Result<Evaluation, RunError> {
    if data.is_empty() {
        return Ok(Evaluation::default());
    }
    let model = model.valid();
    let indices: Vec<usize> = (0..data.len()).collect();
    let mut total = BatchEval::default();
    for chunk in indices.chunks(1024) {
        let (x, _) = data.batch_tensors(chunk, device)?;
        let labels: Vec<u32> = chunk.iter().map(|&i| data.labels()[i]).collect();
        let eval = model
            .batch_eval(x.inner(), &labels)
            .map_err(|message| RunError::Output {
                what: "evaluation".into(),
                message,
            })?;
        total.loss_sum += eval.loss_sum;
        total.correct += eval.correct;
        total.count += eval.count;
    }
    let n = total.count.max(1) as f64;
    Ok(Evaluation {
        accuracy: total.correct as f64 / n,
        loss: total.loss_sum / n,
    })
}

/// This rank's shard of the training data, epoch by epoch, in batches (PyTorch's
/// `DistributedSampler` + `DataLoader(drop_last=False)` layout).
pub struct ShardLoader {
    data: Arc<Dataset>,
    sampler: ShardSampler,
    batch_size: usize,
    device: Device,
    epoch: u64,
    /// The first row of the epoch's order this world's sharding deals (nonzero only in an
    /// epoch dealt again after the number of ranks changed: [`ShardSampler::redeal`]).
    start: u64,
    batches: Vec<Vec<usize>>,
    next: usize,
    epochs: Option<u64>,
}

impl ShardLoader {
    /// A loader positioned at `position`, with `epochs` epochs of data (`None`: as many as
    /// the run asks for).
    pub fn new(
        data: Arc<Dataset>,
        sampler: ShardSampler,
        batch_size: usize,
        device: Device,
        position: DataPosition,
        epochs: Option<u64>,
    ) -> Result<Self, DataError> {
        let start = usize::try_from(position.start).unwrap_or(usize::MAX);
        let batches = sampler.batches_from(position.epoch, start, batch_size)?;
        Ok(Self {
            data,
            sampler,
            batch_size,
            device,
            epoch: position.epoch,
            start: position.start,
            batches,
            next: position.next_batch as usize,
            epochs,
        })
    }

    /// Move to the start of the next epoch.
    pub fn advance_epoch(&mut self) -> Result<(), DataError> {
        self.epoch += 1;
        self.start = 0;
        self.batches = self.sampler.batches(self.epoch, self.batch_size)?;
        self.next = 0;
        Ok(())
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches per epoch on this rank.
    pub fn batches_per_epoch(&self) -> usize {
        self.batches.len()
    }

    /// Run out of data for the rest of this epoch (an uneven shard; fault injection).
    pub fn end_epoch_here(&mut self) {
        self.next = self.batches.len();
    }
}

impl BatchSource<(Tensor<2>, Tensor<1, Int>)> for ShardLoader {
    fn next_batch(&mut self) -> Result<Option<(Tensor<2>, Tensor<1, Int>)>, SourceError> {
        let Some(indices) = self.batches.get(self.next) else {
            return Ok(None);
        };
        let batch = self.data.batch_tensors(indices, &self.device)?;
        self.next += 1;
        Ok(Some(batch))
    }

    fn position(&self) -> Option<DataPosition> {
        Some(DataPosition {
            epoch: self.epoch,
            next_batch: self.next as u64,
            start: self.start,
        })
    }

    fn next_epoch(&mut self) -> Result<bool, SourceError> {
        if self.epochs.is_some_and(|e| self.epoch + 1 >= e) {
            return Ok(false);
        }
        self.advance_epoch()?;
        Ok(true)
    }
}

/// An I/O error writing the run file `what`, as a run error.
fn output_error(what: &'static str) -> impl Fn(std::io::Error) -> RunError {
    move |e| RunError::Output {
        what: what.into(),
        message: e.to_string(),
    }
}

/// Progress callback: (iterations done, total iterations, last global loss).
pub type Progress = Box<dyn FnMut(u64, u64, Option<f64>) + Send>;

/// Run one rank of a training run. `run_dir` is written by rank 0, except the checkpoint rank
/// files and the per-rank metrics files ([`MetricsWriter::file_name`]), which every rank writes.
/// A rank failure ends it with the failure, whatever `on-rank-failure` says: [`run_rank`]
/// continues on the survivors.
pub fn train_worker(
    cfg: &TrainConfig,
    group: Group,
    data: &TrainTest,
    run_dir: Option<&Path>,
    progress: Option<Progress>,
) -> Result<WorkerResult, RunError> {
    let mut rank_state = RankState::new(progress)?;
    let start = Start::configured(cfg, group.rank());
    train_from(cfg, group, data, run_dir, start, &mut rank_state)
}

/// Where a rank's training starts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Start {
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
    fn configured(cfg: &TrainConfig, rank: usize) -> Self {
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
struct RankState {
    progress: Option<Progress>,
    faults: Vec<Fault>,
    membership: Vec<MembershipChange>,
    /// When the last membership change was detected, until the new world completes an
    /// iteration.
    recovering: Option<Instant>,
    /// Iterations completed (the pipeline's counter), as of the last one.
    iteration: u64,
    /// Samples processed, in every world so far.
    samples: u64,
    /// Rank 0's loss curve so far.
    curve: Vec<(f64, f64)>,
    /// Communication of the worlds that ended in a failure.
    traffic: Traffic,
    /// What the start broadcast sent (the first world's, before its first iteration; a world
    /// after a failure resumes and broadcasts nothing).
    start_traffic: Traffic,
    /// The checkpoints this job can continue from (the newest last, at most a few): their
    /// iterations and this rank's file in each (its rank in the world that wrote it, or the
    /// saved rank it resumed from). A checkpoint in the run directory that is not one of them
    /// belongs to another job.
    checkpoints: Vec<(u64, usize)>,
}

impl RankState {
    fn new(progress: Option<Progress>) -> Result<Self, RunError> {
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
    fn remember_checkpoint(&mut self, iterations: u64, saved_rank: usize) {
        self.checkpoints.retain(|&(i, _)| i != iterations);
        self.checkpoints.push((iterations, saved_rank));
        let keep = 4;
        if self.checkpoints.len() > keep {
            self.checkpoints.drain(..self.checkpoints.len() - keep);
        }
    }
}

/// [`train_worker`] from `start`, with the state a rank keeps across world changes.
fn train_from(
    cfg: &TrainConfig,
    group: Group,
    data: &TrainTest,
    run_dir: Option<&Path>,
    start: Start,
    state: &mut RankState,
) -> Result<WorkerResult, RunError> {
    let rank = group.rank();
    let world = group.size();
    // The rank in the job's first world: what fault injection and membership records name.
    let job_rank = group.world_ranks().get(rank).copied().unwrap_or(rank);
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
    let (mut model, position, resume_done, saved_world) = match (&start, &checkpoints) {
        (Start::Fresh, _) => (model, DataPosition::default(), None, world),
        (_, None) => {
            return Err(CheckpointError::Missing(Path::new("(no run directory)").into()).into());
        }
        (start, Some(c)) => {
            let r = match start {
                Start::ResumeFrom(saved) => c.resume_from(*saved, &spec, model, &mut pipeline),
                Start::Received { bytes, .. } => {
                    c.resume_received(bytes, &spec, model, &mut pipeline)
                }
                _ => c.resume(model, &mut pipeline),
            }
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
    if state.recovering.is_some()
        && let Some(change) = state.membership.last_mut()
    {
        change.iteration = resume_done.unwrap_or(0);
    }
    if let Some(done) = resume_done {
        let saved_rank = match start {
            Start::ResumeFrom(saved)
            | Start::Received {
                saved_rank: saved, ..
            } => saved,
            _ => rank,
        };
        state.remember_checkpoint(done, saved_rank);
    }

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

    let mut metrics = match run_dir {
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

    let mut evals = match (rank, run_dir, cfg.eval_every) {
        (0, Some(dir), every) if every > 0 => {
            Some(EvalWriter::create(dir, resume_done).map_err(output_error("eval.csv"))?)
        }
        _ => None,
    };

    let traffic_start = group.traffic();
    let started = Instant::now();
    // What earlier worlds of this rank did (`on-rank-failure = "continue"`) counts too.
    let mut samples = state.samples;
    let mut last_global = None;
    // Rank 0's loss curve: the iterations a new world took over are its own.
    let resumed_at = resume_done.unwrap_or(0) as f64;
    state.curve.retain(|(i, _)| *i < resumed_at);
    // A `step` fault fires inside the iteration's forward pass, after the ranks agreed on data.
    let mid_step: std::cell::Cell<Option<Fault>> = std::cell::Cell::new(None);
    let loss_fn = |m: &Network, b: &(Tensor<2>, Tensor<1, Int>)| {
        if let Some(f) = mid_step.take() {
            fail_mid_step(f, &group);
        }
        localsgd_models::network::loss(m, b)
    };
    state.iteration = pipeline.iteration();
    while pipeline.iteration() < total {
        if cfg.steps.is_none() && loader.epoch() >= cfg.epochs {
            break;
        }
        let due = state
            .faults
            .iter()
            .position(|f| f.kind != FaultKind::Checkpoint && f.due(job_rank, pipeline.iteration()));
        if let Some(i) = due {
            let f = state.faults.remove(i);
            if f.kind == FaultKind::Step {
                mid_step.set(Some(f));
            } else {
                inject(f, cfg, &group, &mut loader)?;
            }
        }
        match pipeline.run_iteration(model, &mut loader, &loss_fn)? {
            Outcome::Trained(m, report) => {
                model = m;
                state.iteration = pipeline.iteration();
                if pipeline.start_traffic() != Traffic::default() {
                    state.start_traffic = pipeline.start_traffic();
                }
                if let Some(since) = state.recovering.take() {
                    recovered(&mut state.membership, Some(since), rank, run_dir)?;
                }
                samples += cfg.batch_size as u64;
                state.samples = samples;
                if report.global_loss.is_some() {
                    last_global = report.global_loss;
                }
                if let Some(w) = &mut metrics {
                    w.record(loader.epoch(), report.lr, &report)
                        .map_err(output_error("metrics"))?;
                }
                let done = pipeline.iteration();
                if rank == 0 {
                    state
                        .curve
                        .push((report.iteration as f64, report.loss as f64));
                    if let Some(p) = &mut state.progress {
                        p(done, total, last_global);
                    }
                    if let Some(e) = &mut evals
                        && (done.is_multiple_of(cfg.eval_every) || done == total)
                    {
                        let acc = accuracy(&model, &data.test, &device)?;
                        let secs = pipeline.phase_times().total().as_secs_f64();
                        e.record(done, secs, acc)
                            .map_err(output_error("eval.csv"))?;
                    }
                }
                // The checkpoint phase sealed a checkpoint of `done` iterations: make every
                // rank's rows up to it durable, then let a resume take it.
                if let Some(checkpoints) = &checkpoints
                    && cfg.checkpoint_every > 0
                    && done.is_multiple_of(cfg.checkpoint_every)
                {
                    let due = state
                        .faults
                        .iter()
                        .position(|f| f.kind == FaultKind::Checkpoint && f.due(job_rank, done));
                    if let Some(i) = due {
                        let f = state.faults.remove(i);
                        inject(f, cfg, &group, &mut loader)?;
                    }
                    sync_run_files(&mut metrics, &mut evals)?;
                    if let Some(g) = &publish_sync {
                        g.barrier()?;
                    }
                    // Every rank wrote its file: this world may continue from it.
                    state.remember_checkpoint(done, rank);
                    if rank == 0 {
                        checkpoints.publish(done)?;
                    }
                }
            }
            Outcome::EndOfData(m) => {
                model = m;
                loader.advance_epoch()?;
            }
        }
    }
    // An overlapped average still in flight finishes its collective inside the timed run; it
    // is saved pending (so a longer resumed run applies it where this one would have) and then
    // applied to the final model.
    pipeline.pending_average()?;
    pipeline.outer_state()?;
    let wall = started.elapsed();
    let traffic = group.traffic() - traffic_start + state.traffic;
    sync_run_files(&mut metrics, &mut evals)?;
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
        state.remember_checkpoint(pipeline.iteration(), rank);
    }

    let model = pipeline.finish(model)?;
    let (local, world, params) = final_models(cfg, model, &pipeline, run_dir, data, &device)?;
    // A world that took over with nothing left to train still records its change.
    if let Some(since) = state.recovering.take() {
        recovered(&mut state.membership, Some(since), rank, run_dir)?;
    }
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
        samples,
        params,
        loss_curve: state.curve.clone(),
    })
}

/// How an epoch's batches make optimizer steps ([`Accumulation`]'s rules): `batches` batches of
/// a rank's shard per epoch, `accumulate` per step.
#[derive(Debug, Clone, Copy)]
struct EpochSteps {
    batches: u64,
    accumulate: u64,
    accumulation: Accumulation,
}

impl EpochSteps {
    /// Optimizer steps in `epochs` epochs: the micro-batches streamed across epochs (the last
    /// step takes what is left), or each epoch's own steps, the last of fewer.
    fn steps(&self, epochs: u64) -> u64 {
        match self.accumulation {
            Accumulation::Stream => (epochs * self.batches).div_ceil(self.accumulate),
            Accumulation::EpochEnd => epochs * self.batches.div_ceil(self.accumulate),
        }
    }

    /// Optimizer steps in the `first` batches left of the current epoch and `epochs` whole
    /// epochs after it (a world that took over mid-epoch).
    fn steps_after(&self, first: u64, epochs: u64) -> u64 {
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
fn effective_settings<'a>(
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
fn build_pipeline(
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
fn checkpoint_failure(e: CheckpointError) -> RunError {
    match e {
        CheckpointError::Comm(e) => RunError::Comm(e),
        CheckpointError::Restore(e) | CheckpointError::Pipeline(e) => RunError::Pipeline(e),
        e => RunError::Checkpoint(e),
    }
}

/// After training: rank 0's `model.safetensors`, the `export` file, this rank's own model and
/// the world average evaluated on the test set, and this rank's final parameters. Collective
/// (the world average).
fn final_models(
    cfg: &TrainConfig,
    model: Network,
    pipeline: &Pipeline<Network>,
    run_dir: Option<&Path>,
    data: &TrainTest,
    device: &Device,
) -> Result<(Evaluation, Evaluation, FlatBuffer), RunError> {
    let rank = pipeline.group().rank();
    // Rank 0's own final model, in its PyTorch twin's state_dict layout.
    if let (0, Some(dir)) = (rank, run_dir) {
        save_pytorch_safetensors(&model, &dir.join(MODEL_FILE)).map_err(|e| RunError::Output {
            what: MODEL_FILE.into(),
            message: e.to_string(),
        })?;
    }
    // `export` with `export-rank`: that rank writes its own model (on its host's file system).
    if let Some(path) = &cfg.export
        && cfg.export_rank == Some(rank)
    {
        export_model(&model, path)?;
    }
    let local = evaluate(&model, &data.test, device)?;
    let params = flatten_params(&model, &ParamSelection::All)
        .map_err(RunError::Comm)?
        .buffer;
    let averaged = pipeline.world_average(model)?;
    // `export` alone: rank 0 writes the world average.
    if let Some(path) = &cfg.export
        && cfg.export_rank.is_none()
        && rank == 0
    {
        export_model(&averaged, path)?;
    }
    let world = evaluate(&averaged, &data.test, device)?;
    Ok((local, world, params))
}

/// Do what an injected fault asks for ([`crate::fault`]), on the faulty rank.
fn inject(
    f: Fault,
    cfg: &TrainConfig,
    group: &Group,
    loader: &mut ShardLoader,
) -> Result<(), RunError> {
    let (rank, iteration) = (f.rank, f.iteration);
    tracing::warn!(?f.kind, rank, iteration, "injecting a fault ({})", crate::fault::ENV);
    match f.kind {
        FaultKind::Panic => panic!(
            "injected fault: rank {rank} panics before iteration {iteration} ({})",
            crate::fault::ENV
        ),
        // A panic under MPI ends the whole job (`MPI_Abort`); a process that dies does not.
        FaultKind::Checkpoint if group.backend() != "threads" => {
            eprintln!(
                "injected fault: rank {rank} aborts its process after the checkpoint of \
                 {iteration} iterations was written, before it is published ({})",
                crate::fault::ENV
            );
            std::process::abort();
        }
        FaultKind::Checkpoint => panic!(
            "injected fault: rank {rank} panics after the checkpoint of {iteration} iterations \
             was written, before it is published ({})",
            crate::fault::ENV
        ),
        FaultKind::Stall => {
            std::thread::sleep(Duration::from_secs(cfg.timeout_secs.saturating_add(3)))
        }
        FaultKind::Abort => {
            eprintln!(
                "injected fault: rank {rank} aborts its process before iteration {iteration} ({})",
                crate::fault::ENV
            );
            std::process::abort();
        }
        FaultKind::Kill => {
            eprintln!(
                "injected fault: rank {rank} sends its process SIGKILL before iteration \
                 {iteration} ({})",
                crate::fault::ENV
            );
            kill_this_process();
        }
        // Its peers are about to agree on data (an all-reduce): a barrier does not match.
        FaultKind::Mismatch => group.barrier()?,
        FaultKind::Short => loader.end_epoch_here(),
        // Fired inside the iteration (`fail_mid_step`), not before it.
        FaultKind::Step => fail_mid_step(f, group),
    }
    Ok(())
}

/// `kill -9` of this process (`raise(SIGKILL)`).
fn kill_this_process() -> ! {
    unsafe extern "C" {
        fn raise(signal: std::ffi::c_int) -> std::ffi::c_int;
    }
    const SIGKILL: std::ffi::c_int = 9;
    // SAFETY: raising a signal has no preconditions; SIGKILL cannot be caught, so the process
    // ends here.
    unsafe { raise(SIGKILL) };
    std::process::abort()
}

/// A `step` fault ([`crate::fault`]): the rank fails inside its forward pass, while its peers
/// go on into the iteration's collectives (gradient sync, averaging): on the thread backend its
/// thread panics, with one process per rank its process ends (a panic under MPI would end the
/// whole job).
fn fail_mid_step(f: Fault, group: &Group) {
    let (rank, iteration) = (f.rank, f.iteration);
    if group.backend() != "threads" {
        eprintln!(
            "injected fault: rank {rank} aborts its process inside iteration {iteration} ({})",
            crate::fault::ENV
        );
        std::process::abort();
    }
    panic!(
        "injected fault: rank {rank} panics inside iteration {iteration} ({})",
        crate::fault::ENV
    );
}

/// Write `model` to the `export` file (PyTorch layout, atomically; [`crate::export`]).
fn export_model(model: &Network, path: &Path) -> Result<(), RunError> {
    save_pytorch_safetensors(model, path).map_err(|e| RunError::Output {
        what: "export".into(),
        message: e.to_string(),
    })
}

/// Sync this rank's metrics file and (rank 0) the evaluation file, before a checkpoint is
/// published.
fn sync_run_files(
    metrics: &mut Option<MetricsWriter>,
    evals: &mut Option<EvalWriter>,
) -> Result<(), RunError> {
    if let Some(w) = metrics {
        w.sync().map_err(output_error("metrics"))?;
    }
    if let Some(e) = evals {
        e.sync().map_err(output_error("eval.csv"))?;
    }
    Ok(())
}

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
                if is_lost(&e) {
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

/// Whether a communication error says a peer is gone (failed, or under MPI a group revoked
/// after a failure).
fn is_lost(e: &CommError) -> bool {
    matches!(e, CommError::PeerFailed { .. } | CommError::Revoked { .. })
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

/// The new world completed its first iteration after a membership change (`since`: when the
/// failure reached this rank), or ended or failed again before one (`None`): time the
/// recovery, and (rank 0) append the change to the run directory's `membership.csv`.
fn recovered(
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
/// gradient hook, the averager, a checkpoint's barriers, setup): a collective whose peer
/// failed, or (MPI with ULFM) a group a peer revoked after a failure.
fn is_peer_failure(e: &RunError) -> bool {
    let lost = is_lost;
    // Each error in the chain, itself included: `#[error(transparent)]` wrappers hand out
    // their inner error's source, so every level is also downcast.
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(c) = err.downcast_ref::<CommError>() {
            return lost(c);
        }
        // The transparent wrappers of a `CommError` (their `source` skips it).
        if let Some(localsgd_hooks::HookError::Comm(c)) = err.downcast_ref() {
            return lost(c);
        }
        if let Some(localsgd_averagers::AveragerError::Comm(c)) = err.downcast_ref() {
            return lost(c);
        }
        let inner = match err.downcast_ref::<RunError>() {
            Some(RunError::Pipeline(p)) => Some(p as &(dyn std::error::Error + 'static)),
            Some(RunError::Checkpoint(c)) => Some(c as &(dyn std::error::Error + 'static)),
            _ => None,
        };
        next = inner.or_else(|| err.source());
    }
    false
}
