//! The outer optimizer's settings as a user writes them ([`OuterOptions`], each unset one
//! taking its algorithm's default) resolved and checked into [`OuterSettings`]: the rules of
//! torch's SGD, fairscale's SlowMo and torchft's Streaming DiLoCo, each error named after the
//! setting as the `localsgd` binary's TOML file and flags spell it.

use localsgd_averagers::{
    Level, OuterOptimizer, OuterSgdConfig, PseudoGradient, SlowMoConfig, StreamingConfig,
};
use localsgd_comm::Precision;

use super::{AlgorithmKind, Levels, OuterSettings, SettingError};

/// fairscale's `slowmo_frequency` default: SlowMo's slow step every 48 steps.
pub const SLOWMO_FREQUENCY: u64 = 48;

/// The outer optimizer's settings as given (`None`: the algorithm's default). The binary's
/// `outer-lr`, `outer-momentum`, `outer-nesterov`, `outer-reduce`, `outer-compression`,
/// `fragments`, `fragment-sync-delay`, `fragment-alpha` and `slowmo-frequency` fill it;
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
    /// The pseudo-gradients' wire precision (default: full; needs mean of deltas).
    pub compression: Option<Precision>,
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

fn precision_name(p: Option<Precision>) -> String {
    match p {
        None => "none".into(),
        Some(p) => p.to_string(),
    }
}

impl OuterOptions {
    /// The given settings, by name and value, in the order they are reported.
    fn given(&self) -> [(&'static str, Option<String>); 9] {
        [
            ("outer-lr", self.lr.map(|v| v.to_string())),
            ("outer-momentum", self.momentum.map(|v| v.to_string())),
            ("outer-nesterov", self.nesterov.map(|v| v.to_string())),
            (
                "outer-reduce",
                self.reduce.map(|v| reduce_name(v).to_string()),
            ),
            (
                "outer-compression",
                self.compression.map(|c| precision_name(Some(c))),
            ),
            ("fragments", self.fragments.map(|v| v.to_string())),
            (
                "fragment-sync-delay",
                self.fragment_sync_delay.map(|v| v.to_string()),
            ),
            ("fragment-alpha", self.fragment_alpha.map(|v| v.to_string())),
            (
                "slowmo-frequency",
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
    /// defaults filled in and every rule checked (`None` for the algorithms without an outer
    /// optimizer, which take no outer setting: one given to them is refused, naming it).
    pub fn resolve(
        kind: AlgorithmKind,
        period: u64,
        levels: &[Level],
        options: &OuterOptions,
    ) -> Result<Option<Self>, SettingError> {
        if !kind.is_outer() {
            if let Some((setting, Some(value))) =
                options.given().into_iter().find(|g| g.1.is_some())
            {
                return Err(bad(
                    setting,
                    value,
                    format!(
                        "unset: outer settings apply to algorithms `diloco`, \
                         `streaming-diloco` and `slowmo`, not `{}`",
                        kind.name()
                    ),
                ));
            }
            return Ok(None);
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
        if let Some(p) = options.compression
            && reduce == PseudoGradient::DeltaOfMean
        {
            return Err(bad(
                "outer-compression",
                p,
                "`none` with `delta-of-mean` (`slowmo`'s only reduction): half precision is for \
                 the pseudo-gradients θ − x_r that `mean-of-deltas` sends, not for the \
                 parameters",
            ));
        }
        let streaming = streaming(kind, period, levels, reduce, options)?;
        let slowmo_frequency = slowmo_frequency(kind, period, levels, &optimizer, options)?;
        Ok(Some(OuterSettings {
            optimizer,
            reduce,
            compression: options.compression,
            streaming,
            slowmo_frequency,
        }))
    }
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
    if kind != AlgorithmKind::StreamingDiloco {
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
    let OuterOptimizer::SlowMo { lr, momentum } = *optimizer else {
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
