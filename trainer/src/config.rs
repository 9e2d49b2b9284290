//! The run configuration: one struct, read from a TOML file (`--config run.toml`), overridden by
//! command-line flags of the same names, validated before anything is written.

use crate::cli::{Widths, parse_widths};
pub use crate::pipeline::{Accumulation, BufferPolicy};
use localsgd_averagers::PseudoGradient;
use localsgd_comm::Precision;
use localsgd_pipeline::algorithm::AlgorithmSpec;
pub use localsgd_pipeline::settings::{
    AlgorithmKind, Compression, Levels, OuterOptions, OuterSettings, PipelineBuckets, SettingError,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Which process-group backend runs the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// W worker threads in this process (the default; needs nothing installed).
    Threads,
    /// One process per rank under `mpirun` (cargo feature `mpi`).
    Mpi,
    /// One process per rank, each with a GPU, communicating through NCCL (cargo feature
    /// `nccl`); started by a launcher that sets `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and
    /// `MASTER_PORT` (torchrun) or their `LOCALSGD_` names.
    Nccl,
}

impl Backend {
    /// The value as written in a config file or a flag: `threads`, `mpi` or `nccl`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Threads => "threads",
            Backend::Mpi => "mpi",
            Backend::Nccl => "nccl",
        }
    }
}

/// Where each rank computes forward/backward and the optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// burn's pure-Rust `flex` CPU backend (the default; needs nothing installed).
    Cpu,
    /// burn's CUDA backend, one GPU per rank (the rank's index among the ranks on its host).
    /// Needs a binary built with the trainer feature `cuda`.
    Cuda,
}

/// How `diloco`/`slowmo` reduce the pseudo-gradient over the ranks (equal in exact arithmetic,
/// they round differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OuterReduce {
    /// Every rank computes `θ − x_r`; the ranks average those (torchft, OpenDiLoCo; `diloco`'s
    /// default).
    MeanOfDeltas,
    /// The ranks average their parameters; every rank computes `θ − mean(x_r)` (fairscale; the
    /// only one `slowmo` accepts).
    DeltaOfMean,
}

impl From<OuterReduce> for PseudoGradient {
    fn from(r: OuterReduce) -> Self {
        match r {
            OuterReduce::MeanOfDeltas => PseudoGradient::MeanOfDeltas,
            OuterReduce::DeltaOfMean => PseudoGradient::DeltaOfMean,
        }
    }
}

/// Which data set to train on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetKind {
    /// The bundled UCI digits (8x8 images, 10 classes), canonical split.
    Digits,
    /// Generated Gaussian blobs (`synthetic-*` settings).
    Synthetic,
    /// MNIST-format IDX files in `data-dir`.
    Idx,
}

/// The model the binary trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// A multi-layer perceptron of `hidden` widths (the default).
    Mlp,
    /// A CNN for square gray-scale images: per entry of `channels` a 3x3 conv, PyTorch-style
    /// batch normalization, ReLU and 2x2 max pooling, then a Linear head.
    Cnn,
}

/// The optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// SGD with (optional) momentum; `weight-decay` is PyTorch's (L2 added to the gradient).
    Sgd,
    /// Adam with PyTorch's defaults (betas 0.9/0.999, eps 1e-8); `weight-decay` is L2 added to
    /// the gradient, as `torch.optim.Adam`'s.
    Adam,
    /// AdamW with PyTorch's defaults (betas 0.9/0.999, eps 1e-8, decoupled weight decay 0.01).
    Adamw,
}

/// Learning-rate schedule of the binary (see [`LrSchedule`](crate::lr_schedule::LrSchedule)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LrScheduleKind {
    /// `lr` at every step.
    Constant,
    /// `StepLR(lr-step-size, lr-gamma)`.
    Step,
    /// `CosineAnnealingLR(T_max = the run's iterations, eta_min = lr-min)`.
    Cosine,
    /// `LinearLR(start_factor = lr-warmup-start-factor, total_iters = lr-warmup-steps)`.
    LinearWarmup,
}

/// Format of the per-step metrics file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum MetricsFormat {
    /// `metrics.csv`.
    Csv,
    /// `metrics.jsonl`.
    Jsonl,
}

/// The flag type of a setting: the setting's own type, or the type after `as` (an optional
/// setting's flag takes the value itself; a list flag parses its own syntax).
macro_rules! flag_type {
    ($setting:ty) => {
        $setting
    };
    ($setting:ty, $flag:ty) => {
        $flag
    };
}

/// Declares every setting once: its doc, its flag attributes, its type and its default. From
/// that one list come [`TrainConfig`] (the TOML file's keys), its `Default`, [`ConfigFlags`]
/// (the flags of `localsgd train`, documented by the same doc) and the overlay of given flags
/// on a configuration. `name: Option<T> as T` is a setting that may stay unset, whose flag
/// takes a `T`; `name: Vec<usize> as Widths` one whose flag parses a comma-separated list.
macro_rules! settings {
    ($(
        $(#[doc = $doc:expr])*
        $(#[arg($($arg:tt)*)])?
        $name:ident : $ty:ty $(as $flag:ty)? = $default:expr,
    )*) => {
        /// Every setting of a training run. Keys in the TOML file and command-line flags share
        /// these names (kebab-case): `period = 4` in the file is `--period 4` on the command
        /// line.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
        pub struct TrainConfig {
            $( $(#[doc = $doc])* pub $name: $ty, )*
        }

        impl Default for TrainConfig {
            fn default() -> Self {
                Self { $( $name: $default, )* }
            }
        }

        /// The settings given on the command line, each overriding the same key of the config
        /// file: the flags of `localsgd train` (and of the commands that take a run's settings).
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct ConfigFlags {
            /// TOML file with settings (keys are the flag names without `--`).
            #[arg(long, value_name = "FILE")]
            pub config: Option<PathBuf>,
            $(
                $(#[doc = $doc])*
                #[arg(long $(, $($arg)*)?)]
                pub $name: Option<flag_type!($ty $(, $flag)?)>,
            )*
        }

        impl ConfigFlags {
            /// Writes every setting given as a flag over `cfg`.
            pub fn overlay(&self, cfg: &mut TrainConfig) {
                $( if let Some(v) = &self.$name { cfg.$name = v.clone().into(); } )*
            }
        }
    };
}

settings! {
    /// Number of workers (ranks). With `backend = "mpi"` or `"nccl"` it defaults to the world
    /// size (`mpirun -np N`, `WORLD_SIZE`); a value given explicitly must equal it.
    #[arg(allow_negative_numbers = true)]
    workers: usize = 2,
    /// Process-group backend.
    #[arg(value_enum)]
    backend: Backend = Backend::Threads,
    /// Compute device of each rank.
    #[arg(value_enum)]
    device: DeviceKind = DeviceKind::Cpu,
    /// Training algorithm.
    #[arg(value_enum)]
    algorithm: AlgorithmKind = AlgorithmKind::PostLocalSgd,
    /// Iterations of global gradient averaging before local steps start; also the averager's
    /// warmup (one knob for both, as in Lightning). At most `i64::MAX` (PyTorch's counter).
    #[arg(allow_negative_numbers = true)]
    warmup: u64 = 50,
    /// The same switch point in epochs (the post-local SGD paper switches at the first
    /// learning-rate decay, usually an epoch boundary): when set, `warmup` becomes this many
    /// epochs' optimizer steps (batches per rank per epoch, divided by `accumulate`).
    #[arg(allow_negative_numbers = true)]
    warmup_epochs: Option<u64> as u64 = None,
    /// Model averaging period in optimizer steps: local SGD's and post-local SGD's averages,
    /// DiLoCo's and Streaming DiLoCo's rounds (H), SlowMo's plain averages (fairscale's
    /// `localsgd_frequency`). `0` is invalid. Unset: 4 for `local-sgd` and `post-local-sgd`, 50
    /// for `diloco` and `streaming-diloco`, 3 for `slowmo`; refused for `ddp` and
    /// `hierarchical` (whose `levels` carry the periods).
    #[arg(allow_negative_numbers = true)]
    period: Option<u64> as u64 = None,
    /// Overlapped averaging (local-sgd, post-local-sgd): start each average after its step's
    /// optimizer step and apply it `overlap` iterations later as `avg(x_t) + (x_now - x_t)`,
    /// communicating while those iterations compute. `0` (default): blocking averaging, as
    /// PyTorch. At most `period`.
    #[arg(allow_negative_numbers = true)]
    overlap: u64 = 0,
    /// Hierarchical levels as `period:group-size` pairs, e.g. `"2:2,4:4"`. Periods strictly
    /// increase; the last group size must be the number of workers.
    levels: Levels = Levels::default(),
    /// `diloco`/`slowmo`: the outer learning rate (DiLoCo's outer SGD lr, SlowMo's
    /// `slowmo_lr` α). Unset: 0.7 for `diloco`, 1 for `slowmo`.
    #[arg(allow_negative_numbers = true)]
    outer_lr: Option<f64> as f64 = None,
    /// `diloco`/`slowmo`: the outer momentum (SGD momentum, SlowMo's `slowmo_momentum` β).
    /// Unset: 0.9 for `diloco`, 0.5 for `slowmo`.
    #[arg(allow_negative_numbers = true)]
    outer_momentum: Option<f64> as f64 = None,
    /// `diloco`: Nesterov momentum for the outer SGD (needs `outer-momentum` > 0). Unset: true
    /// when the outer momentum is above 0. `slowmo` is heavy-ball only.
    outer_nesterov: Option<bool> as bool = None,
    /// `diloco`/`slowmo`: how the pseudo-gradient is reduced. Unset: `mean-of-deltas` for
    /// `diloco`, `delta-of-mean` for `slowmo`.
    #[arg(value_enum)]
    outer_reduce: Option<OuterReduce> as OuterReduce = None,
    /// `diloco`, `streaming-diloco`: send the pseudo-gradients in half precision (`fp16`, `bf16`; needs
    /// `mean-of-deltas`). Unset or `none`: full precision.
    #[arg(value_enum)]
    outer_compression: Option<Compression> as Compression = None,
    /// `streaming-diloco`: the number of fragments F (contiguous runs of whole parameter
    /// tensors); one fragment syncs every `period / fragments` local steps, each every
    /// `period`. Unset: 2. The other algorithms refuse it.
    #[arg(allow_negative_numbers = true)]
    fragments: Option<usize> as usize = None,
    /// `streaming-diloco`: τ (torchft's `fragment_sync_delay`): a fragment's
    /// pseudo-gradient is measured and its all-reduce started τ local steps before it is
    /// applied, behind those steps' compute. Below `period / fragments`. Unset: 0.
    #[arg(allow_negative_numbers = true)]
    fragment_sync_delay: Option<u64> as u64 = None,
    /// `streaming-diloco`: α (torchft's `fragment_update_alpha`): after its outer
    /// step a fragment becomes `θ_f + α·(x_f − θ_f)`. In [0, 1]. Unset: 0.
    #[arg(allow_negative_numbers = true)]
    fragment_alpha: Option<f64> as f64 = None,
    /// `slowmo`: the slow momentum step every this many optimizer steps (fairscale's
    /// `slowmo_frequency`); the models are averaged every `period` steps in between. Unset:
    /// 48, fairscale's default.
    #[arg(allow_negative_numbers = true)]
    slowmo_frequency: Option<u64> as u64 = None,
    /// Post-warmup gradient all-reduce subgroup size (blocks of this many ranks). Unset: the
    /// ranks on the same host.
    #[arg(allow_negative_numbers = true)]
    subgroup_size: Option<usize> as usize = None,
    /// After warmup, keep all-reducing gradients within the subgroup (PyTorch's
    /// `post_local_gradient_allreduce`).
    post_local_allreduce: bool = false,
    /// Give every rank rank 0's parameters and buffers before the first iteration of a fresh
    /// run (PyTorch DDP's construction-time broadcast). Not on resume.
    broadcast_start: bool = true,
    /// Buffers (BatchNorm running statistics, frozen parameters): `broadcast` from rank 0 every
    /// iteration (DDP's `broadcast_buffers=True`), `average` at averaging steps, or `local`.
    #[arg(value_enum)]
    buffers: BufferPolicy = BufferPolicy::Broadcast,
    /// Pipeline the gradient buckets (ddp, and the warmup of post-local-sgd / hierarchical):
    /// start every bucket's average non-blocking and step each bucket's parameters as soon as
    /// its average arrives. Same numbers either way; with `compression` buckets run the blocking
    /// way.
    #[arg(value_enum)]
    pipeline_buckets: PipelineBuckets = PipelineBuckets::Auto,
    /// Gradient bucket cap in MiB (buckets after the first).
    #[arg(allow_negative_numbers = true)]
    bucket_cap_mb: f64 = 25.0,
    /// First gradient bucket cap in MiB.
    #[arg(allow_negative_numbers = true)]
    first_bucket_mb: f64 = 1.0,
    /// Gradient compression around the hook.
    #[arg(value_enum)]
    compression: Compression = Compression::None,
    /// The model: `mlp` or `cnn`.
    #[arg(value_enum)]
    model: ModelKind = ModelKind::Mlp,
    /// Hidden layer widths of the MLP.
    #[arg(value_parser = parse_widths, value_name = "W1,W2,...", allow_hyphen_values = true)]
    hidden: Vec<usize> as Widths = vec![64],
    /// Output channels of the CNN's conv blocks (model = "cnn").
    #[arg(value_parser = parse_widths, value_name = "C1,C2,...", allow_hyphen_values = true)]
    channels: Vec<usize> as Widths = vec![8, 16],
    /// Data set.
    #[arg(value_enum)]
    dataset: DatasetKind = DatasetKind::Digits,
    /// Directory with MNIST-format IDX files (dataset = "idx").
    data_dir: Option<PathBuf> as PathBuf = None,
    /// Number of generated samples (dataset = "synthetic"); 80% train, 20% test.
    #[arg(allow_negative_numbers = true)]
    synthetic_samples: usize = 2000,
    /// Feature dimension of the synthetic data.
    #[arg(allow_negative_numbers = true)]
    synthetic_dim: usize = 16,
    /// Number of classes of the synthetic data.
    #[arg(allow_negative_numbers = true)]
    synthetic_classes: usize = 4,
    /// Batch size per worker.
    #[arg(allow_negative_numbers = true)]
    batch_size: usize = 32,
    /// Micro-batches of `batch-size` per optimizer step (gradient accumulation; 1: none). Each
    /// micro-batch's loss is divided by it before backward (the summed gradients are their
    /// mean, PyTorch's accumulation loop).
    #[arg(allow_negative_numbers = true)]
    accumulate: usize = 1,
    /// How a step's micro-batches meet an epoch's end: `stream` (one stream across epochs, as
    /// iteration-based PyTorch loops draw them; the run's last step takes what is left) or
    /// `epoch-end` (Lightning: each epoch's last step takes the micro-batches left). Every
    /// micro-batch is trained either way.
    #[arg(value_enum)]
    accumulation: Accumulation = Accumulation::Stream,
    /// Shuffle the training data every epoch (same permutation on every rank).
    shuffle: bool = true,
    /// Seed for model initialization, shuffling and synthetic data.
    #[arg(allow_negative_numbers = true)]
    seed: u64 = 0,
    /// Optimizer.
    #[arg(value_enum)]
    optimizer: OptimizerKind = OptimizerKind::Sgd,
    /// Learning rate.
    #[arg(allow_negative_numbers = true)]
    lr: f64 = 0.1,
    /// SGD momentum (0 disables it). Ignored by Adam.
    #[arg(allow_negative_numbers = true)]
    momentum: f64 = 0.9,
    /// Weight decay; unset: the optimizer's PyTorch default (0 for sgd and adam, 0.01 for
    /// adamw).
    #[arg(allow_negative_numbers = true)]
    weight_decay: Option<f64> as f64 = None,
    /// Clip the gradients' global L2 norm to this value before each optimizer step
    /// (`clip_grad_norm_`); 0: no clipping.
    #[arg(allow_negative_numbers = true)]
    clip_grad_norm: f64 = 0.0,
    /// Learning-rate schedule, stepped once per iteration.
    #[arg(value_enum)]
    lr_schedule: LrScheduleKind = LrScheduleKind::Constant,
    /// `step`: iterations between decays.
    #[arg(allow_negative_numbers = true)]
    lr_step_size: u64 = 100,
    /// `step`: decay factor (PyTorch's default 0.1).
    #[arg(allow_negative_numbers = true)]
    lr_gamma: f64 = 0.1,
    /// `cosine`: the learning rate at the end of the run (PyTorch's `eta_min`, default 0).
    #[arg(allow_negative_numbers = true)]
    lr_min: f64 = 0.0,
    /// `linear-warmup`: warmup iterations (PyTorch's `total_iters`, default 5).
    #[arg(allow_negative_numbers = true)]
    lr_warmup_steps: u64 = 5,
    /// `linear-warmup`: the first iteration's factor (PyTorch's `start_factor`, default 1/3).
    #[arg(allow_negative_numbers = true)]
    lr_warmup_start_factor: f64 = 1.0 / 3.0,
    /// Number of epochs.
    #[arg(allow_negative_numbers = true)]
    epochs: u64 = 30,
    /// Stop after this many iterations instead (overrides `epochs` when set).
    #[arg(allow_negative_numbers = true)]
    steps: Option<u64> as u64 = None,
    /// Save a checkpoint every this many iterations (0: only at the end).
    #[arg(allow_negative_numbers = true)]
    checkpoint_every: u64 = 0,
    /// All-reduce and log the loss every this many iterations (0: never).
    #[arg(allow_negative_numbers = true)]
    log_every: u64 = 10,
    /// Evaluate rank 0's model on the test set every this many iterations and after the last
    /// one, into `eval.csv` (0: never). The evaluation time is not counted as training time.
    #[arg(allow_negative_numbers = true)]
    eval_every: u64 = 0,
    /// Where the config, metrics, loss curve and checkpoints go.
    run_dir: PathBuf = PathBuf::from("runs/latest"),
    /// Continue from the latest checkpoint in `run-dir`.
    #[arg(num_args = 0..=1, default_missing_value = "true")]
    resume: bool = false,
    /// Initialize the model from a PyTorch safetensors file (MLP: `fc1.weight` [out, in],
    /// `fc1.bias`, ...; CNN: `convs.0.weight`, `norms.0.running_mean`, ..., `head.weight`).
    init_weights: Option<PathBuf> as PathBuf = None,
    /// After training, write the world-averaged model (or `export-rank`'s own model) to this
    /// file: safetensors with the PyTorch twin's `state_dict` names and layout, which
    /// `torch.nn.Module.load_state_dict` loads (see `localsgd export` for a finished run).
    #[arg(value_name = "FILE")]
    export: Option<PathBuf> as PathBuf = None,
    /// Export this rank's own model instead of the world average (needs `export`).
    #[arg(allow_negative_numbers = true)]
    export_rank: Option<usize> as usize = None,
    /// Seconds a collective may wait for its peers before failing.
    #[arg(allow_negative_numbers = true)]
    timeout_secs: u64 = 300,
    /// Skip optimizer steps whose gradients are not finite (averaging still runs).
    skip_non_finite: bool = false,
    /// Flush subnormal floats to zero on the compute threads (faster long runs on x86; results
    /// differ from IEEE arithmetic wherever subnormals occur; x86 and aarch64 only).
    flush_denormals: bool = false,
    /// Format of the per-step metrics file.
    #[arg(value_enum)]
    metrics_format: MetricsFormat = MetricsFormat::Csv,
    /// Show a progress bar on rank 0.
    progress: bool = true,
    /// Print the effective configuration before training (it is saved as the run directory's
    /// `config.toml` either way).
    print_config: bool = false,
}

/// A setting with a value that cannot work (the library's [`SettingError`], under the name
/// the application has always used).
pub type ConfigError = SettingError;

fn bad(setting: &'static str, value: impl ToString, valid: impl ToString) -> ConfigError {
    SettingError::new(setting, value, valid)
}

impl TrainConfig {
    /// The algorithm settings of this configuration, for [`crate::algorithm::build`] (call
    /// [`validate`](Self::validate) first; this checks only the outer optimizer's settings).
    pub fn algorithm_spec(&self) -> Result<AlgorithmSpec, ConfigError> {
        let cfg = self;
        let mib = |x: f64| (x * 1024.0 * 1024.0) as usize;
        let period = cfg.period.or(cfg.algorithm.default_period());
        let levels = cfg.levels.as_slice();
        Ok(AlgorithmSpec {
            kind: cfg.algorithm,
            warmup: cfg.warmup,
            period,
            overlap: cfg.overlap,
            levels: cfg.levels.as_slice().to_vec(),
            subgroup_size: cfg.subgroup_size,
            post_local_allreduce: cfg.post_local_allreduce,
            pipeline_buckets: cfg.pipeline_buckets,
            caps: localsgd_hooks::BucketCaps {
                first_bytes: mib(cfg.first_bucket_mb).max(1),
                rest_bytes: mib(cfg.bucket_cap_mb).max(1),
            },
            compression: cfg.compression,
            outer: OuterSettings::resolve(
                cfg.algorithm,
                period.unwrap_or(0),
                levels,
                &cfg.outer_options(),
            )?,
        })
    }

    /// Read a TOML file. Unknown keys and wrong types are errors that name the key.
    pub fn from_toml_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        Self::from_toml_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))
    }

    /// Parse TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The effective configuration as TOML (printed and saved in the run directory).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# could not serialize config: {e}\n"))
    }

    /// These settings with the algorithm's defaults written out where a setting was left unset
    /// (`period`, `slowmo-frequency`): the effective configuration printed and saved as the
    /// run's `config.toml`, which trains the same when read back.
    pub fn with_defaults_filled(&self) -> Self {
        let mut cfg = self.clone();
        cfg.period = cfg.period.or(cfg.algorithm.default_period());
        if cfg.algorithm == AlgorithmKind::Slowmo && cfg.levels.is_empty() {
            cfg.slowmo_frequency = cfg
                .slowmo_frequency
                .or(Some(localsgd_pipeline::settings::SLOWMO_FREQUENCY));
        }
        cfg
    }

    /// The outer optimizer's settings as given (resolved and checked by
    /// [`OuterSettings::resolve`] in [`algorithm_spec`](Self::algorithm_spec)).
    pub fn outer_options(&self) -> OuterOptions {
        OuterOptions {
            lr: self.outer_lr,
            momentum: self.outer_momentum,
            nesterov: self.outer_nesterov,
            reduce: self.outer_reduce.map(Into::into),
            compression: match self.outer_compression {
                None | Some(Compression::None) => None,
                Some(Compression::Fp16) => Some(Precision::Fp16),
                Some(Compression::Bf16) => Some(Precision::Bf16),
            },
            fragments: self.fragments,
            fragment_sync_delay: self.fragment_sync_delay,
            fragment_alpha: self.fragment_alpha,
            slowmo_frequency: self.slowmo_frequency,
        }
    }

    /// Check every setting that can be checked without touching the file system's run
    /// directory. `mpi_world` is the MPI world size when running under MPI.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(bad("workers", 0, "at least 1 worker"));
        }
        if self.backend == Backend::Threads {
            let max = localsgd_comm::ThreadWorld::max_workers();
            if self.workers > max {
                return Err(bad(
                    "workers",
                    self.workers,
                    format!(
                        "at most {max} with the thread backend on this machine (one thread per \
                         worker; vm.max_map_count / 8 and kernel.threads-max / 2 bound them), or \
                         `backend = \"mpi\"` with one process per rank"
                    ),
                ));
            }
        }
        if self.device == DeviceKind::Cuda && !cfg!(feature = "cuda") {
            return Err(bad(
                "device",
                "cuda",
                "`cpu`: this binary was built without CUDA support; rebuild with `cargo build -p localsgd-trainer --features cuda` on a machine with the CUDA toolkit",
            ));
        }
        if self.flush_denormals
            && let Err(e) = crate::denormals::supported()
        {
            return Err(bad("flush-denormals", true, format!("`false`: {e}")));
        }
        // The algorithm rules (warmup, period, overlap, levels, subgroup size, compression)
        // are the pipeline's, checked on the resolved spec (which also resolves and checks the
        // outer optimizer's settings).
        self.algorithm_spec()?.validate(self.workers)?;
        if !(self.bucket_cap_mb > 0.0 && self.bucket_cap_mb.is_finite()) {
            return Err(bad(
                "bucket-cap-mb",
                self.bucket_cap_mb,
                "a positive number of MiB",
            ));
        }
        if !(self.first_bucket_mb > 0.0 && self.first_bucket_mb.is_finite()) {
            return Err(bad(
                "first-bucket-mb",
                self.first_bucket_mb,
                "a positive number of MiB",
            ));
        }
        if self.hidden.contains(&0) {
            return Err(bad(
                "hidden",
                format!("{:?}", self.hidden),
                "positive layer widths, e.g. [64]",
            ));
        }
        if self.channels.is_empty() || self.channels.contains(&0) {
            return Err(bad(
                "channels",
                format!("{:?}", self.channels),
                "one or more positive channel counts, e.g. [8, 16]",
            ));
        }
        if self.batch_size == 0 {
            return Err(bad("batch-size", 0, "at least 1"));
        }
        if self.accumulate == 0 {
            return Err(bad(
                "accumulate",
                0,
                "at least 1 micro-batch per optimizer step",
            ));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(bad("lr", self.lr, "a positive finite learning rate"));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(bad("momentum", self.momentum, "a value in [0, 1)"));
        }
        if let Some(wd) = self.weight_decay
            && !(wd >= 0.0 && wd.is_finite())
        {
            return Err(bad("weight-decay", wd, "a finite value >= 0"));
        }
        if !(self.clip_grad_norm >= 0.0 && self.clip_grad_norm.is_finite()) {
            return Err(bad(
                "clip-grad-norm",
                self.clip_grad_norm,
                "a positive maximum norm, or 0 for no clipping",
            ));
        }
        if self.lr_step_size == 0 {
            return Err(bad("lr-step-size", 0, "at least 1 iteration"));
        }
        if !(self.lr_gamma > 0.0 && self.lr_gamma.is_finite()) {
            return Err(bad("lr-gamma", self.lr_gamma, "a positive finite factor"));
        }
        if !(self.lr_min >= 0.0 && self.lr_min <= self.lr) {
            return Err(bad(
                "lr-min",
                self.lr_min,
                format!("a value in [0, lr = {}]", self.lr),
            ));
        }
        if self.lr_warmup_steps == 0 {
            return Err(bad("lr-warmup-steps", 0, "at least 1 iteration"));
        }
        if !(self.lr_warmup_start_factor > 0.0 && self.lr_warmup_start_factor <= 1.0) {
            return Err(bad(
                "lr-warmup-start-factor",
                self.lr_warmup_start_factor,
                "a factor in (0, 1]",
            ));
        }
        if self.epochs == 0 && self.steps.is_none() {
            return Err(bad("epochs", 0, "at least 1 (or set `steps`)"));
        }
        if self.steps == Some(0) {
            return Err(bad("steps", 0, "at least 1"));
        }
        if self.timeout_secs == 0 {
            return Err(bad("timeout-secs", 0, "at least 1 second"));
        }
        match self.dataset {
            DatasetKind::Idx => match &self.data_dir {
                None => {
                    return Err(bad(
                        "data-dir",
                        "(unset)",
                        "dataset \"idx\" needs `data-dir`, a directory with MNIST-format IDX files",
                    ));
                }
                Some(d) if !d.is_dir() => {
                    return Err(bad(
                        "data-dir",
                        d.display(),
                        "an existing directory with MNIST-format IDX files",
                    ));
                }
                Some(_) => {}
            },
            DatasetKind::Synthetic => {
                if self.synthetic_classes < 2 {
                    return Err(bad(
                        "synthetic-classes",
                        self.synthetic_classes,
                        "at least 2",
                    ));
                }
                if self.synthetic_dim == 0 {
                    return Err(bad("synthetic-dim", 0, "at least 1"));
                }
                if self.synthetic_samples < 10 {
                    return Err(bad(
                        "synthetic-samples",
                        self.synthetic_samples,
                        "at least 10",
                    ));
                }
            }
            DatasetKind::Digits => {}
        }
        if let Some(p) = &self.init_weights
            && !p.is_file()
        {
            return Err(bad(
                "init-weights",
                p.display(),
                "an existing safetensors file",
            ));
        }
        if let Some(p) = &self.export {
            check_export_path(p)?;
        }
        if let Some(r) = self.export_rank {
            if self.export.is_none() {
                return Err(bad(
                    "export-rank",
                    r,
                    "unset, or set together with `export` (the file to write)",
                ));
            }
            if r >= self.workers {
                return Err(bad(
                    "export-rank",
                    r,
                    format!("a rank below `workers` = {}", self.workers),
                ));
            }
        }
        Ok(())
    }
}

/// The rule for an export file (`export` and `localsgd export`): a file name in an existing
/// directory, not a directory itself.
pub fn check_export_path(path: &Path) -> Result<(), ConfigError> {
    if path.is_dir() {
        return Err(bad(
            "export",
            path.display(),
            "a file to write, not a directory",
        ));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(bad(
            "export",
            path.display(),
            format!(
                "a file in an existing directory ({} does not exist)",
                parent.display()
            ),
        ));
    }
    Ok(())
}
