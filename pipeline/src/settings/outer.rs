//! The outer optimizer's settings as a user writes them ([`OuterOptions`], each unset one
//! taking its algorithm's default) resolved and checked into [`OuterSettings`]: the rules of
//! torch's SGD, fairscale's SlowMo, torchft's Streaming DiLoCo and the pseudo-gradients' codec,
//! each error named after the setting as the `localsgd` binary's TOML file and flags spell it.

use localsgd_averagers::outer::LossyExchange;
use localsgd_averagers::{
    AverageCompression, Level, OuterOptimizer, OuterSgdConfig, PseudoGradient, SlowMoConfig,
    StreamingConfig,
};
use localsgd_comm::Precision;
use localsgd_comm::codec::{Codec, CodecError, Rounding};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use super::applies::AlgorithmSetting;
use super::{AlgorithmKind, Levels, OuterSettings, SettingError};

/// fairscale's `slowmo_frequency` default: SlowMo's slow step every 48 steps.
pub const SLOWMO_FREQUENCY: u64 = 48;

/// What `average-compression` names, as written in the binary's TOML file and flags: `none`,
/// `fp16`, `bf16`, or a lossy codec (`int8`, `int4`, `topk:F`, `topk:F+int8`, `topk:F+int4`;
/// `localsgd_comm::codec::Codec`). Parsed from and shown as that text, serialized as it too.
///
/// ```
/// use localsgd_pipeline::settings::AverageCompressionKind;
///
/// let kind: AverageCompressionKind = "topk:0.01+int8".parse().unwrap();
/// assert_eq!(kind.to_string(), "topk:0.01+int8");
/// assert_eq!("fp16".parse::<AverageCompressionKind>().unwrap().to_string(), "fp16");
/// let err = "topk:1.5".parse::<AverageCompressionKind>().unwrap_err();
/// assert!(err.to_string().starts_with("invalid setting `average-compression` = topk:1.5: "));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum AverageCompressionKind {
    /// Full precision (the same as unset).
    None,
    /// Half precision (`fp16`, `bf16`), summed by an all-reduce.
    Half(Precision),
    /// A lossy codec, its messages all-gathered.
    Lossy(Codec),
}

/// The values `average-compression` takes, for error messages.
const VALID_AVERAGE_COMPRESSION: &str = "one of `none`, `fp16`, `bf16`, `int8`, `int4`, `topk:F`, \
     `topk:F+int8`, `topk:F+int4` (0 < F <= 1)";

impl AverageCompressionKind {
    /// The wire format it names, with a lossy codec's defaults
    /// ([`AverageCompression::lossy`]: chunk 1024, nearest rounding, error feedback); `None` for
    /// `none`.
    pub fn compression(self) -> Option<AverageCompression> {
        match self {
            AverageCompressionKind::None => None,
            AverageCompressionKind::Half(p) => Some(AverageCompression::Half(p)),
            AverageCompressionKind::Lossy(codec) => Some(AverageCompression::lossy(codec)),
        }
    }
}

impl From<Option<AverageCompression>> for AverageCompressionKind {
    fn from(c: Option<AverageCompression>) -> Self {
        match c {
            None => AverageCompressionKind::None,
            Some(AverageCompression::Half(p)) => AverageCompressionKind::Half(p),
            Some(AverageCompression::Lossy { spec, .. }) => {
                AverageCompressionKind::Lossy(spec.codec)
            }
        }
    }
}

impl fmt::Display for AverageCompressionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AverageCompressionKind::None => f.write_str("none"),
            AverageCompressionKind::Half(p) => write!(f, "{p}"),
            AverageCompressionKind::Lossy(codec) => write!(f, "{codec}"),
        }
    }
}

impl FromStr for AverageCompressionKind {
    type Err = SettingError;

    /// `none`, `fp16`, `bf16` or a codec; the error names the value and what is valid (the
    /// codec's own words for a bad `topk:` fraction or quantizer).
    fn from_str(s: &str) -> Result<Self, SettingError> {
        match s {
            "none" => return Ok(AverageCompressionKind::None),
            "fp16" => return Ok(AverageCompressionKind::Half(Precision::Fp16)),
            "bf16" => return Ok(AverageCompressionKind::Half(Precision::Bf16)),
            _ => {}
        }
        s.parse::<Codec>()
            .map(AverageCompressionKind::Lossy)
            .map_err(|e| match e {
                CodecError::UnknownCodec(_) => {
                    bad("average-compression", s, VALID_AVERAGE_COMPRESSION)
                }
                e => bad("average-compression", s, e),
            })
    }
}

impl From<AverageCompressionKind> for String {
    fn from(kind: AverageCompressionKind) -> String {
        kind.to_string()
    }
}

impl TryFrom<String> for AverageCompressionKind {
    type Error = SettingError;

    fn try_from(s: String) -> Result<Self, SettingError> {
        s.parse()
    }
}

/// The outer optimizer's settings as given (`None`: the algorithm's default). The binary's
/// `outer-lr`, `outer-momentum`, `outer-nesterov`, `outer-reduce`, `average-compression`,
/// `average-compression-chunk`, `average-rounding`, `average-error-feedback`,
/// `average-exchange`, `fragments`,
/// `fragment-sync-delay`, `fragment-alpha` and `slowmo-frequency` fill it;
/// [`OuterSettings::resolve`] turns it into settings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OuterOptions {
    /// Outer learning rate (DiLoCo's SGD lr, default 0.7; SlowMo's `slowmo_lr` α, default 1).
    pub lr: Option<f64>,
    /// Outer momentum (DiLoCo's SGD momentum, default 0.9; SlowMo's `slowmo_momentum` β,
    /// default 0.5).
    pub momentum: Option<f64>,
    /// DiLoCo: Nesterov momentum (default: when the momentum is above 0). SlowMo is heavy-ball
    /// only.
    pub nesterov: Option<bool>,
    /// How the pseudo-gradient is reduced (default: mean of deltas for DiLoCo, delta of mean
    /// for SlowMo, the only one it takes).
    pub reduce: Option<PseudoGradient>,
    /// The pseudo-gradients' wire format (default: full precision; needs mean of deltas): half
    /// precision, or a lossy codec whose chunk, rounding and error feedback the next three
    /// settings override ([`AverageCompressionKind::compression`] gives the defaults).
    pub compression: Option<AverageCompression>,
    /// A lossy codec's chunk (default: the codec's, [`localsgd_averagers::outer::DEFAULT_CHUNK`]);
    /// refused without a lossy codec.
    pub compression_chunk: Option<usize>,
    /// A lossy codec's rounding (default nearest); refused without a quantizing codec.
    pub rounding: Option<Rounding>,
    /// A lossy codec's error feedback (default on); refused without a lossy codec.
    pub error_feedback: Option<bool>,
    /// How a lossy codec's messages become the mean (default auto: the cheaper on the wire);
    /// refused without a lossy codec.
    pub exchange: Option<LossyExchange>,
    /// Streaming DiLoCo's fragments (default 2).
    pub fragments: Option<usize>,
    /// Streaming DiLoCo's τ, torchft's `fragment_sync_delay` (default 0).
    pub fragment_sync_delay: Option<u64>,
    /// Streaming DiLoCo's α, torchft's `fragment_update_alpha` (default 0).
    pub fragment_alpha: Option<f64>,
    /// SlowMo's slow step every this many steps, fairscale's `slowmo_frequency` (default
    /// [`SLOWMO_FREQUENCY`]); the models are averaged every `period` steps in between.
    pub slowmo_frequency: Option<u64>,
}

fn bad(setting: &'static str, value: impl ToString, valid: impl ToString) -> SettingError {
    SettingError::new(setting, value, valid)
}

/// How a lossy `average-compression` rounds values to integers: the setting
/// `average-rounding`'s value (the codec's [`Rounding`] draws a stochastic one from a seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum AverageRounding {
    /// To nearest, ties to even.
    Nearest,
    /// Up or down at random, unbiased, drawn from `seed`, the outer step and the rank.
    Stochastic,
}

impl AverageRounding {
    /// The codec's rounding, stochastic drawn from the run's `seed`.
    pub fn rounding(self, seed: u64) -> Rounding {
        match self {
            AverageRounding::Nearest => Rounding::Nearest,
            AverageRounding::Stochastic => Rounding::Stochastic { seed },
        }
    }
}

/// The name of a rounding, as `average-rounding` takes it (`nearest`, `stochastic`).
pub(crate) fn rounding_name(r: Rounding) -> &'static str {
    match r {
        Rounding::Nearest => "nearest",
        Rounding::Stochastic { .. } => "stochastic",
    }
}

impl OuterOptions {
    /// The given settings, by name and value, in the order they are reported.
    fn given(&self) -> [(AlgorithmSetting, Option<String>); 13] {
        [
            (AlgorithmSetting::OuterLr, self.lr.map(|v| v.to_string())),
            (
                AlgorithmSetting::OuterMomentum,
                self.momentum.map(|v| v.to_string()),
            ),
            (
                AlgorithmSetting::OuterNesterov,
                self.nesterov.map(|v| v.to_string()),
            ),
            (
                AlgorithmSetting::OuterReduce,
                self.reduce.map(|v| reduce_name(v).to_string()),
            ),
            (
                AlgorithmSetting::AverageCompression,
                self.compression
                    .map(|c| AverageCompressionKind::from(Some(c)).to_string()),
            ),
            (
                AlgorithmSetting::AverageCompressionChunk,
                self.compression_chunk.map(|v| v.to_string()),
            ),
            (
                AlgorithmSetting::AverageRounding,
                self.rounding.map(|r| rounding_name(r).to_string()),
            ),
            (
                AlgorithmSetting::AverageErrorFeedback,
                self.error_feedback.map(|v| v.to_string()),
            ),
            (
                AlgorithmSetting::AverageExchange,
                self.exchange.map(|v| v.to_string()),
            ),
            (
                AlgorithmSetting::Fragments,
                self.fragments.map(|v| v.to_string()),
            ),
            (
                AlgorithmSetting::FragmentSyncDelay,
                self.fragment_sync_delay.map(|v| v.to_string()),
            ),
            (
                AlgorithmSetting::FragmentAlpha,
                self.fragment_alpha.map(|v| v.to_string()),
            ),
            (
                AlgorithmSetting::SlowmoFrequency,
                self.slowmo_frequency.map(|v| v.to_string()),
            ),
        ]
    }
}

fn reduce_name(r: PseudoGradient) -> &'static str {
    match r {
        PseudoGradient::MeanOfDeltas => "mean-of-deltas",
        PseudoGradient::DeltaOfMean => "delta-of-mean",
    }
}

impl OuterSettings {
    /// `options` resolved for `kind` averaging every `period` steps over `levels`: the
    /// defaults filled in and every rule checked. `local-sgd`, `post-local-sgd` and
    /// `hierarchical` take only the four wire-format settings (`average-compression` and its
    /// chunk, rounding and error feedback): [`OuterSettings::averaging`] when a compression is
    /// given, else `None`; `ddp` takes none. A setting an algorithm does not take is refused,
    /// naming it.
    pub fn resolve(
        kind: AlgorithmKind,
        period: u64,
        levels: &[Level],
        options: &OuterOptions,
    ) -> Result<Option<Self>, SettingError> {
        if !kind.is_outer() {
            // The averaging algorithms take the wire format of their averages, nothing else.
            let averages = AlgorithmSetting::AverageCompression.applies_to(kind);
            if let Some((setting, Some(value))) = options
                .given()
                .into_iter()
                .find(|g| g.1.is_some() && !g.0.applies_to(kind))
            {
                let valid = if averages {
                    format!(
                        "unset: `{}` averages models with no outer optimizer; of the outer \
                         settings it takes only the averages' wire format (`average-compression`, \
                         `average-compression-chunk`, `average-rounding`, `average-error-feedback`)",
                        kind.name()
                    )
                } else {
                    format!(
                        "unset: outer settings apply to algorithms `diloco`, \
                         `streaming-diloco` and `slowmo` (and `average-compression` to the \
                         averages of `local-sgd`, `post-local-sgd` and `hierarchical`), not `{}`",
                        kind.name()
                    )
                };
                return Err(bad(setting.name(), value, valid));
            }
            let compression = resolve_compression(options)?;
            check_compression(compression, PseudoGradient::MeanOfDeltas)?;
            return Ok(compression.map(OuterSettings::averaging));
        }
        let optimizer = optimizer(kind, options)?;
        let reduce = options.reduce.unwrap_or(optimizer.default_reduce());
        let is_slowmo = matches!(optimizer, OuterOptimizer::SlowMo { .. });
        if is_slowmo && reduce == PseudoGradient::MeanOfDeltas {
            return Err(bad(
                "outer-reduce",
                "mean-of-deltas",
                "`delta-of-mean` (or unset): SlowMo computes its slow step from the averaged \
                 parameters, as fairscale does",
            ));
        }
        let compression = resolve_compression(options)?;
        check_compression(compression, reduce)?;
        let streaming = streaming(kind, period, levels, reduce, options)?;
        let slowmo_frequency = slowmo_frequency(kind, period, levels, &optimizer, options)?;
        Ok(Some(OuterSettings {
            optimizer,
            reduce,
            compression,
            streaming,
            slowmo_frequency,
        }))
    }
}

/// The pseudo-gradients' wire format: `average-compression` with a lossy codec's chunk, rounding
/// and error feedback as given (each refused where it would do nothing).
fn resolve_compression(o: &OuterOptions) -> Result<Option<AverageCompression>, SettingError> {
    let Some(AverageCompression::Lossy {
        mut spec,
        mut error_feedback,
        mut exchange,
    }) = o.compression
    else {
        let name = AverageCompressionKind::from(o.compression).to_string();
        let given = [
            (
                "average-compression-chunk",
                o.compression_chunk.map(|v| v.to_string()),
            ),
            (
                "average-rounding",
                o.rounding.map(|r| rounding_name(r).to_string()),
            ),
            (
                "average-error-feedback",
                o.error_feedback.map(|v| v.to_string()),
            ),
            ("average-exchange", o.exchange.map(|v| v.to_string())),
        ];
        if let Some((setting, Some(value))) = given.into_iter().find(|g| g.1.is_some()) {
            return Err(bad(
                setting,
                value,
                format!(
                    "unset with `average-compression` = {name}: chunks, rounding, error \
                     feedback and the exchange are the lossy codecs' (`int8`, `int4`, `topk:F`, \
                     `topk:F+int8`, `topk:F+int4`)"
                ),
            ));
        }
        return Ok(o.compression);
    };
    if let Some(chunk) = o.compression_chunk {
        spec.chunk = chunk;
    }
    if let Some(rounding) = o.rounding {
        if matches!(rounding, Rounding::Stochastic { .. }) && spec.codec.quantizer().is_none() {
            return Err(bad(
                "average-rounding",
                rounding_name(rounding),
                format!(
                    "`nearest` (or unset) with `average-compression` = {}: top-k with f32 values \
                     rounds nothing; stochastic rounding is for the quantizing codecs (`int8`, \
                     `int4`, `topk:F+int8`, `topk:F+int4`)",
                    spec.codec
                ),
            ));
        }
        spec.rounding = rounding;
    }
    if let Some(on) = o.error_feedback {
        error_feedback = on;
    }
    if let Some(chosen) = o.exchange {
        exchange = chosen;
    }
    if exchange == LossyExchange::AllReduce && o.fragment_sync_delay.is_some_and(|d| d > 0) {
        return Err(bad(
            "average-exchange",
            "all-reduce",
            "`auto` or `all-gather` with `fragment-sync-delay` above 0: the quantized \
             all-reduce runs blocking, and a delayed fragment's exchange is an all-gather",
        ));
    }
    Ok(Some(AverageCompression::Lossy {
        spec,
        error_feedback,
        exchange,
    }))
}

/// The rules of a wire format for the pseudo-gradients: a lossy codec's own (its chunk, its
/// top-k fraction), and that the pseudo-gradients exist to be compressed (`mean-of-deltas`).
/// [`OuterSettings::resolve`] checks them, and so does
/// [`AlgorithmSpec::validate`](crate::algorithm::AlgorithmSpec::validate) for settings built in
/// code.
pub(crate) fn check_compression(
    compression: Option<AverageCompression>,
    reduce: PseudoGradient,
) -> Result<(), SettingError> {
    let Some(c) = compression else {
        return Ok(());
    };
    if let (Err(e), AverageCompression::Lossy { spec, .. }) = (c.validate(), c) {
        return Err(match e {
            CodecError::ZeroChunk | CodecError::ChunkTooLarge { .. } => {
                bad("average-compression-chunk", spec.chunk, e)
            }
            e => bad("average-compression", spec.codec, e),
        });
    }
    if reduce == PseudoGradient::DeltaOfMean {
        return Err(bad(
            "average-compression",
            AverageCompressionKind::from(compression),
            "`none` with `delta-of-mean` (`slowmo`'s only reduction): half precision and the \
             lossy codecs are for the pseudo-gradients θ − x_r that `mean-of-deltas` sends, not \
             for the parameters",
        ));
    }
    Ok(())
}

/// The outer optimizer with its defaults, each value checked by the averagers' own rules.
fn optimizer(kind: AlgorithmKind, o: &OuterOptions) -> Result<OuterOptimizer, SettingError> {
    let lib = |setting: &'static str, value: String, optimizer: OuterOptimizer| {
        optimizer
            .validate()
            .map_err(|e| bad(setting, value, e.to_string()))
    };
    if kind == AlgorithmKind::Slowmo {
        let lr = o.lr.unwrap_or(1.0);
        let momentum = o.momentum.unwrap_or(0.5);
        lib(
            "outer-lr",
            lr.to_string(),
            OuterOptimizer::SlowMo { lr, momentum: 0.0 },
        )?;
        lib(
            "outer-momentum",
            momentum.to_string(),
            OuterOptimizer::SlowMo { lr: 1.0, momentum },
        )?;
        if o.nesterov == Some(true) {
            return Err(bad(
                "outer-nesterov",
                true,
                "unset or false: SlowMo's slow step is heavy-ball momentum (fairscale); use \
                 `diloco` for Nesterov",
            ));
        }
        return Ok(OuterOptimizer::SlowMo { lr, momentum });
    }
    let base = OuterSgdConfig::diloco();
    let lr = o.lr.unwrap_or(base.lr);
    let momentum = o.momentum.unwrap_or(base.momentum);
    let nesterov = o.nesterov.unwrap_or(momentum > 0.0);
    lib("outer-lr", lr.to_string(), OuterSgdConfig::sgd(lr).into())?;
    lib(
        "outer-momentum",
        momentum.to_string(),
        OuterSgdConfig::sgd(0.0).with_momentum(momentum).into(),
    )?;
    let config = OuterSgdConfig::sgd(lr)
        .with_momentum(momentum)
        .with_nesterov(nesterov);
    lib("outer-nesterov", nesterov.to_string(), config.into())?;
    Ok(config.into())
}

/// Streaming DiLoCo's settings, checked by the averagers' rules (torchft's, in its order);
/// `None` for the other outer algorithms, which refuse them.
fn streaming(
    kind: AlgorithmKind,
    period: u64,
    levels: &[Level],
    reduce: PseudoGradient,
    o: &OuterOptions,
) -> Result<Option<StreamingConfig>, SettingError> {
    if !AlgorithmSetting::Fragments.applies_to(kind) {
        let given = match (o.fragments, o.fragment_sync_delay, o.fragment_alpha) {
            (Some(f), _, _) => Some(("fragments", f.to_string())),
            (None, Some(d), _) => Some(("fragment-sync-delay", d.to_string())),
            (None, None, Some(a)) => Some(("fragment-alpha", a.to_string())),
            (None, None, None) => None,
        };
        return match given {
            Some((setting, value)) => Err(bad(
                setting,
                value,
                format!(
                    "unset: fragments, delays and mixing are Streaming DiLoCo's (`algorithm = \
                     \"streaming-diloco\"`); `{}` syncs all parameters at once",
                    kind.name()
                ),
            )),
            None => Ok(None),
        };
    }
    let (f, tau, alpha) = (
        o.fragments.unwrap_or(2),
        o.fragment_sync_delay.unwrap_or(0),
        o.fragment_alpha.unwrap_or(0.0),
    );
    if reduce == PseudoGradient::DeltaOfMean {
        return Err(bad(
            "outer-reduce",
            "delta-of-mean",
            "`mean-of-deltas` (or unset) with `streaming-diloco`: Streaming DiLoCo averages the \
             fragments' pseudo-gradients (torchft)",
        ));
    }
    if !levels.is_empty() {
        return Err(bad(
            "levels",
            format!("{:?}", Levels::from(levels.to_vec()).to_string()),
            "\"\" with `streaming-diloco`: Streaming DiLoCo has its own schedule of fragments",
        ));
    }
    let check = |setting: &'static str, value: String, config: StreamingConfig| {
        config
            .validate()
            .map(|_| ())
            .map_err(|e| bad(setting, value, e.to_string()))
    };
    // The fragments take turns over `period` local steps, so they must divide it (torchft's
    // own message for this says the reverse, and names `sync_every`, which is `period` here).
    if f > 0 && period >= f as u64 && !period.is_multiple_of(f as u64) {
        let divisors: Vec<String> = (2..=period.min(64))
            .filter(|d| period.is_multiple_of(*d))
            .take(6)
            .map(|d| d.to_string())
            .collect();
        let some = match divisors.is_empty() {
            true => String::new(),
            false => format!(" (e.g. {})", divisors.join(", ")),
        };
        return Err(bad(
            "fragments",
            f,
            format!(
                "a number of fragments that divides `period` = {period} (Streaming DiLoCo's \
                 sync_every: each fragment syncs every `period` steps, `period / fragments` \
                 after the one before){some}, or a `period` that {f} divides"
            ),
        ));
    }
    let base = StreamingConfig::new(period, f);
    check("fragments", f.to_string(), base)?;
    check("fragment-sync-delay", tau.to_string(), base.with_delay(tau))?;
    let config = base.with_delay(tau).with_alpha(alpha);
    check("fragment-alpha", alpha.to_string(), config)?;
    Ok(Some(config))
}

/// SlowMo's slow-step frequency (fairscale's default when unset); refused for the other outer
/// algorithms and with hierarchical levels (whose world level takes the slow step).
fn slowmo_frequency(
    kind: AlgorithmKind,
    period: u64,
    levels: &[Level],
    optimizer: &OuterOptimizer,
    o: &OuterOptions,
) -> Result<Option<u64>, SettingError> {
    if !AlgorithmSetting::SlowmoFrequency.applies_to(kind) {
        return match o.slowmo_frequency {
            Some(f) => Err(bad(
                "slowmo-frequency",
                f,
                format!(
                    "unset: the slow-step frequency is SlowMo's (`algorithm = \"slowmo\"`); `{}` \
                     takes its outer step every `period` steps",
                    kind.name()
                ),
            )),
            None => Ok(None),
        };
    }
    // `optimizer` gives `slowmo` SlowMo's slow step, always.
    let OuterOptimizer::SlowMo { lr, momentum } = *optimizer else {
        return Ok(None);
    };
    if !levels.is_empty() {
        return match o.slowmo_frequency {
            Some(f) => Err(bad(
                "slowmo-frequency",
                f,
                "unset with `levels`: the slow step runs at the whole-world level's averages",
            )),
            None => Ok(None),
        };
    }
    let frequency = o.slowmo_frequency.unwrap_or(SLOWMO_FREQUENCY);
    SlowMoConfig::new(period, frequency)
        .with_lr(lr)
        .with_momentum(momentum)
        .validate()
        .map_err(|e| bad("slowmo-frequency", frequency, e.to_string()))?;
    Ok(Some(frequency))
}
