//! The algorithm settings the pipeline's parts are built from ([`crate::algorithm`]): which
//! algorithm, the outer optimizer, bucket pipelining and gradient compression. Plain types
//! (serde; `clap::ValueEnum` only with this crate's `clap` feature, for command lines).

mod applies;
mod outer;

pub use applies::AlgorithmSetting;
pub use localsgd_averagers::outer::LossyExchange;
pub use outer::{AverageCompressionKind, AverageRounding, OuterOptions, SLOWMO_FREQUENCY};
pub(crate) use outer::{check_compression, rounding_name};

use localsgd_averagers::{
    AverageCompression, Level, OuterOptimizer, OuterSgdConfig, PseudoGradient, StreamingConfig,
};
use localsgd_comm::Precision;
use serde::{Deserialize, Serialize};

/// The training algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum AlgorithmKind {
    /// All-reduce every gradient every step (the all-reduce hook, no averager).
    Ddp,
    /// No gradient communication; periodic model averaging from step `warmup` on.
    LocalSgd,
    /// Gradient all-reduce for `warmup` steps (post-local SGD hook), then periodic averaging.
    PostLocalSgd,
    /// Post-local SGD hook with hierarchical averaging (`levels`).
    Hierarchical,
    /// DiLoCo: the post-local SGD hook's warmup, then every `period` local steps an outer
    /// `torch.optim.SGD` step (default Nesterov, lr 0.7, momentum 0.9) on the global model with
    /// the replicas' mean displacement as gradient; with `levels`, the lower levels average
    /// plainly and the outer step runs at the whole-world level.
    Diloco,
    /// Streaming DiLoCo (torchft's `DiLoCo` with fragments): like `diloco`, but the parameters
    /// sync in `fragments` fragments (default 2) taking turns every `period / fragments` local
    /// steps, each fragment's all-reduce started `fragment-sync-delay` steps early and its
    /// local values mixed back in with `fragment-alpha`.
    StreamingDiloco,
    /// SlowMo (fairscale's arithmetic): like `diloco`, with the slow-momentum step
    /// `u = βu + Δ/γ; θ = θ − αγu` (γ the step's inner learning rate; defaults α 1, β 0.5).
    Slowmo,
}

impl AlgorithmKind {
    /// Every algorithm, in the order the book lists them.
    pub const ALL: [AlgorithmKind; 7] = [
        AlgorithmKind::Ddp,
        AlgorithmKind::LocalSgd,
        AlgorithmKind::PostLocalSgd,
        AlgorithmKind::Hierarchical,
        AlgorithmKind::Diloco,
        AlgorithmKind::StreamingDiloco,
        AlgorithmKind::Slowmo,
    ];

    /// The algorithm written `name` in a config file or a flag (`ddp`, `local-sgd`, ...); the
    /// error names the value and every valid one.
    pub fn from_name(name: &str) -> Result<Self, SettingError> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                SettingError::new(
                    "algorithm",
                    format!("{name:?}"),
                    format!("one of {}", names.join(", ")),
                )
            })
    }

    /// The value as written in a config file or a flag (`ddp`, `local-sgd`, ...).
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmKind::Ddp => "ddp",
            AlgorithmKind::LocalSgd => "local-sgd",
            AlgorithmKind::PostLocalSgd => "post-local-sgd",
            AlgorithmKind::Hierarchical => "hierarchical",
            AlgorithmKind::Diloco => "diloco",
            AlgorithmKind::StreamingDiloco => "streaming-diloco",
            AlgorithmKind::Slowmo => "slowmo",
        }
    }

    /// The averaging period the `localsgd` binary uses when none is given: 4 for local SGD,
    /// post-local SGD (none for hierarchical averaging and DDP, whose levels or every step
    /// set the cadence), fairscale's `localsgd_frequency` 3 for SlowMo, and 50 local steps for
    /// DiLoCo and Streaming DiLoCo (DiLoCo's outer Nesterov momentum needs rounds of many
    /// local steps: with post-local SGD's 4 it trains badly).
    pub fn default_period(self) -> Option<u64> {
        match self {
            AlgorithmKind::Ddp | AlgorithmKind::Hierarchical => None,
            AlgorithmKind::LocalSgd | AlgorithmKind::PostLocalSgd => Some(4),
            AlgorithmKind::Slowmo => Some(3),
            AlgorithmKind::Diloco | AlgorithmKind::StreamingDiloco => Some(50),
        }
    }

    /// Whether this algorithm takes outer-optimizer steps (`diloco`, `streaming-diloco`,
    /// `slowmo`).
    pub fn is_outer(self) -> bool {
        matches!(
            self,
            AlgorithmKind::Diloco | AlgorithmKind::StreamingDiloco | AlgorithmKind::Slowmo
        )
    }
}

/// The outer optimizer settings of `diloco`/`streaming-diloco`/`slowmo`, or the wire format of
/// an averaging algorithm's world averages ([`OuterSettings::averaging`]), resolved and checked
/// (the binary resolves them from its settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OuterSettings {
    /// The outer optimizer.
    pub optimizer: OuterOptimizer,
    /// How the pseudo-gradient is reduced.
    pub reduce: PseudoGradient,
    /// The pseudo-gradients' wire format (`None`: full precision): half precision through an
    /// all-reduce, or a lossy codec (int8, int4, top-k) through an all-gather.
    pub compression: Option<AverageCompression>,
    /// Streaming DiLoCo's fragments, delay and mixing (`None`: every parameter syncs at once).
    pub streaming: Option<StreamingConfig>,
    /// SlowMo's slow step every this many steps (fairscale's `slowmo_frequency`), the models
    /// averaged every `period` steps in between; `None`: at every average.
    pub slowmo_frequency: Option<u64>,
}

impl OuterSettings {
    /// DiLoCo's outer optimizer: `torch.optim.SGD(lr=0.7, momentum=0.9, nesterov=True)` (the
    /// paper's, OpenDiLoCo's and torchft's), the mean of the replicas' deltas, full precision,
    /// every parameter at once.
    pub fn diloco() -> Self {
        Self {
            optimizer: OuterSgdConfig::diloco().into(),
            reduce: PseudoGradient::MeanOfDeltas,
            compression: None,
            streaming: None,
            slowmo_frequency: None,
        }
    }

    /// The averages of `local-sgd`, `post-local-sgd` and `hierarchical`'s world level sent in
    /// `compression` (semantics §11.2): each rank's delta from the last average `θ − x_r`, and
    /// the average `θ − mean_r(θ − x_r)`, i.e. an outer `torch.optim.SGD(lr=1)` on the mean of
    /// deltas, which without compression is the plain average of the models.
    pub fn averaging(compression: AverageCompression) -> Self {
        Self {
            optimizer: OuterSgdConfig::sgd(1.0).into(),
            reduce: PseudoGradient::MeanOfDeltas,
            compression: Some(compression),
            streaming: None,
            slowmo_frequency: None,
        }
    }

    /// SlowMo's slow step with fairscale's defaults (`slowmo_lr` 1, `slowmo_momentum` 0.5) on
    /// the averaged parameters (delta of mean, fairscale's gather), every `slowmo_frequency`
    /// steps.
    pub fn slowmo(slowmo_frequency: u64) -> Self {
        Self {
            optimizer: OuterOptimizer::SlowMo {
                lr: 1.0,
                momentum: 0.5,
            },
            reduce: PseudoGradient::DeltaOfMean,
            compression: None,
            streaming: None,
            slowmo_frequency: Some(slowmo_frequency),
        }
    }
}

/// Whether gradient buckets are pipelined (see `TrainConfig::pipeline_buckets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum PipelineBuckets {
    /// On when the ranks span more than one host and no rank was told that its host has more
    /// ranks than cores. Off on one host (threads, or mpi/nccl ranks sharing a machine), where
    /// a collective is a memory copy with no wire time to hide and the helper thread's
    /// hand-offs cost more than they hide; off where ranks share cores, where the helper waits
    /// for a core between the polls that move each piece.
    Auto,
    /// Always pipelined.
    On,
    /// Never: every bucket blocks, then one optimizer step.
    Off,
}

/// What gradient buckets travel as (the setting `compression`): full precision, or cast to a
/// half [`Precision`] around the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum GradientCompression {
    /// Full precision.
    None,
    /// IEEE half precision.
    Fp16,
    /// bfloat16.
    Bf16,
}

impl GradientCompression {
    /// The half precision the buckets travel in; `None` for full precision.
    pub fn precision(self) -> Option<Precision> {
        match self {
            GradientCompression::None => None,
            GradientCompression::Fp16 => Some(Precision::Fp16),
            GradientCompression::Bf16 => Some(Precision::Bf16),
        }
    }
}

/// A setting with a value that cannot work. Names the setting and what would be valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting `{setting}` = {value}: {valid}")]
pub struct SettingError {
    /// The setting's name (as in the TOML file and the flag).
    pub setting: &'static str,
    /// The value given.
    pub value: String,
    /// What would be valid.
    pub valid: String,
}

impl SettingError {
    /// `setting` (its name in the binary's TOML file and flags) has `value`; `valid` says what
    /// would be valid.
    pub fn new(setting: &'static str, value: impl ToString, valid: impl ToString) -> Self {
        Self {
            setting,
            value: value.to_string(),
            valid: valid.to_string(),
        }
    }
}

/// Hierarchical levels, parsed once from their text form `"2:2,4:4"` (`period:group-size` pairs,
/// comma-separated; `""` for none): the `levels` setting in TOML (a string, as before) and on
/// the command line. The rules a set of levels must follow over the workers are the averagers'
/// ([`validate_levels`](localsgd_averagers::validate_levels)), checked by
/// [`AlgorithmSpec::validate`](crate::algorithm::AlgorithmSpec::validate).
///
/// ```
/// use localsgd_pipeline::settings::Levels;
///
/// let levels: Levels = "2:2, 8:4".parse().unwrap();
/// assert_eq!(levels.as_slice()[1].period, 8);
/// assert_eq!(levels.to_string(), "2:2,8:4");
/// assert!("2:x".parse::<Levels>().is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Levels(pub Vec<Level>);

impl Levels {
    /// The levels, in order.
    pub fn as_slice(&self) -> &[Level] {
        &self.0
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<Level>> for Levels {
    fn from(levels: Vec<Level>) -> Self {
        Self(levels)
    }
}

impl std::str::FromStr for Levels {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let invalid = || {
            format!(
                "{text:?} is not a list of levels: expected comma-separated `period:group-size` \
                 pairs of non-negative integers, e.g. \"2:2,4:4\", or \"\" for none"
            )
        };
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|pair| {
                let (p, s) = pair.split_once(':').ok_or_else(invalid)?;
                let period = p.trim().parse::<u64>().map_err(|_| invalid())?;
                let group_size = s.trim().parse::<usize>().map_err(|_| invalid())?;
                Ok(Level { period, group_size })
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Levels)
    }
}

impl std::fmt::Display for Levels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|l| format!("{}:{}", l.period, l.group_size))
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl Serialize for Levels {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Levels {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
