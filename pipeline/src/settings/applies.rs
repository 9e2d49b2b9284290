//! Which algorithm takes which setting: the one statement of it. [`AlgorithmSpec::validate`]
//! and [`OuterSettings::resolve`](localsgd_averagers::OuterSettings) refuse a setting an
//! algorithm does not take, the `localsgd` binary's configuration refuses the ones it checks
//! itself (DDP's warmup, local SGD's gradient buckets), and `localsgd compare` drops the
//! given settings each algorithm does not take, all from [`AlgorithmSetting::applies_to`].
//!
//! [`AlgorithmSpec::validate`]: crate::algorithm::AlgorithmSpec::validate

use super::AlgorithmKind;

/// A setting that only some algorithms take, named as the binary's TOML file and flags name
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmSetting {
    /// `warmup`: steps of gradient all-reduce before local steps.
    Warmup,
    /// `warmup-epochs`: the warmup in epochs.
    WarmupEpochs,
    /// `period`: local steps between averages.
    Period,
    /// `levels`: hierarchical averaging's levels.
    Levels,
    /// `overlap`: steps an average may stay in flight.
    Overlap,
    /// `compression`: the gradient buckets' precision.
    Compression,
    /// `bucket-cap-mb`: the gradient buckets' size.
    BucketCapMb,
    /// `first-bucket-mb`: the first gradient bucket's size.
    FirstBucketMb,
    /// `pipeline-buckets`: whether gradient buckets are all-reduced while others fill.
    PipelineBuckets,
    /// `outer-lr`: the outer optimizer's learning rate.
    OuterLr,
    /// `outer-momentum`: the outer optimizer's momentum.
    OuterMomentum,
    /// `outer-nesterov`: the outer optimizer's Nesterov momentum.
    OuterNesterov,
    /// `outer-reduce`: how the pseudo-gradient is formed.
    OuterReduce,
    /// `average-compression`: the wire format of averages and pseudo-gradients.
    AverageCompression,
    /// `average-compression-chunk`: a lossy codec's chunk.
    AverageCompressionChunk,
    /// `average-rounding`: a quantizing codec's rounding.
    AverageRounding,
    /// `average-error-feedback`: a lossy codec's error feedback.
    AverageErrorFeedback,
    /// `average-exchange`: how a lossy codec's messages become the mean.
    AverageExchange,
    /// `fragments`: Streaming DiLoCo's fragments.
    Fragments,
    /// `fragment-sync-delay`: Streaming DiLoCo's early start of a fragment's all-reduce.
    FragmentSyncDelay,
    /// `fragment-alpha`: Streaming DiLoCo's mixing of local values.
    FragmentAlpha,
    /// `slowmo-frequency`: SlowMo's slow-step frequency.
    SlowmoFrequency,
}

impl AlgorithmSetting {
    /// Every such setting, in the configuration reference's order.
    pub const ALL: [AlgorithmSetting; 22] = [
        AlgorithmSetting::Warmup,
        AlgorithmSetting::WarmupEpochs,
        AlgorithmSetting::Period,
        AlgorithmSetting::Levels,
        AlgorithmSetting::Overlap,
        AlgorithmSetting::Compression,
        AlgorithmSetting::BucketCapMb,
        AlgorithmSetting::FirstBucketMb,
        AlgorithmSetting::PipelineBuckets,
        AlgorithmSetting::OuterLr,
        AlgorithmSetting::OuterMomentum,
        AlgorithmSetting::OuterNesterov,
        AlgorithmSetting::OuterReduce,
        AlgorithmSetting::AverageCompression,
        AlgorithmSetting::AverageCompressionChunk,
        AlgorithmSetting::AverageRounding,
        AlgorithmSetting::AverageErrorFeedback,
        AlgorithmSetting::AverageExchange,
        AlgorithmSetting::Fragments,
        AlgorithmSetting::FragmentSyncDelay,
        AlgorithmSetting::FragmentAlpha,
        AlgorithmSetting::SlowmoFrequency,
    ];

    /// The setting's name in a TOML file (`--name` as a flag).
    pub fn name(self) -> &'static str {
        match self {
            Self::Warmup => "warmup",
            Self::WarmupEpochs => "warmup-epochs",
            Self::Period => "period",
            Self::Levels => "levels",
            Self::Overlap => "overlap",
            Self::Compression => "compression",
            Self::BucketCapMb => "bucket-cap-mb",
            Self::FirstBucketMb => "first-bucket-mb",
            Self::PipelineBuckets => "pipeline-buckets",
            Self::OuterLr => "outer-lr",
            Self::OuterMomentum => "outer-momentum",
            Self::OuterNesterov => "outer-nesterov",
            Self::OuterReduce => "outer-reduce",
            Self::AverageCompression => "average-compression",
            Self::AverageCompressionChunk => "average-compression-chunk",
            Self::AverageRounding => "average-rounding",
            Self::AverageErrorFeedback => "average-error-feedback",
            Self::AverageExchange => "average-exchange",
            Self::Fragments => "fragments",
            Self::FragmentSyncDelay => "fragment-sync-delay",
            Self::FragmentAlpha => "fragment-alpha",
            Self::SlowmoFrequency => "slowmo-frequency",
        }
    }

    /// Whether algorithm `kind` takes this setting (a given value it does not take is
    /// refused, naming the setting).
    ///
    /// ```
    /// use localsgd_pipeline::settings::{AlgorithmKind, AlgorithmSetting};
    /// assert!(AlgorithmSetting::Period.applies_to(AlgorithmKind::Diloco));
    /// assert!(!AlgorithmSetting::Warmup.applies_to(AlgorithmKind::Ddp));
    /// assert!(!AlgorithmSetting::AverageCompression.applies_to(AlgorithmKind::Slowmo));
    /// ```
    pub fn applies_to(self, kind: AlgorithmKind) -> bool {
        use AlgorithmKind as K;
        match self {
            // DDP all-reduces gradients from the first step.
            Self::Warmup | Self::WarmupEpochs => kind != K::Ddp,
            // DDP never averages; hierarchical averaging takes its levels' periods.
            Self::Period => !matches!(kind, K::Ddp | K::Hierarchical),
            // Hierarchical averaging's, and the lower levels of DiLoCo and SlowMo.
            Self::Levels => matches!(kind, K::Hierarchical | K::Diloco | K::Slowmo),
            // The periodic averages of (post-)local SGD: an outer step needs its average at
            // once, and hierarchical averaging does not overlap yet.
            Self::Overlap => matches!(kind, K::LocalSgd | K::PostLocalSgd),
            // Local SGD sends no gradients.
            Self::Compression | Self::BucketCapMb | Self::FirstBucketMb | Self::PipelineBuckets => {
                kind != K::LocalSgd
            }
            Self::OuterLr | Self::OuterMomentum | Self::OuterNesterov | Self::OuterReduce => {
                kind.is_outer()
            }
            // Every averaging algorithm's averages and the pseudo-gradients of DiLoCo's kind;
            // not DDP (no averages) nor SlowMo (its slow step takes the averaged parameters).
            Self::AverageCompression
            | Self::AverageCompressionChunk
            | Self::AverageRounding
            | Self::AverageErrorFeedback
            | Self::AverageExchange => !matches!(kind, K::Ddp | K::Slowmo),
            Self::Fragments | Self::FragmentSyncDelay | Self::FragmentAlpha => {
                kind == K::StreamingDiloco
            }
            Self::SlowmoFrequency => kind == K::Slowmo,
        }
    }
}
