//! Command-line flags: one flag per configuration setting, with the same kebab-case name as the
//! TOML key. A flag overrides the file, which overrides the defaults.

use crate::config::{
    AlgorithmKind, Backend, Compression, DatasetKind, DeviceKind, Levels, LrScheduleKind,
    MetricsFormat, ModelKind, OptimizerKind, OuterReduce, PipelineBuckets, TrainConfig,
};
use crate::pipeline::{Accumulation, BufferPolicy};
use std::path::PathBuf;

/// Layer widths as given on the command line: comma-separated, `""` for none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Widths(pub Vec<usize>);

/// Parse `128,64` (spaces allowed around the commas) or `""` (no layers) into [`Widths`].
pub fn parse_widths(s: &str) -> Result<Widths, String> {
    if s.trim().is_empty() {
        return Ok(Widths(Vec::new()));
    }
    s.split(',')
        .map(|part| {
            part.trim().parse::<usize>().map_err(|_| {
                format!(
                    "{part:?} is not a width: expected comma-separated non-negative integers, e.g. 128,64, or \"\" for no hidden layer"
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Widths)
}

/// Settings given on the command line (each overrides the same key of the config file).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigFlags {
    /// TOML file with settings (keys are the flag names without `--`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Number of workers (ranks).
    #[arg(long, allow_negative_numbers = true)]
    pub workers: Option<usize>,
    /// Process-group backend.
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Compute device of each rank.
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Training algorithm.
    #[arg(long, value_enum)]
    pub algorithm: Option<AlgorithmKind>,
    /// Warmup iterations (gradient all-reduce before local steps; also the averager's warmup).
    #[arg(long, allow_negative_numbers = true)]
    pub warmup: Option<u64>,
    /// The warmup in epochs instead (replaces `warmup`).
    #[arg(long, allow_negative_numbers = true)]
    pub warmup_epochs: Option<u64>,
    /// Model averaging period.
    #[arg(long, allow_negative_numbers = true)]
    pub period: Option<u64>,
    /// Overlapped averaging: apply each average this many iterations after it starts (0: blocking).
    #[arg(long, allow_negative_numbers = true)]
    pub overlap: Option<u64>,
    /// Hierarchical levels, e.g. "2:2,4:4" (period:group-size).
    #[arg(long)]
    pub levels: Option<Levels>,
    /// diloco/slowmo: outer learning rate (default 0.7 for diloco, 1 for slowmo).
    #[arg(long, allow_negative_numbers = true)]
    pub outer_lr: Option<f64>,
    /// diloco/slowmo: outer momentum (default 0.9 for diloco, 0.5 for slowmo).
    #[arg(long, allow_negative_numbers = true)]
    pub outer_momentum: Option<f64>,
    /// diloco: Nesterov outer momentum (true/false; default true when the momentum is above 0).
    #[arg(long)]
    pub outer_nesterov: Option<bool>,
    /// diloco/slowmo: pseudo-gradient reduction (default mean-of-deltas for diloco,
    /// delta-of-mean for slowmo).
    #[arg(long, value_enum)]
    pub outer_reduce: Option<OuterReduce>,
    /// diloco: pseudo-gradient compression (none, fp16, bf16; needs mean-of-deltas).
    #[arg(long, value_enum)]
    pub outer_compression: Option<Compression>,
    /// diloco: Streaming DiLoCo's fragments (default 1: plain DiLoCo).
    #[arg(long, allow_negative_numbers = true)]
    pub fragments: Option<usize>,
    /// diloco: Streaming DiLoCo's fragment sync delay (default 0; below period / fragments).
    #[arg(long, allow_negative_numbers = true)]
    pub fragment_sync_delay: Option<u64>,
    /// diloco: Streaming DiLoCo's mixing factor alpha in [0, 1] (default 0).
    #[arg(long, allow_negative_numbers = true)]
    pub fragment_alpha: Option<f64>,
    /// slowmo: the slow momentum step every N optimizer steps (default 48, fairscale's).
    #[arg(long, allow_negative_numbers = true)]
    pub slowmo_frequency: Option<u64>,
    /// Post-warmup gradient all-reduce subgroup size (default: ranks on the same host).
    #[arg(long, allow_negative_numbers = true)]
    pub subgroup_size: Option<usize>,
    /// Keep all-reducing gradients in the subgroup after warmup (true/false).
    #[arg(long)]
    pub post_local_allreduce: Option<bool>,
    /// Give every rank rank 0's parameters and buffers before the first iteration (true/false).
    #[arg(long)]
    pub broadcast_start: Option<bool>,
    /// Buffers (BatchNorm statistics): broadcast from rank 0 every iteration, average at
    /// averaging steps, or local.
    #[arg(long, value_enum)]
    pub buffers: Option<BufferPolicy>,
    /// Pipeline gradient buckets: non-blocking bucket averages, the optimizer stepped per
    /// bucket (auto: when the ranks span more than one host).
    #[arg(long, value_enum)]
    pub pipeline_buckets: Option<PipelineBuckets>,
    /// Gradient bucket cap in MiB.
    #[arg(long, allow_negative_numbers = true)]
    pub bucket_cap_mb: Option<f64>,
    /// First gradient bucket cap in MiB.
    #[arg(long, allow_negative_numbers = true)]
    pub first_bucket_mb: Option<f64>,
    /// Gradient compression.
    #[arg(long, value_enum)]
    pub compression: Option<Compression>,
    /// The model: mlp or cnn.
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    /// Hidden layer widths, comma-separated (e.g. 128,64; "" for none: a linear classifier).
    #[arg(long, value_parser = parse_widths, value_name = "W1,W2,...", allow_hyphen_values = true)]
    pub hidden: Option<Widths>,
    /// The CNN's conv-block channels, comma-separated (e.g. 8,16).
    #[arg(long, value_parser = parse_widths, value_name = "C1,C2,...", allow_hyphen_values = true)]
    pub channels: Option<Widths>,
    /// Data set.
    #[arg(long, value_enum)]
    pub dataset: Option<DatasetKind>,
    /// Directory with MNIST-format IDX files.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Number of synthetic samples.
    #[arg(long, allow_negative_numbers = true)]
    pub synthetic_samples: Option<usize>,
    /// Synthetic feature dimension.
    #[arg(long, allow_negative_numbers = true)]
    pub synthetic_dim: Option<usize>,
    /// Synthetic number of classes.
    #[arg(long, allow_negative_numbers = true)]
    pub synthetic_classes: Option<usize>,
    /// Batch size per worker.
    #[arg(long, allow_negative_numbers = true)]
    pub batch_size: Option<usize>,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, allow_negative_numbers = true)]
    pub accumulate: Option<usize>,
    /// How a step's micro-batches meet an epoch's end: stream (across epochs) or epoch-end
    /// (Lightning: a last, smaller step).
    #[arg(long, value_enum)]
    pub accumulation: Option<Accumulation>,
    /// Shuffle every epoch (true/false).
    #[arg(long)]
    pub shuffle: Option<bool>,
    /// Seed.
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Optimizer.
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerKind>,
    /// Learning rate.
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// SGD momentum.
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f64>,
    /// Weight decay (unset: the optimizer's PyTorch default).
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    /// Clip the gradients' global L2 norm (0: off).
    #[arg(long, allow_negative_numbers = true)]
    pub clip_grad_norm: Option<f64>,
    /// Learning-rate schedule.
    #[arg(long, value_enum)]
    pub lr_schedule: Option<LrScheduleKind>,
    /// Step schedule: iterations between decays.
    #[arg(long, allow_negative_numbers = true)]
    pub lr_step_size: Option<u64>,
    /// Step schedule: decay factor.
    #[arg(long, allow_negative_numbers = true)]
    pub lr_gamma: Option<f64>,
    /// Cosine schedule: final learning rate.
    #[arg(long, allow_negative_numbers = true)]
    pub lr_min: Option<f64>,
    /// Linear warmup: iterations.
    #[arg(long, allow_negative_numbers = true)]
    pub lr_warmup_steps: Option<u64>,
    /// Linear warmup: first iteration's factor.
    #[arg(long, allow_negative_numbers = true)]
    pub lr_warmup_start_factor: Option<f64>,
    /// Epochs.
    #[arg(long, allow_negative_numbers = true)]
    pub epochs: Option<u64>,
    /// Iterations (overrides epochs).
    #[arg(long, allow_negative_numbers = true)]
    pub steps: Option<u64>,
    /// Checkpoint every N iterations (0: only at the end).
    #[arg(long, allow_negative_numbers = true)]
    pub checkpoint_every: Option<u64>,
    /// All-reduce and log the loss every N iterations.
    #[arg(long, allow_negative_numbers = true)]
    pub log_every: Option<u64>,
    /// Evaluate rank 0's model on the test set every N iterations into eval.csv (0: never).
    #[arg(long, allow_negative_numbers = true)]
    pub eval_every: Option<u64>,
    /// Run directory.
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Resume from the latest checkpoint in the run directory (true/false; `--resume` alone means true).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub resume: Option<bool>,
    /// PyTorch safetensors file to initialize the model from.
    #[arg(long)]
    pub init_weights: Option<PathBuf>,
    /// After training, write the world-averaged model (or --export-rank's) as PyTorch safetensors.
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
    /// Export this rank's own model instead of the world average.
    #[arg(long, allow_negative_numbers = true)]
    pub export_rank: Option<usize>,
    /// Collective timeout in seconds.
    #[arg(long, allow_negative_numbers = true)]
    pub timeout_secs: Option<u64>,
    /// Skip optimizer steps with non-finite gradients (true/false).
    #[arg(long)]
    pub skip_non_finite: Option<bool>,
    /// Flush subnormal floats to zero on the compute threads (true/false).
    #[arg(long)]
    pub flush_denormals: Option<bool>,
    /// Metrics file format.
    #[arg(long, value_enum)]
    pub metrics_format: Option<MetricsFormat>,
    /// Progress bar on rank 0 (true/false).
    #[arg(long)]
    pub progress: Option<bool>,
    /// Print the effective configuration before training (true/false; it is saved as the run
    /// directory's config.toml either way).
    #[arg(long)]
    pub print_config: Option<bool>,
}

macro_rules! overlay {
    ($cfg:ident, $flags:ident, $($field:ident),* $(,)?) => {
        $( if let Some(v) = $flags.$field.clone() { $cfg.$field = v; } )*
    };
}

impl ConfigFlags {
    /// Whether `workers` was given explicitly (as a flag or in the config file). Under MPI an
    /// unset `workers` means "the MPI world size"; a given one must match it.
    pub fn workers_given(&self) -> Result<bool, String> {
        if self.workers.is_some() {
            return Ok(true);
        }
        let Some(path) = &self.config else {
            return Ok(false);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        let table: toml::Table =
            toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
        Ok(table.contains_key("workers"))
    }

    /// Defaults, then the config file, then the flags.
    pub fn resolve(&self) -> Result<TrainConfig, String> {
        let mut cfg = match &self.config {
            Some(path) => TrainConfig::from_toml_file(path)?,
            None => TrainConfig::default(),
        };
        let flags = self;
        overlay!(
            cfg,
            flags,
            workers,
            backend,
            device,
            algorithm,
            warmup,
            overlap,
            levels,
            post_local_allreduce,
            broadcast_start,
            buffers,
            pipeline_buckets,
            bucket_cap_mb,
            first_bucket_mb,
            compression,
            model,
            dataset,
            synthetic_samples,
            synthetic_dim,
            synthetic_classes,
            batch_size,
            accumulate,
            accumulation,
            shuffle,
            seed,
            optimizer,
            lr,
            momentum,
            clip_grad_norm,
            lr_schedule,
            lr_step_size,
            lr_gamma,
            lr_min,
            lr_warmup_steps,
            lr_warmup_start_factor,
            epochs,
            checkpoint_every,
            log_every,
            eval_every,
            run_dir,
            resume,
            timeout_secs,
            skip_non_finite,
            flush_denormals,
            metrics_format,
            progress,
            print_config,
        );
        if let Some(Widths(v)) = &flags.hidden {
            cfg.hidden = v.clone();
        }
        if let Some(Widths(v)) = &flags.channels {
            cfg.channels = v.clone();
        }
        if let Some(v) = flags.subgroup_size {
            cfg.subgroup_size = Some(v);
        }
        if let Some(v) = flags.outer_lr {
            cfg.outer_lr = Some(v);
        }
        if let Some(v) = flags.outer_momentum {
            cfg.outer_momentum = Some(v);
        }
        if let Some(v) = flags.outer_nesterov {
            cfg.outer_nesterov = Some(v);
        }
        if let Some(v) = flags.outer_reduce {
            cfg.outer_reduce = Some(v);
        }
        if let Some(v) = flags.outer_compression {
            cfg.outer_compression = Some(v);
        }
        if let Some(v) = flags.fragments {
            cfg.fragments = Some(v);
        }
        if let Some(v) = flags.fragment_sync_delay {
            cfg.fragment_sync_delay = Some(v);
        }
        if let Some(v) = flags.fragment_alpha {
            cfg.fragment_alpha = Some(v);
        }
        if let Some(v) = flags.period {
            cfg.period = Some(v);
        }
        if let Some(v) = flags.slowmo_frequency {
            cfg.slowmo_frequency = Some(v);
        }
        if let Some(v) = flags.weight_decay {
            cfg.weight_decay = Some(v);
        }
        if let Some(v) = flags.warmup_epochs {
            cfg.warmup_epochs = Some(v);
        }
        if let Some(v) = &flags.data_dir {
            cfg.data_dir = Some(v.clone());
        }
        if let Some(v) = flags.steps {
            cfg.steps = Some(v);
        }
        if let Some(v) = &flags.init_weights {
            cfg.init_weights = Some(v.clone());
        }
        if let Some(v) = &flags.export {
            cfg.export = Some(v.clone());
        }
        if let Some(v) = flags.export_rank {
            cfg.export_rank = Some(v);
        }
        Ok(cfg)
    }
}
