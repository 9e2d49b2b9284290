//! The run configuration: one struct, read from a TOML file (`--config run.toml`), overridden by
//! command-line flags of the same names, validated before anything is written.

use crate::lists::{Widths, parse_ranks, parse_widths};
use localsgd_averagers::PseudoGradient;
use localsgd_pipeline::algorithm::AlgorithmSpec;
pub use localsgd_pipeline::pipeline::{Accumulation, BufferPolicy};
pub use localsgd_pipeline::recovery::OnRankFailure;
use localsgd_pipeline::settings::AlgorithmSetting;
pub use localsgd_pipeline::settings::{
    AlgorithmKind, AverageCompressionKind, AverageRounding, GradientCompression, Levels,
    LossyExchange, OuterOptions, OuterSettings, PipelineBuckets, SettingError,
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
    /// burn's LibTorch backend on the CPU: PyTorch's own kernels, its intra-op threads shared
    /// out among the ranks on the host (unless `OMP_NUM_THREADS` says otherwise). Needs a binary
    /// built with the trainer feature `libtorch`.
    Libtorch,
    /// burn's LibTorch backend on CUDA, one GPU per rank (as `cuda`). Needs a binary built with
    /// the trainer feature `libtorch` against a CUDA build of PyTorch.
    LibtorchCuda,
}

impl DeviceKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [DeviceKind; 4] = [
        DeviceKind::Cpu,
        DeviceKind::Cuda,
        DeviceKind::Libtorch,
        DeviceKind::LibtorchCuda,
    ];

    /// The kind a config file or a flag names; otherwise a message naming the valid ones.
    pub fn from_name(name: &str) -> Result<DeviceKind, String> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| {
                let valid: Vec<&str> = Self::ALL.iter().map(|kind| kind.name()).collect();
                format!("unknown device {name:?}; valid: {}", valid.join(", "))
            })
    }

    /// The value as written in a config file or a flag.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Libtorch => "libtorch",
            DeviceKind::LibtorchCuda => "libtorch-cuda",
        }
    }

    /// Whether the tensors live in GPU memory.
    pub fn is_gpu(self) -> bool {
        matches!(self, DeviceKind::Cuda | DeviceKind::LibtorchCuda)
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
    /// Any file of text (or bytes) in `text-file`, for `model = "gpt"`: windows of `context + 1`
    /// bytes, the last 10% of the file held out for validation.
    Text,
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
    /// A GPT-style byte-level language model (`layers` pre-LayerNorm transformer blocks of
    /// `heads` causal attention heads, width `d-model`, over `context` bytes); trains on
    /// `dataset = "text"`.
    Gpt,
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

/// Learning-rate schedule of the binary (see [`LrSchedule`](localsgd_pipeline::lr_schedule::LrSchedule)).
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

/// `Some(text)` for a `#[setting(...)]` key that was given, `None` for one left out.
macro_rules! optional_text {
    () => {
        None
    };
    ($text:literal) => {
        Some($text)
    };
}

/// One setting as the configuration reference shows it: an entry of [`SETTINGS`], generated by
/// `settings!` from the same declaration as the setting's field, flag and default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingDoc {
    /// The field's name in Rust (snake_case); [`name`](Self::name) is the key and flag.
    pub field: &'static str,
    /// The reference's section the setting is listed under (also its `--help` heading).
    pub section: &'static str,
    /// The values it takes, as the reference's Type column shows them (markdown), e.g.
    /// "integer ≥ 1, optional" or "`csv` | `jsonl`".
    pub type_text: &'static str,
    /// For an optional setting whose unset value means something, what it means ("2", "per
    /// algorithm"): the reference's Default column shows "unset (…)".
    pub unset: Option<&'static str>,
    /// The doc comment, one entry per `///` line as written (with its leading space).
    pub doc_lines: &'static [&'static str],
}

impl SettingDoc {
    /// The key in the TOML file, and the flag without `--`: the field's name in kebab-case.
    pub fn name(&self) -> String {
        self.field.replace('_', "-")
    }

    /// The doc's paragraphs, each on one line (the lines of a paragraph joined by a space), as
    /// clap reads a doc comment: `localsgd train --help` shows them separated by blank lines.
    pub fn paragraphs(&self) -> Vec<String> {
        let mut paragraphs = Vec::new();
        let mut current: Vec<&str> = Vec::new();
        for line in self.doc_lines {
            let line = line.trim();
            if line.is_empty() {
                if !current.is_empty() {
                    paragraphs.push(current.join(" "));
                    current.clear();
                }
            } else {
                current.push(line);
            }
        }
        if !current.is_empty() {
            paragraphs.push(current.join(" "));
        }
        paragraphs
    }

    /// The doc's first paragraph, one sentence: what `localsgd train -h` shows.
    pub fn summary(&self) -> String {
        self.paragraphs().into_iter().next().unwrap_or_default()
    }
}

/// Declares every setting once. From that one list come [`TrainConfig`] (the TOML file's keys),
/// its `Default`, [`ConfigFlags`] (the flags of `localsgd train`, whose `--help` shows the same
/// doc, under the section's heading), the overlay of given flags on a configuration, and
/// [`SETTINGS`], from which `book/src/configuration.md`'s reference tables are generated (by
/// `trainer/tests/it/book_config.rs`). The list is made of sections, each
/// `section "Heading" { entries }`; an entry is:
///
/// ```text
/// /// One sentence: the summary (`-h` shows this paragraph only).
/// ///
/// /// More paragraphs: the whole doc is the setting's reference text (`--help`, the book).
/// #[setting(type = "integer ≥ 1, optional", unset = "4")]
/// #[arg(allow_negative_numbers = true)]
/// name: Type as FlagType = default,
/// ```
///
/// `type` is the reference's Type column (markdown; an enum's values in flag order); `unset`,
/// only for an optional setting whose unset value means something, its Default column. The
/// `#[arg(...)]` attributes (more clap options than `long`) and `as FlagType` are optional:
/// `name: Option<T> as T` is a setting that may stay unset, whose flag takes a `T`;
/// `name: Vec<usize> as Widths` one whose flag parses a comma-separated list. A doc points into
/// the book as `(book: Chapter)` or `(book: Chapter, "Heading")`, which the reference renders as
/// a link: `--help` shows docs raw, so they hold no markdown links.
macro_rules! settings {
    ($(
        section $section:literal {
            $(
                $(#[doc = $doc:literal])*
                #[setting(type = $type_text:literal $(, unset = $unset:literal)?)]
                $(#[arg($($arg:tt)*)])?
                $(#[formerly($old:literal)])?
                $name:ident : $ty:ty $(as $flag:ty)? = $default:expr,
            )*
        }
    )*) => {
        /// Every setting of a training run. Keys in the TOML file and command-line flags share
        /// these names (kebab-case): `period = 4` in the file is `--period 4` on the command
        /// line.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
        pub struct TrainConfig {
            $($( $(#[doc = $doc])* $(#[serde(alias = $old)])? pub $name: $ty, )*)*
        }

        impl Default for TrainConfig {
            fn default() -> Self {
                Self { $($( $name: $default, )*)* }
            }
        }

        /// The settings given on the command line, each overriding the same key of the config
        /// file: the flags of `localsgd train` (and of the commands that take a run's settings).
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct ConfigFlags {
            /// TOML file with settings (keys are the flag names without `--`).
            #[arg(long, value_name = "FILE")]
            pub config: Option<PathBuf>,
            $($(
                $(#[doc = $doc])*
                #[arg(long, help_heading = $section $(, $($arg)*)? $(, alias = $old)?)]
                pub $name: Option<flag_type!($ty $(, $flag)?)>,
            )*)*
        }

        impl ConfigFlags {
            /// Writes every setting given as a flag over `cfg`.
            pub fn overlay(&self, cfg: &mut TrainConfig) {
                $($( if let Some(v) = &self.$name { cfg.$name = v.clone().into(); } )*)*
            }
        }

        /// The settings renamed, as (old name, field): the old name is still read, from the
        /// config file and the flags, with a warning ([`warn_renamed`]).
        pub const RENAMED: &[(&str, &str)] = &[
            $($($( ($old, stringify!($name)), )?)*)*
        ];

        /// Every setting in the reference's order, with its section, type and doc: the source
        /// of the configuration reference (`book/src/configuration.md`).
        pub const SETTINGS: &[SettingDoc] = &[
            $($(
                SettingDoc {
                    field: stringify!($name),
                    section: $section,
                    type_text: $type_text,
                    unset: optional_text!($($unset)?),
                    doc_lines: &[$($doc),*],
                },
            )*)*
        ];
    };
}

settings! {
    section "Workers and communication" {
        /// Number of workers (ranks).
        ///
        /// With the thread backend, threads of this process: at most
        /// `ThreadWorld::max_workers()`, which `vm.max_map_count / 8` and
        /// `kernel.threads-max / 2` bound (8,191 with Linux's default `vm.max_map_count`). With
        /// the `mpi` or `nccl` backend it defaults to the world size (`mpirun -np N`,
        /// `WORLD_SIZE`); a value given explicitly must equal it.
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        workers: usize = 2,
        /// The process-group backend that runs the ranks.
        ///
        /// `mpi` needs a binary built with `--features mpi` (book: MPI). `nccl` needs one built
        /// with `--features nccl`, its ranks started by a launcher such as
        /// `torchrun --no-python` (book: GPUs).
        #[setting(type = "`threads` | `mpi` | `nccl`")]
        #[arg(value_enum)]
        backend: Backend = Backend::Threads,
        /// Where each rank computes forward/backward and the optimizer step.
        ///
        /// `cpu` is burn's own CPU backend; `libtorch` and `libtorch-cuda` run PyTorch's kernels
        /// through burn's LibTorch backend, in a binary built with the trainer feature `libtorch`
        /// (book: Performance, "The LibTorch backend"). CI does not build the trainer feature
        /// `cuda` that `cuda` needs (book: GPUs).
        #[setting(type = "`cpu` | `cuda` | `libtorch` | `libtorch-cuda`")]
        #[arg(value_enum)]
        device: DeviceKind = DeviceKind::Cpu,
        /// Seconds a collective waits for its peers before failing with an error that names the
        /// ranks that did not arrive.
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        timeout_secs: u64 = 300,
    }

    section "Algorithm" {
        /// The training algorithm: what the ranks communicate, and when.
        ///
        /// How they differ (book: Concepts, "DDP, local SGD, post-local SGD, hierarchical");
        /// the outer-optimizer algorithms `diloco`, `streaming-diloco` and `slowmo` (book:
        /// Averagers, "Outer optimizers: DiLoCo and SlowMo").
        #[setting(type = "`ddp` | `local-sgd` | `post-local-sgd` | `hierarchical` | `diloco` | `streaming-diloco` | `slowmo`")]
        #[arg(value_enum)]
        algorithm: AlgorithmKind = AlgorithmKind::PostLocalSgd,
        /// Iterations of global gradient averaging before local steps start.
        ///
        /// One knob for both the hook's `start_local_sgd_iter` and the averager's
        /// `warmup_steps`, as in Lightning (book: Concepts, "The warmup: one knob"). For
        /// `local-sgd`, the first averaging step. At most `i64::MAX` (PyTorch's counter).
        #[setting(type = "integer, 0 to 2⁶³−1")]
        #[arg(allow_negative_numbers = true)]
        warmup: u64 = 50,
        /// The warmup's switch point in epochs instead of iterations.
        ///
        /// When set, `warmup` becomes the optimizer steps of this many epochs: each rank's
        /// batches per epoch, divided by `accumulate` and rounded up (the step that takes an
        /// epoch's last micro-batch is still warmup; 23 for the bundled digits on 2 workers with
        /// the default `batch-size`). The post-local SGD paper (Lin et al.) switches at the first
        /// learning-rate decay, usually an epoch boundary; with the `step` schedule, set
        /// `lr-step-size` to the same number of steps. Part of the checkpoint identity through
        /// the resulting `warmup`.
        #[setting(type = "integer ≥ 0, optional")]
        #[arg(allow_negative_numbers = true)]
        warmup_epochs: Option<u64> as u64 = None,
        /// Model averaging period in optimizer steps.
        ///
        /// `local-sgd` and `post-local-sgd`: the averages, on a schedule relative to the warmup
        /// (steps `warmup`, `warmup + period`, …); unset: 4. `1` works but logs a warning: DDP
        /// is cheaper. `diloco` and `streaming-diloco` without `levels`: the local steps H
        /// between outer steps, which run after 0-based steps `warmup + H − 1`,
        /// `warmup + 2H − 1`, … (torchft's and fairscale's cadence: after every H inner steps);
        /// unset: 50 (DiLoCo's outer Nesterov momentum needs rounds of many local steps).
        /// `slowmo`: the plain averages between slow steps (fairscale's `localsgd_frequency`);
        /// unset: 3. `0` is invalid; `ddp` and `hierarchical` (whose `levels` carry the
        /// periods) refuse it.
        #[setting(type = "integer ≥ 1, optional", unset = "per algorithm")]
        #[arg(allow_negative_numbers = true)]
        period: Option<u64> as u64 = None,
        /// Overlapped averaging: apply each model average this many iterations after it starts.
        ///
        /// `local-sgd` and `post-local-sgd` (ours, not in PyTorch): each average starts after
        /// its step's optimizer step and is applied `overlap` iterations later as
        /// `x ← avg(x_t) + (x_now − x_t)`, its all-reduce running on a second communicator while
        /// those iterations compute (book: Averagers, "Overlapped averaging"). `0`: blocking
        /// averaging, PyTorch's numbers. At most `period`, and 0 with `average-compression`;
        /// other algorithms refuse a non-zero value. Part of the checkpoint identity.
        #[setting(type = "integer, `0` to `period`")]
        #[arg(allow_negative_numbers = true)]
        overlap: u64 = 0,
        /// Hierarchical averaging levels as comma-separated `period:group-size` pairs, e.g.
        /// `"2:2,8:4"`.
        ///
        /// For `hierarchical`, and optionally `diloco` and `slowmo` (the lower levels average
        /// plainly, the whole-world level takes the outer step). `"2:2,8:4"` averages every 2
        /// steps within blocks of 2 ranks and every 8 steps over 4. Periods strictly increase;
        /// every group size divides `workers`; the last equals `workers` (the averagers'
        /// `validate_levels` rules, with their messages). Parsed when the file or flag is read:
        /// text that is not `period:group-size` pairs is refused there. The schedule counts
        /// absolute steps (book: Concepts, "Two schedules: relative and absolute").
        /// `localsgd compare` fills in a default when it is empty.
        #[setting(type = "string")]
        levels: Levels = Levels::default(),
        /// The outer optimizer's learning rate (`diloco`, `streaming-diloco`, `slowmo`).
        ///
        /// `diloco` and `streaming-diloco`: the outer SGD learning rate; unset: DiLoCo's 0.7
        /// (`1` with no momentum is periodic averaging). `slowmo`: fairscale's `slowmo_lr` α;
        /// unset: 1; must be above 0. Other algorithms refuse it. Part of the checkpoint
        /// identity.
        #[setting(type = "number, optional", unset = "per algorithm")]
        #[arg(allow_negative_numbers = true)]
        outer_lr: Option<f64> as f64 = None,
        /// The outer optimizer's momentum (`diloco`, `streaming-diloco`, `slowmo`).
        ///
        /// `diloco` and `streaming-diloco`: the outer SGD momentum; unset: 0.9 (torch's rule:
        /// the first step's buffer is the pseudo-gradient itself). `slowmo`: fairscale's
        /// `slowmo_momentum` β; unset: 0.5. Other algorithms refuse it. Part of the checkpoint
        /// identity.
        #[setting(type = "number ≥ 0, optional", unset = "per algorithm")]
        #[arg(allow_negative_numbers = true)]
        outer_momentum: Option<f64> as f64 = None,
        /// Nesterov momentum for the outer SGD of `diloco` and `streaming-diloco`.
        ///
        /// Unset: true when `outer-momentum` is above 0, as DiLoCo; true with momentum 0 is
        /// refused with torch's message. `slowmo` refuses true (its slow step is heavy-ball);
        /// the other algorithms refuse it. Part of the checkpoint identity.
        #[setting(type = "bool, optional", unset = "per algorithm")]
        outer_nesterov: Option<bool> as bool = None,
        /// How the outer algorithms reduce the pseudo-gradient over the ranks.
        ///
        /// The two ways are equal in exact arithmetic and round differently. Unset:
        /// `mean-of-deltas` for `diloco` and `streaming-diloco` (the only one
        /// `streaming-diloco` takes), `delta-of-mean` for `slowmo` (the only one `slowmo`
        /// takes). Other algorithms refuse it. Part of the checkpoint identity.
        #[setting(type = "`mean-of-deltas` | `delta-of-mean`, optional", unset = "per algorithm")]
        #[arg(value_enum)]
        outer_reduce: Option<PseudoGradient> as PseudoGradient = None,
        /// Send the pseudo-gradients of `diloco` and `streaming-diloco` compressed: in half
        /// precision, or quantized or sparsified by a lossy codec.
        ///
        /// Also the averages of `local-sgd`, `post-local-sgd` and `hierarchical`'s world level:
        /// each rank then sends its delta from the last average, on the averager's own
        /// schedule, and `overlap` must be 0 (book: Semantics, "11.2 Compressed model
        /// averages"). These algorithms take no other outer setting.
        ///
        /// `fp16`, `bf16`: each rank's `θ − x_r` is rounded once, divided by the world size and
        /// summed in that precision, as the gradient `compression` does (OpenDiLoCo all-reduces
        /// them in fp16): half the bytes of a sync. `int8`, `int4`: every value quantized with
        /// one f32 scale per chunk of `average-compression-chunk` values (INTELLECT-1's int8);
        /// `topk:F`: the share F (0 < F ≤ 1) of each chunk's largest values with their u16
        /// offsets, as f32; `topk:F+int8`, `topk:F+int4`: those values quantized. A lossy
        /// codec's messages are all-gathered and every rank decodes and sums them in rank order
        /// (book: Semantics, "11. Lossy compression of pseudo-gradients"); with
        /// `average-error-feedback` what a message left out is added to the next one. Needs
        /// `mean-of-deltas`, so `slowmo` refuses it. Unset or `none`: full precision. Part of
        /// the checkpoint identity. Formerly `outer-compression`, a name still read with a
        /// warning.
        #[setting(type = "`none` | `fp16` | `bf16` | `int8` | `int4` | `topk:F` | `topk:F+int8` | `topk:F+int4`, optional", unset = "`none`")]
        #[formerly("outer-compression")]
        average_compression: Option<AverageCompressionKind> as AverageCompressionKind = None,
        /// A lossy `average-compression`'s chunk: the values that share one scale and, for
        /// top-k, are selected from together.
        ///
        /// Each chunk adds 4 bytes (its f32 scale) to a message. At most 65,536 with top-k,
        /// whose offsets are u16. Unset: 1024; `none`, `fp16` and `bf16` refuse it. Part of the
        /// checkpoint identity. Formerly `outer-compression-chunk`, still read with a warning.
        #[setting(type = "integer ≥ 1, optional", unset = "1024")]
        #[arg(allow_negative_numbers = true)]
        #[formerly("outer-compression-chunk")]
        average_compression_chunk: Option<usize> as usize = None,
        /// How a lossy `average-compression` rounds values to integers.
        ///
        /// `stochastic` draws from `seed`, the outer step and the rank, so runs repeat exactly.
        /// Unset: `nearest`. `topk:F` (f32 values, nothing rounded) refuses `stochastic`;
        /// `none`, `fp16` and `bf16` refuse the setting. Part of the checkpoint identity.
        /// Formerly `outer-rounding`, still read with a warning.
        #[setting(type = "`nearest` | `stochastic`, optional", unset = "`nearest`")]
        #[arg(value_enum)]
        #[formerly("outer-rounding")]
        average_rounding: Option<AverageRounding> as AverageRounding = None,
        /// Error feedback for a lossy `average-compression`: what a rank's message left out of its
        /// pseudo-gradient is added to its next one.
        ///
        /// The residual is kept per fragment and saved in checkpoints. Unset: true; `none`,
        /// `fp16` and `bf16` refuse the setting. Part of the checkpoint identity. Formerly
        /// `outer-error-feedback`, still read with a warning.
        #[setting(type = "bool, optional", unset = "true")]
        #[formerly("outer-error-feedback")]
        average_error_feedback: Option<bool> as bool = None,
        /// How a lossy `average-compression`'s messages become the mean.
        ///
        /// `all-gather`: every rank's whole message is all-gathered and every rank decodes and
        /// averages them (one quantization; each rank receives `W − 1` messages, so from 4
        /// ranks on int8 costs about an fp16 all-reduce on the wire). `all-reduce`: the
        /// quantized all-reduce — each rank's message cut into one shard per rank and sent to
        /// the shard's owner (all-to-all), the owner's mean of its shard quantized again (with
        /// error feedback of its own) and all-gathered: about `2 (W − 1) / W` of a message per
        /// rank whatever `W` is (book: Semantics, "11. Lossy compression of
        /// pseudo-gradients"). `auto` takes the one that moves fewer bytes per rank for the
        /// model and the world: the all-gather on 2 ranks, the all-reduce from 3 on (`localsgd
        /// plan` shows both). The all-reduce runs blocking: with `fragment-sync-delay` above 0
        /// it is refused and `auto` takes the all-gather. Unset: `auto`; `none`, `fp16` and
        /// `bf16` refuse the setting. Part of the checkpoint identity when set.
        #[setting(type = "`auto` | `all-gather` | `all-reduce`, optional", unset = "`auto`")]
        #[arg(value_enum)]
        average_exchange: Option<LossyExchange> as LossyExchange = None,
        /// `streaming-diloco`: the number of fragments the parameters sync in, taking turns.
        ///
        /// Fragments are contiguous runs of whole tensors in the model's order, the first ones
        /// one tensor longer when they do not divide evenly. Fragment `f` takes its outer step
        /// every `period` local steps, `period / fragments` steps after fragment `f − 1`, each
        /// with its own outer optimizer state (book: Averagers, "Streaming DiLoCo"). Must divide
        /// `period` (then `period` is torchft's `sync_every`); at most the number of parameter
        /// tensors. Unset: 2. Not with `levels` or `delta-of-mean`; the other algorithms refuse
        /// the three fragment settings. Part of the checkpoint identity.
        #[setting(type = "integer ≥ 1, optional", unset = "2")]
        #[arg(allow_negative_numbers = true)]
        fragments: Option<usize> as usize = None,
        /// `streaming-diloco`: τ, the local steps a fragment's sync starts before its outer step.
        ///
        /// torchft's `fragment_sync_delay`: a fragment's pseudo-gradient is measured and its
        /// all-reduce started τ local steps before its outer step, running behind those steps'
        /// compute on a second communicator. Below `period / fragments`. Unset: 0. Part of the
        /// checkpoint identity.
        #[setting(type = "integer ≥ 0, optional", unset = "0")]
        #[arg(allow_negative_numbers = true)]
        fragment_sync_delay: Option<u64> as u64 = None,
        /// `streaming-diloco`: α, the share of its own values a rank keeps after a fragment's
        /// outer step.
        ///
        /// torchft's `fragment_update_alpha`: after its outer step a fragment becomes
        /// `θ_f + α·(x_f − θ_f)`; `0` adopts `θ_f`. In [0, 1]. Unset: 0. Part of the checkpoint
        /// identity.
        #[setting(type = "number in [0, 1], optional", unset = "0")]
        #[arg(allow_negative_numbers = true)]
        fragment_alpha: Option<f64> as f64 = None,
        /// `slowmo`: the slow momentum step every this many optimizer steps.
        ///
        /// fairscale's `slowmo_frequency`, after the warmup, on the cadence of `period`: the
        /// models are averaged plainly every `period` steps in between. A slow step averages
        /// the models itself (fairscale's memory-efficient mode), so any pair keeps the
        /// replicas equal after it; equal to `period`, a slow step at every average. Unset: 48,
        /// fairscale's default. Not with `levels`; the other algorithms refuse it. Part of the
        /// checkpoint identity when it differs from `period`.
        #[setting(type = "integer ≥ 1, optional", unset = "48")]
        #[arg(allow_negative_numbers = true)]
        slowmo_frequency: Option<u64> as u64 = None,
        /// The size of the blocks of ranks that all-reduce gradients after the warmup (with
        /// `post-local-allreduce`).
        ///
        /// Contiguous blocks of this many ranks; must divide `workers`. Unset: the ranks on the
        /// same host. Part of the checkpoint identity.
        #[setting(type = "integer ≥ 1, optional", unset = "the ranks on a host")]
        #[arg(allow_negative_numbers = true)]
        subgroup_size: Option<usize> as usize = None,
        /// After the warmup, keep all-reducing gradients within the subgroup.
        ///
        /// PyTorch's `post_local_gradient_allreduce`, whose default is true. Off by default
        /// here because with the thread backend the intra-node subgroup is the whole world,
        /// which would make the run plain DDP (book: Concepts, "After the warmup: which
        /// subgroup, if any, all-reduces gradients"). Part of the checkpoint identity.
        #[setting(type = "bool")]
        post_local_allreduce: bool = false,
        /// Give every rank rank 0's parameters and buffers before the first iteration of a fresh
        /// run.
        ///
        /// PyTorch DDP does this when it wraps the model: replicas initialized differently start
        /// equal. Not on resume (each rank restores its own saved state). The binary's models
        /// are seeded identically on every rank, so it changes nothing there but a few bytes of
        /// traffic before iteration 0.
        #[setting(type = "bool")]
        broadcast_start: bool = true,
        /// What happens to buffers: float tensors without gradients, such as BatchNorm's
        /// running statistics and frozen parameters.
        ///
        /// A model without buffers (the MLP) sends nothing whatever the value.
        #[setting(type = "`broadcast` | `average` | `local`")]
        #[arg(value_enum)]
        buffers: BufferPolicy = BufferPolicy::Broadcast,
        /// Pipelined gradient sync: step each bucket's parameters as soon as its average
        /// arrives.
        ///
        /// For `ddp` and the warmup of `post-local-sgd` and `hierarchical`: every bucket's
        /// average starts non-blocking in the gradient-sync phase (book: Hooks, "Pipelined
        /// buckets: stepping while gradients are on the wire"). `auto` decides at start-up, from
        /// an all-gather of the ranks' host ids and of whether a rank was told that its host runs
        /// more ranks than cores: MPI ranks started with `--mca mpi_yield_when_idle 1`, or
        /// placed by `mpirun` on a node with more ranks than slots (it sets
        /// `OMPI_MCA_mpi_oversubscribe=1`). Where ranks share cores but the link between hosts
        /// is slow, `on` can still be faster (measured in
        /// `bench/results/2026-12-04-blocking-pieces`). The same numbers whatever the value, so
        /// not part of the checkpoint identity. With `compression`, buckets run the blocking
        /// way.
        #[setting(type = "`auto` | `on` | `off`")]
        #[arg(value_enum)]
        pipeline_buckets: PipelineBuckets = PipelineBuckets::Auto,
        /// Cap of the gradient buckets after the first, in MiB (PyTorch DDP's `bucket_cap_mb`).
        #[setting(type = "number > 0")]
        #[arg(allow_negative_numbers = true)]
        bucket_cap_mb: f64 = 25.0,
        /// Cap of the first gradient bucket, in MiB (PyTorch DDP's first-bucket cap).
        #[setting(type = "number > 0")]
        #[arg(allow_negative_numbers = true)]
        first_bucket_mb: f64 = 1.0,
        /// Cast gradient buckets to half precision around the hook.
        ///
        /// PyTorch's `fp16_compress_wrapper` and `bf16_compress_wrapper`. `local-sgd`, which
        /// sends no gradients, refuses it. Part of the checkpoint identity.
        #[setting(type = "`none` | `fp16` | `bf16`")]
        #[arg(value_enum)]
        compression: GradientCompression = GradientCompression::None,
    }

    section "Model, data and optimizer" {
        /// The model to train.
        ///
        /// The MLP has ReLU between its Linear layers. The CNN takes square gray-scale images
        /// whose side is a multiple of 2^(number of blocks), e.g. 784 features (28x28 IDX data
        /// such as Fashion-MNIST) or 64 (the 8x8 digits). Its 3x3 convolutions have padding 1;
        /// its batch normalization is PyTorch's `BatchNorm2d` arithmetic (momentum 0.1, eps 1e-5,
        /// unbiased running variance; burn's `BatchNorm` keeps the biased one), and its running
        /// statistics are the buffers that `buffers` acts on.
        #[setting(type = "`mlp` | `cnn` | `gpt`")]
        #[arg(value_enum)]
        model: ModelKind = ModelKind::Mlp,
        /// Hidden layer widths of the MLP.
        ///
        /// `--hidden 128,64` on the command line (`--hidden ""` for none), `hidden = [128, 64]`
        /// in TOML. No widths (`[]`) give a linear classifier.
        #[setting(type = "list of widths")]
        #[arg(value_parser = parse_widths, value_name = "W1,W2,...", allow_hyphen_values = true)]
        hidden: Vec<usize> as Widths = vec![64],
        /// Output channels of the CNN's conv blocks, one block per entry (`model` `cnn`).
        ///
        /// `--channels 8,16` on the command line, `channels = [8, 16]` in TOML; at least one.
        /// 28x28 inputs with `[8, 16]`: 9,146 parameters.
        #[setting(type = "list of channel counts")]
        #[arg(value_parser = parse_widths, value_name = "C1,C2,...", allow_hyphen_values = true)]
        channels: Vec<usize> as Widths = vec![8, 16],
        /// The GPT's context: the bytes a window predicts from (`model` `gpt`).
        ///
        /// The data windows hold `context + 1` bytes.
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        context: usize = 64,
        /// The GPT's width, its embedding size (`model` `gpt`); a multiple of `heads`.
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        d_model: usize = 128,
        /// The GPT's attention heads per block (`model` `gpt`); they divide `d-model`.
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        heads: usize = 4,
        /// The GPT's transformer blocks (`model` `gpt`).
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        layers: usize = 2,
        /// Initialize the model from a PyTorch safetensors file.
        ///
        /// MLP: `fc1.weight` `[out, in]`, `fc1.bias`, `fc2.weight`, …; CNN: `convs.{i}.weight`
        /// `[out, in, 3, 3]` and `.bias`, `norms.{i}.weight`, `.bias`, `.running_mean`,
        /// `.running_var` (`num_batches_tracked` accepted, unused), `head.weight`
        /// `[classes, features]`, `head.bias` (book: Reproducing a PyTorch run); GPT: nanoGPT's
        /// `state_dict` names, `wte.weight`, `wpe.weight`, `h.{i}.ln_1.weight`, …,
        /// `lm_head.bias` (book: Training a language model). A run's
        /// `model.safetensors` has this layout. Unset: PyTorch's default `nn.Linear` and
        /// `nn.Conv2d` initialization for the MLP and CNN, nanoGPT's for the GPT, drawn from
        /// `seed`.
        #[setting(type = "path, optional")]
        init_weights: Option<PathBuf> as PathBuf = None,
        /// The data set to train on.
        ///
        /// `digits` has 1437 training and 360 test images.
        #[setting(type = "`digits` | `synthetic` | `idx` | `text`")]
        #[arg(value_enum)]
        dataset: DatasetKind = DatasetKind::Digits,
        /// Directory with MNIST-format IDX files (`dataset` `idx`, which requires it).
        ///
        /// `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and
        /// `t10k-labels-idx1-ubyte`, each optionally gzipped (`.gz`).
        #[setting(type = "path, optional")]
        data_dir: Option<PathBuf> as PathBuf = None,
        /// The text to train on (`dataset` `text`, which requires it).
        ///
        /// Any file, read as bytes (UTF-8 or not); its last 10% is the validation set.
        #[setting(type = "path, optional")]
        text_file: Option<PathBuf> as PathBuf = None,
        /// Number of generated samples (`dataset` `synthetic`); 80% train, 20% test.
        #[setting(type = "integer ≥ 10")]
        #[arg(allow_negative_numbers = true)]
        synthetic_samples: usize = 2000,
        /// Feature dimension of the synthetic data.
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        synthetic_dim: usize = 16,
        /// Number of classes of the synthetic data.
        #[setting(type = "integer ≥ 2")]
        #[arg(allow_negative_numbers = true)]
        synthetic_classes: usize = 4,
        /// Batch size per worker (PyTorch's `DataLoader(batch_size=...)` on each rank).
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        batch_size: usize = 32,
        /// Gradient accumulation: micro-batches of `batch-size` per optimizer step (1: none).
        ///
        /// Each iteration runs backward on `loss / accumulate` of every micro-batch and sums
        /// the gradients (their mean: PyTorch's accumulation loop, DDP with `no_sync` on all but
        /// the last), then syncs, steps and averages once; `warmup`, `period`, `steps` and the
        /// schedule count optimizer steps. Every micro-batch is trained: `accumulation` says how
        /// steps meet an epoch's end. A value larger than the run's batches per rank (`stream`)
        /// or an epoch's (`epoch-end`) is refused.
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        accumulate: usize = 1,
        /// How an optimizer step's micro-batches meet an epoch's end.
        ///
        /// Every micro-batch is trained either way, its loss divided by `accumulate` (book:
        /// Semantics, "5.1 Gradient accumulation at an epoch's end").
        #[setting(type = "`stream` | `epoch-end`")]
        #[arg(value_enum)]
        accumulation: Accumulation = Accumulation::Stream,
        /// Shuffle the training data every epoch, with the same permutation on every rank.
        ///
        /// The permutation is ours, from `seed` and the epoch (not `torch.randperm`'s); `false`
        /// reproduces `DistributedSampler(shuffle=False)` exactly.
        #[setting(type = "bool")]
        shuffle: bool = true,
        /// Seed for model initialization, shuffling and synthetic data.
        #[setting(type = "integer")]
        #[arg(allow_negative_numbers = true)]
        seed: u64 = 0,
        /// The optimizer, with PyTorch's defaults.
        ///
        /// SGD with `momentum`, no dampening and no Nesterov; Adam's and AdamW's epsilon is
        /// PyTorch's 1e-8, not burn's 1e-5.
        #[setting(type = "`sgd` | `adam` | `adamw`")]
        #[arg(value_enum)]
        optimizer: OptimizerKind = OptimizerKind::Sgd,
        /// Learning rate (the schedule's base).
        #[setting(type = "number > 0")]
        #[arg(allow_negative_numbers = true)]
        lr: f64 = 0.1,
        /// SGD momentum; 0 disables it.
        ///
        /// Ignored by Adam and AdamW. Momentum buffers are never averaged.
        #[setting(type = "number in [0, 1)")]
        #[arg(allow_negative_numbers = true)]
        momentum: f64 = 0.9,
        /// Weight decay, as PyTorch applies it.
        ///
        /// `sgd` and `adam` add `weight-decay × parameter` to the gradient (L2); `adamw` decays
        /// the parameter decoupled from the gradient. Unset: PyTorch's default, 0 for `sgd` and
        /// `adam`, 0.01 for `adamw` (burn's `AdamWConfig` defaults to 1e-4).
        #[setting(type = "number ≥ 0, optional", unset = "per optimizer")]
        #[arg(allow_negative_numbers = true)]
        weight_decay: Option<f64> as f64 = None,
        /// Decay only parameters of two or more dimensions: weight matrices and embeddings, not
        /// biases and LayerNorm weights.
        ///
        /// nanoGPT's `configure_optimizers` (two PyTorch parameter groups); for `adam` and
        /// `adamw`. `false`: every parameter, as PyTorch's `AdamW(model.parameters())`.
        #[setting(type = "bool")]
        weight_decay_matrices_only: bool = false,
        /// Clip the gradients' global L2 norm to this value before each optimizer step; 0: no
        /// clipping.
        ///
        /// The norm over all parameters, after gradient sync:
        /// `torch.nn.utils.clip_grad_norm_(params, max_norm)` (every gradient times
        /// `min(1, max_norm / (norm + 1e-6))`). Not burn's `GradientClippingConfig::Norm`, which
        /// clips each tensor on its own.
        #[setting(type = "number ≥ 0")]
        #[arg(allow_negative_numbers = true)]
        clip_grad_norm: f64 = 0.0,
        /// Learning-rate schedule, stepped once per iteration (also a skipped one).
        ///
        /// PyTorch's closed forms: the rate of iteration k depends on k alone, so a resumed run
        /// continues the schedule exactly, except `cosine` resumed with other `steps` or
        /// `epochs`, whose `T_max` (the run's length) changes with them. The metrics file's
        /// `lr` column shows each iteration's rate.
        #[setting(type = "`constant` | `step` | `cosine` | `linear-warmup`")]
        #[arg(value_enum)]
        lr_schedule: LrScheduleKind = LrScheduleKind::Constant,
        /// `step`: iterations between decays.
        ///
        /// To decay at post-local SGD's switch (Lin et al. switch at the first decay), set it to
        /// `warmup`.
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        lr_step_size: u64 = 100,
        /// `step`: the decay factor (PyTorch's default 0.1).
        #[setting(type = "number > 0")]
        #[arg(allow_negative_numbers = true)]
        lr_gamma: f64 = 0.1,
        /// `cosine`: the learning rate at the end of the run (PyTorch's `eta_min`, default 0).
        #[setting(type = "number in [0, `lr`]")]
        #[arg(allow_negative_numbers = true)]
        lr_min: f64 = 0.0,
        /// `linear-warmup`: warmup iterations (PyTorch's `total_iters`, default 5).
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        lr_warmup_steps: u64 = 5,
        /// `linear-warmup`: the first iteration's factor (PyTorch's `start_factor`, default 1/3).
        #[setting(type = "number in (0, 1]")]
        #[arg(allow_negative_numbers = true)]
        lr_warmup_start_factor: f64 = 1.0 / 3.0,
        /// Number of epochs (ignored when `steps` is set).
        #[setting(type = "integer ≥ 1")]
        #[arg(allow_negative_numbers = true)]
        epochs: u64 = 30,
        /// Stop after this many iterations instead of after `epochs`.
        #[setting(type = "integer ≥ 1, optional")]
        #[arg(allow_negative_numbers = true)]
        steps: Option<u64> as u64 = None,
        /// Skip optimizer steps whose gradients are not finite (NaN or infinite).
        ///
        /// Skipped steps are counted and reported. Model averaging still runs, so all ranks'
        /// counters stay aligned.
        #[setting(type = "bool")]
        skip_non_finite: bool = false,
        /// Flush subnormal floats (below 1.2e-38) to zero on every compute thread.
        ///
        /// Like PyTorch's `torch.set_flush_denormal(True)`. Long runs get faster on x86, where
        /// subnormal arithmetic is many times slower (book: Performance, "A finding: burn's
        /// step slows down in long runs (subnormal floats)"); results differ from IEEE
        /// arithmetic in the last bits wherever subnormals occur, so the default (off) matches
        /// PyTorch's default. x86_64 and aarch64 only.
        #[setting(type = "bool")]
        flush_denormals: bool = false,
    }

    section "Output, checkpoints, resuming" {
        /// Where the run's files go: `config.toml`, the metrics, `eval.csv`, `loss.svg`,
        /// `summary.json` and `checkpoints/`.
        #[setting(type = "path")]
        run_dir: PathBuf = PathBuf::from("runs/latest"),
        /// Save a checkpoint every this many iterations; 0: only the final one.
        ///
        /// A run with a run directory always saves its final state.
        #[setting(type = "integer ≥ 0")]
        #[arg(allow_negative_numbers = true)]
        checkpoint_every: u64 = 0,
        /// How many of the newest checkpoints the run directory keeps; 0: every one.
        ///
        /// After each checkpoint is published, older ones beyond this count are deleted (the
        /// `latest` one, and one newer than it that is about to be published, never are; a
        /// recovery after a failed rank and `resume-ranks` continue from `latest`). Each
        /// checkpoint holds one file per rank of about the model's parameters and optimizer
        /// state (book: The localsgd binary, "What a run keeps").
        #[setting(type = "integer ≥ 0")]
        #[arg(allow_negative_numbers = true)]
        keep_checkpoints: usize = 3,
        /// Continue from the latest checkpoint in `run-dir` (`--resume` alone means true), with
        /// the run's own settings.
        ///
        /// Restores `run-dir/checkpoints/latest`: parameters, optimizer state, averager step,
        /// hook `iter`, data position. The settings start from the run's `config.toml`; those
        /// given again are applied on top. A setting the checkpoint fixes (the model and its
        /// shape, the data set and its order, `seed`, the optimizer, the algorithm, `workers`
        /// unless `resume-ranks` says how to continue) is refused when it differs; one that may
        /// change (the length, the learning-rate schedule, cadences, `on-rank-failure`, the
        /// backend, where the data is) is recorded in `config.toml` with the iteration it holds
        /// from. A length the checkpoint already holds is refused (book: The localsgd binary,
        /// "Resuming a run").
        #[setting(type = "bool")]
        #[arg(num_args = 0..=1, default_missing_value = "true")]
        resume: bool = false,
        /// With `resume`: the saved rank each worker continues from, one per worker, to resume
        /// a checkpoint written by another number of workers.
        ///
        /// `--resume-ranks 0,2,3` (`resume-ranks = [0, 2, 3]`) continues a 4-worker checkpoint
        /// on 3 workers that take saved ranks 0, 2 and 3's state; a saved rank may appear twice
        /// (a new worker starts as a copy of it). The rest of the current epoch's data is dealt
        /// over the new workers (book: Fault tolerance, "Resuming on another number of ranks").
        /// Empty (the default): the checkpoint's own number of workers, each its own rank.
        #[setting(type = "list of ranks")]
        #[arg(value_parser = parse_ranks, value_name = "R0,R1,...", allow_hyphen_values = true)]
        resume_ranks: Vec<usize> as Widths = vec![],
        /// What the other ranks do when a rank fails during training: `abort` (end the job),
        /// `continue` (shrink to the survivors and train on) or `replace` (train on with a
        /// replacement in the failed rank's place).
        ///
        /// With `continue` the survivors go back to the last published checkpoint and continue
        /// from it on their own, as a resume with `resume-ranks` naming them would (book: Fault
        /// tolerance). Needs `checkpoint-every` (the checkpoints are the recovery points; 1
        /// loses no iteration) and the thread backend, or MPI with ULFM (Open MPI 5, started
        /// with `mpirun --with-ft ulfm`). With `replace` the survivors also start a new worker
        /// per failed rank (a thread, or under MPI a process: `mpirun --oversubscribe` gives it
        /// a slot), which receives the failed rank's state of that checkpoint from a live rank:
        /// the world goes on at full size, and the run ends as it would have without the
        /// failure (unless a replacement could not be started, or failed before the world
        /// trained an iteration: then the world goes on without it, as with `continue`).
        #[setting(type = "`abort` | `continue` | `replace`")]
        #[arg(value_enum)]
        on_rank_failure: OnRankFailure = OnRankFailure::Abort,
        /// All-reduce the loss across ranks every this many iterations; 0: never.
        ///
        /// It feeds the `global_loss` column and the progress bar.
        #[setting(type = "integer ≥ 0")]
        #[arg(allow_negative_numbers = true)]
        log_every: u64 = 10,
        /// Evaluate rank 0's own model on the test set every this many iterations and after the
        /// last one; 0: never.
        ///
        /// Appends `iteration,train_seconds,test_accuracy` to `eval.csv` (`train_seconds`:
        /// rank 0's summed phase times, so evaluation time is not counted; after a resume it
        /// continues from the file's last row). Right after an averaging step every rank holds
        /// the same model: periodic averaging runs in the 0-based iteration
        /// `warmup + k * period`, so with `warmup + 1` a multiple of `eval-every` and
        /// `eval-every` a multiple of the period every evaluation sees the consensus model.
        #[setting(type = "integer ≥ 0")]
        #[arg(allow_negative_numbers = true)]
        eval_every: u64 = 0,
        /// After training, write the world-averaged model (or `export-rank`'s own) to this file
        /// as PyTorch safetensors.
        ///
        /// The PyTorch twin's `state_dict` names and layout (the `init-weights` layout), for
        /// `model.load_state_dict(safetensors.torch.load_file(FILE))`. Must name a file in an
        /// existing directory. Written by rank 0 (the average) or by the chosen rank, on its
        /// host. For a finished run, `localsgd export` does the same (book: The localsgd
        /// binary, "`localsgd export`").
        #[setting(type = "path, optional")]
        #[arg(value_name = "FILE")]
        export: Option<PathBuf> as PathBuf = None,
        /// With `export`: export this rank's own final model instead of the world average.
        ///
        /// `summary.json`'s `ranks[r]`. Must be below `workers`.
        #[setting(type = "integer ≥ 0, optional")]
        #[arg(allow_negative_numbers = true)]
        export_rank: Option<usize> as usize = None,
        /// Format of the per-iteration metrics file.
        #[setting(type = "`csv` | `jsonl`")]
        #[arg(value_enum)]
        metrics_format: MetricsFormat = MetricsFormat::Csv,
        /// Show a progress bar on rank 0.
        #[setting(type = "bool")]
        progress: bool = true,
        /// Print the effective configuration before training.
        ///
        /// Every setting, with the algorithm's defaults written out. It is saved as the run
        /// directory's `config.toml` either way, and that file trains the same when given back
        /// with `--config`.
        #[setting(type = "bool")]
        print_config: bool = false,
    }
}

/// A setting with a value that cannot work (the library's [`SettingError`], under the name
/// the application has always used).
pub type ConfigError = SettingError;

/// A warning for every renamed setting among `names` (keys of a config file, or flags without
/// their `--`), naming the new name: the old one still works, for files written before.
pub fn warn_renamed<'a>(names: impl IntoIterator<Item = &'a str>) {
    for name in names {
        if let Some((old, field)) = RENAMED.iter().find(|(old, _)| *old == name) {
            let new = field.replace('_', "-");
            tracing::warn!(
                "setting `{old}` is now `{new}` (it sets the wire format of model averages and \
                 pseudo-gradients alike); the old name still works, write `{new}`"
            );
        }
    }
}

fn bad(setting: &'static str, value: impl ToString, valid: impl ToString) -> ConfigError {
    SettingError::new(setting, value, valid)
}

impl TrainConfig {
    /// The algorithm settings of this configuration, for [`localsgd_pipeline::algorithm::build`] (call
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

    /// Parse TOML text. A run's `config.toml` may end with the `[[resumed]]` history of its
    /// resumes ([`crate::resume`]): a record, not settings, so it is set aside.
    pub fn from_toml_str(text: &str) -> Result<Self, String> {
        // The history must be well-formed too; the settings are read from their own lines, so
        // that an error names its line.
        crate::history::split_history(text).map_err(|e| with_quote_hint(text, e))?;
        let settings = crate::history::settings_text(text);
        let cfg = toml::from_str(settings).map_err(|e| with_quote_hint(text, e.to_string()))?;
        if let Ok(table) = settings.parse::<toml::Table>() {
            warn_renamed(table.keys().map(String::as_str));
        }
        Ok(cfg)
    }

    /// Settings from a parsed TOML table (unknown keys and wrong types are errors that name
    /// the key).
    pub fn from_table(table: toml::Table) -> Result<Self, String> {
        table.try_into().map_err(|e: toml::de::Error| e.to_string())
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
        // Files as absolute paths, so that the file means the same from another directory (a
        // resume started elsewhere).
        for path in [&mut cfg.text_file, &mut cfg.data_dir, &mut cfg.init_weights]
            .into_iter()
            .flatten()
        {
            if let Ok(absolute) = std::fs::canonicalize(&*path) {
                *path = absolute;
            }
        }
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
            reduce: self.outer_reduce,
            compression: self
                .average_compression
                .and_then(AverageCompressionKind::compression),
            compression_chunk: self.average_compression_chunk,
            rounding: self.average_rounding.map(|r| r.rounding(self.seed)),
            error_feedback: self.average_error_feedback,
            exchange: self.average_exchange,
            fragments: self.fragments,
            fragment_sync_delay: self.fragment_sync_delay,
            fragment_alpha: self.fragment_alpha,
            slowmo_frequency: self.slowmo_frequency,
        }
    }

    /// Check every setting that can be checked without touching the file system's run
    /// directory.
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
        if self.flush_denormals && self.device != DeviceKind::Cpu {
            return Err(bad(
                "flush-denormals",
                true,
                format!(
                    "`false` with device `{}`: it sets the flush mode of burn's own CPU compute threads, which only `cpu` computes on",
                    self.device.name()
                ),
            ));
        }
        if self.device == DeviceKind::Cuda && !cfg!(feature = "cuda") {
            return Err(bad(
                "device",
                "cuda",
                "`cpu`: this binary was built without CUDA support; rebuild with `cargo build -p localsgd-trainer --features cuda` on a machine with the CUDA toolkit",
            ));
        }
        if matches!(self.device, DeviceKind::Libtorch | DeviceKind::LibtorchCuda)
            && !cfg!(feature = "libtorch")
        {
            return Err(bad(
                "device",
                self.device.name(),
                "`cpu`: this binary was built without LibTorch; rebuild with `LIBTORCH_USE_PYTORCH=1 cargo build -p localsgd-trainer --features libtorch` where `pip install torch==2.9.0` has put PyTorch (tch 0.22 takes exactly 2.9.0; book: Performance)",
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
            DatasetKind::Text => match &self.text_file {
                None => {
                    return Err(bad(
                        "text-file",
                        "(unset)",
                        "dataset \"text\" needs `text-file`, the file of text to train on",
                    ));
                }
                Some(f) if !f.exists() => {
                    return Err(bad("text-file", f.display(), "an existing file of text"));
                }
                Some(f) if !f.is_file() => {
                    return Err(bad(
                        "text-file",
                        f.display(),
                        "a regular file of text: this path exists but is a directory, a pipe or \
                         a device, and the text is read more than once (every rank reads it); \
                         save the text to a file first",
                    ));
                }
                Some(_) => {}
            },
            DatasetKind::Digits => {}
        }
        match (self.model, self.dataset) {
            (ModelKind::Gpt, DatasetKind::Text) => {}
            (ModelKind::Gpt, other) => {
                return Err(bad(
                    "dataset",
                    format!("{other:?}").to_lowercase(),
                    "\"text\" (with `text-file`): model \"gpt\" is a language model",
                ));
            }
            (other, DatasetKind::Text) => {
                return Err(bad(
                    "model",
                    format!("{other:?}").to_lowercase(),
                    "\"gpt\": dataset \"text\" trains a language model",
                ));
            }
            _ => {}
        }
        // A resumed run starts from its checkpoint: the initial weights are history.
        if let Some(p) = &self.init_weights
            && !self.resume
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
        if !self.resume_ranks.is_empty() {
            if !self.resume {
                return Err(bad(
                    "resume-ranks",
                    format!("{:?}", self.resume_ranks),
                    "empty, or set together with `resume` (they say which saved rank each worker \
                     continues from)",
                ));
            }
            // One process per rank: `workers` is the launcher's world size, set after this
            // first check (the launch checks the length against it).
            if self.backend == Backend::Threads && self.resume_ranks.len() != self.workers {
                return Err(bad(
                    "resume-ranks",
                    format!("{:?}", self.resume_ranks),
                    format!(
                        "one saved rank per worker: {} entries for `workers` = {}",
                        self.resume_ranks.len(),
                        self.workers
                    ),
                ));
            }
        }
        if self.on_rank_failure.survives() {
            let value = match self.on_rank_failure {
                OnRankFailure::Replace => "replace",
                _ => "continue",
            };
            if self.backend == Backend::Nccl {
                return Err(bad(
                    "on-rank-failure",
                    value,
                    "`abort` with backend nccl: continuing after a rank failure needs the thread \
                     backend, or MPI with ULFM (`mpirun --with-ft ulfm`); resume the last \
                     checkpoint on the surviving ranks with `resume-ranks` instead",
                ));
            }
            if self.checkpoint_every == 0 {
                return Err(bad(
                    "on-rank-failure",
                    value,
                    "`abort`, or set `checkpoint-every` too: the survivors continue from the last \
                     checkpoint (`checkpoint-every = 1` loses no iteration)",
                ));
            }
        }
        if self.on_rank_failure.survives() && self.workers == 1 {
            return Err(bad(
                "on-rank-failure",
                value_name(&self.on_rank_failure),
                "`abort` with one worker: there is no survivor to continue (or train on more \
                 `workers`)",
            ));
        }
        self.check_all_used()?;
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

impl TrainConfig {
    /// Refuse a setting given a value (other than its default) that this run would not use:
    /// another model's shape, another data set's source, another schedule's or optimizer's
    /// parameters, the warmup of DDP, `epochs` under `steps`.
    fn check_all_used(&self) -> Result<(), ConfigError> {
        match self.unused().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// These settings with every value this run would not use (what `validate` refuses) back
    /// at its default, except DDP's warmup, which checkpoints record in the algorithm's
    /// identity: a run file written by a version that accepted such values resumes as the run
    /// went.
    pub fn without_unused(&self) -> Self {
        let unused: Vec<&'static str> = self
            .unused()
            .into_iter()
            .map(|e| e.setting)
            .filter(|s| !matches!(*s, "warmup" | "warmup-epochs"))
            .collect();
        let mut table: toml::Table = toml::from_str(&self.to_toml()).unwrap_or_default();
        for setting in unused {
            table.remove(setting);
        }
        Self::from_table(table).unwrap_or_else(|_| self.clone())
    }

    /// These settings for algorithm `kind` (what `localsgd compare` runs): `algorithm` set to
    /// it and every setting it does not take ([`AlgorithmSetting::applies_to`]) back at its
    /// default.
    pub fn for_algorithm(&self, kind: AlgorithmKind) -> Self {
        let mut table: toml::Table = toml::from_str(&self.to_toml()).unwrap_or_default();
        for setting in AlgorithmSetting::ALL {
            if !setting.applies_to(kind) {
                table.remove(setting.name());
            }
        }
        let mut cfg = Self::from_table(table).unwrap_or_else(|_| self.clone());
        cfg.algorithm = kind;
        cfg
    }

    /// Every setting given a value (other than its default) that this run would not use, as
    /// the refusal that names it.
    fn unused(&self) -> Vec<ConfigError> {
        let mut out = Vec::new();
        let d = Self::default();
        let (model, dataset) = (value_name(&self.model), value_name(&self.dataset));
        let (schedule, optimizer) = (value_name(&self.lr_schedule), value_name(&self.optimizer));
        let shown = |v: Option<&PathBuf>| v.map_or_else(String::new, |p| p.display().to_string());
        // (setting, its value, given another value than the default, the setting that
        // decides whether it is used, the value that uses it, that setting's value in this run)
        let rules: [(&'static str, String, bool, &str, &str, &str); 16] = [
            (
                "hidden",
                format!("{:?}", self.hidden),
                self.hidden != d.hidden,
                "model",
                "mlp",
                &model,
            ),
            (
                "channels",
                format!("{:?}", self.channels),
                self.channels != d.channels,
                "model",
                "cnn",
                &model,
            ),
            (
                "context",
                self.context.to_string(),
                self.context != d.context,
                "model",
                "gpt",
                &model,
            ),
            (
                "d-model",
                self.d_model.to_string(),
                self.d_model != d.d_model,
                "model",
                "gpt",
                &model,
            ),
            (
                "heads",
                self.heads.to_string(),
                self.heads != d.heads,
                "model",
                "gpt",
                &model,
            ),
            (
                "layers",
                self.layers.to_string(),
                self.layers != d.layers,
                "model",
                "gpt",
                &model,
            ),
            (
                "data-dir",
                shown(self.data_dir.as_ref()),
                self.data_dir.is_some(),
                "dataset",
                "idx",
                &dataset,
            ),
            (
                "text-file",
                shown(self.text_file.as_ref()),
                self.text_file.is_some(),
                "dataset",
                "text",
                &dataset,
            ),
            (
                "synthetic-samples",
                self.synthetic_samples.to_string(),
                self.synthetic_samples != d.synthetic_samples,
                "dataset",
                "synthetic",
                &dataset,
            ),
            (
                "synthetic-dim",
                self.synthetic_dim.to_string(),
                self.synthetic_dim != d.synthetic_dim,
                "dataset",
                "synthetic",
                &dataset,
            ),
            (
                "synthetic-classes",
                self.synthetic_classes.to_string(),
                self.synthetic_classes != d.synthetic_classes,
                "dataset",
                "synthetic",
                &dataset,
            ),
            (
                "lr-min",
                self.lr_min.to_string(),
                self.lr_min != d.lr_min,
                "lr-schedule",
                "cosine",
                &schedule,
            ),
            (
                "lr-step-size",
                self.lr_step_size.to_string(),
                self.lr_step_size != d.lr_step_size,
                "lr-schedule",
                "step",
                &schedule,
            ),
            (
                "lr-gamma",
                self.lr_gamma.to_string(),
                self.lr_gamma != d.lr_gamma,
                "lr-schedule",
                "step",
                &schedule,
            ),
            (
                "lr-warmup-steps",
                self.lr_warmup_steps.to_string(),
                self.lr_warmup_steps != d.lr_warmup_steps,
                "lr-schedule",
                "linear-warmup",
                &schedule,
            ),
            (
                "lr-warmup-start-factor",
                self.lr_warmup_start_factor.to_string(),
                self.lr_warmup_start_factor != d.lr_warmup_start_factor,
                "lr-schedule",
                "linear-warmup",
                &schedule,
            ),
        ];
        for (setting, value, given, selector, user, current) in rules {
            if given && user != current {
                out.push(bad(
                    setting,
                    value,
                    format!(
                        "unset: only `{selector}` = {user} uses it, and this run's `{selector}` \
                         is {current} (drop the setting, or set `{selector}` = {user})"
                    ),
                ));
            }
        }
        if self.optimizer == OptimizerKind::Sgd && self.weight_decay_matrices_only {
            out.push(bad(
                "weight-decay-matrices-only",
                true,
                "false: only `optimizer` = adam or adamw splits the weight decay by parameter \
                 shape, and this run's `optimizer` is sgd",
            ));
        }
        if self.optimizer != OptimizerKind::Sgd && self.momentum != d.momentum {
            out.push(bad(
                "momentum",
                self.momentum,
                format!(
                    "unset: only `optimizer` = sgd uses it, and this run's `optimizer` is \
                     {optimizer} (drop the setting: Adam's moments have PyTorch's betas)"
                ),
            ));
        }
        // Local SGD sends no gradients: the gradient buckets' settings do nothing.
        for (setting, value, given) in [
            (
                AlgorithmSetting::BucketCapMb,
                self.bucket_cap_mb.to_string(),
                self.bucket_cap_mb != d.bucket_cap_mb,
            ),
            (
                AlgorithmSetting::FirstBucketMb,
                self.first_bucket_mb.to_string(),
                self.first_bucket_mb != d.first_bucket_mb,
            ),
            (
                AlgorithmSetting::PipelineBuckets,
                value_name(&self.pipeline_buckets),
                self.pipeline_buckets != d.pipeline_buckets,
            ),
        ] {
            if given && !setting.applies_to(self.algorithm) {
                out.push(bad(
                    setting.name(),
                    value,
                    format!(
                        "unset: `algorithm` = {} sends no gradients, so it has no gradient \
                         buckets (drop the setting)",
                        self.algorithm.name()
                    ),
                ));
            }
        }
        if self.accumulate == 1 && self.accumulation != d.accumulation {
            out.push(bad(
                "accumulation",
                value_name(&self.accumulation),
                "unset: it says how a step's micro-batches meet an epoch's end, and with \
                 `accumulate` = 1 a step has one (drop the setting, or set `accumulate`)",
            ));
        }
        // A resumed DDP run keeps what its checkpoint's identity records (the resume checks
        // it); a fresh one has no warmup.
        if !AlgorithmSetting::Warmup.applies_to(self.algorithm) && !self.resume {
            // 0 says what DDP does anyway.
            if self.warmup != d.warmup && self.warmup != 0 {
                out.push(bad(
                    "warmup",
                    self.warmup,
                    format!(
                        "unset: `algorithm` = {} all-reduces gradients on every step and has \
                         no warmup (drop the setting, or choose `post-local-sgd`, whose warmup \
                         it is)",
                        self.algorithm.name()
                    ),
                ));
            }
        }
        if !AlgorithmSetting::WarmupEpochs.applies_to(self.algorithm)
            && !self.resume
            && let Some(e) = self.warmup_epochs
        {
            out.push(bad(
                "warmup-epochs",
                e,
                format!(
                    "unset: `algorithm` = {} has no warmup",
                    self.algorithm.name()
                ),
            ));
        }
        if let Some(steps) = self.steps
            && self.epochs != d.epochs
        {
            out.push(bad(
                "epochs",
                self.epochs,
                format!(
                    "unset: `steps` = {steps} ends the run, and `epochs` is used only without \
                     `steps` (drop one of the two)"
                ),
            ));
        }
        out
    }
}

/// A TOML error, with a hint where a line gives a setting a bare word (`average-compression =
/// int4`): TOML strings need quotes (and booleans are lowercase), and the parser's own message
/// ("invalid float") does not say so.
fn with_quote_hint(text: &str, error: String) -> String {
    let hint = text.lines().find_map(|line| {
        let line = line.split('#').next()?.trim();
        let (key, value) = line.split_once('=')?;
        let (key, value) = (key.trim(), value.trim());
        let word = !value.is_empty()
            && value.starts_with(|c: char| c.is_ascii_alphabetic())
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-:+.".contains(c))
            && !matches!(value, "true" | "false" | "inf" | "nan");
        if !word {
            return None;
        }
        let setting = SETTINGS.iter().find(|s| s.field.replace('_', "-") == key)?;
        let text = setting.type_text;
        if text.starts_with("bool") {
            return Some(match value.to_lowercase().as_str() {
                v @ ("true" | "false") => format!("`{key}` is written in lowercase: {key} = {v}"),
                _ => format!("`{key}` takes true or false"),
            });
        }
        // Values, paths and strings are TOML strings; numbers and lists are not.
        (text.starts_with('`') || text.starts_with("path") || text.starts_with("string"))
            .then(|| format!("a text value needs quotes in TOML: {key} = \"{value}\""))
    });
    match hint {
        Some(hint) => format!("{error}\nhint: {hint}"),
        None => error,
    }
}

/// A setting's value as its flag and the TOML file spell it (`linear-warmup`, `post-local-sgd`).
pub fn value_name<T: clap::ValueEnum + std::fmt::Debug>(value: &T) -> String {
    value
        .to_possible_value()
        .map_or_else(|| format!("{value:?}"), |v| v.get_name().to_string())
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
