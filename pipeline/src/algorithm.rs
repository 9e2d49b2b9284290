//! Turning an algorithm choice into pipeline parts: a comm hook (with its bucket reducer) and a
//! model averager. Custom combinations can skip this and hand parts to the pipeline directly.

use crate::pipeline::error::PipelineError;
use crate::settings::{
    AlgorithmKind, AlgorithmSetting, AverageCompressionKind, GradientCompression, Levels,
    LossyExchange, OuterSettings, PipelineBuckets, SettingError, check_compression, rounding_name,
};
use localsgd_averagers::{
    AverageCompression, HierarchicalModelAverager, Level, ModelAverager, OuterAverager,
    OuterOptimizer, PeriodicModelAverager, SlowMoConfig, StreamingConfig, validate_levels,
};
use localsgd_comm::Group;
use localsgd_hooks::{
    AllReduceHook, BucketCaps, CommHook, CompressHook, GradientReducer, PostLocalSgdHook,
};

/// The algorithm part of a configuration, independent of the binary's other settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AlgorithmSpec {
    /// Which algorithm.
    pub kind: AlgorithmKind,
    /// Hook `start_local_sgd_iter` and averager `warmup_steps` (one knob; at most `i64::MAX`,
    /// the averagers' PyTorch-typed counter).
    pub warmup: u64,
    /// Averaging period (`None`: not provided; an error for post-local SGD and local SGD).
    pub period: Option<u64>,
    /// Overlap delay of periodic averaging (0: blocking).
    pub overlap: u64,
    /// Hierarchical levels.
    pub levels: Vec<Level>,
    /// Post-warmup gradient all-reduce subgroup size; `None`: the intra-node group.
    pub subgroup_size: Option<usize>,
    /// PyTorch's `post_local_gradient_allreduce`.
    pub post_local_allreduce: bool,
    /// Pipelined gradient sync (same numbers; not part of the identity).
    pub pipeline_buckets: PipelineBuckets,
    /// Bucket caps.
    pub caps: BucketCaps,
    /// Compression around the hook.
    pub compression: GradientCompression,
    /// The outer optimizer, pseudo-gradient reduction and compression (`diloco`,
    /// `streaming-diloco`, `slowmo`); for `local-sgd`, `post-local-sgd` and `hierarchical`
    /// [`OuterSettings::averaging`] to compress their world averages, else `None`; `None` for
    /// `ddp`.
    pub outer: Option<OuterSettings>,
}

impl AlgorithmSpec {
    /// DDP: every gradient all-reduced every step, no averaging (PyTorch's
    /// `DistributedDataParallel`).
    pub fn ddp() -> Self {
        Self::default()
    }

    /// Local SGD: no gradient communication; the models averaged every `period` steps.
    pub fn local_sgd(period: u64) -> Self {
        Self {
            kind: AlgorithmKind::LocalSgd,
            period: Some(period),
            ..Self::default()
        }
    }

    /// Post-local SGD: gradient all-reduce for `warmup` steps, then local steps with the
    /// models averaged every `period` steps (Lightning's `DDPStrategy(ddp_comm_state=
    /// PostLocalSGDState(start_localSGD_iter=warmup, ..), model_averaging_period=period)`).
    pub fn post_local_sgd(warmup: u64, period: u64) -> Self {
        Self {
            kind: AlgorithmKind::PostLocalSgd,
            warmup,
            period: Some(period),
            ..Self::default()
        }
    }

    /// Hierarchical averaging after a post-local SGD warmup: each level averages its groups of
    /// `group_size` ranks every `period` steps (e.g. `"2:2,4:4".parse()?`).
    pub fn hierarchical(warmup: u64, levels: Levels) -> Self {
        Self {
            kind: AlgorithmKind::Hierarchical,
            warmup,
            levels: levels.0,
            ..Self::default()
        }
    }

    /// DiLoCo: every `period` local steps an outer Nesterov SGD step (lr 0.7, momentum 0.9,
    /// the paper's, OpenDiLoCo's and torchft's) on the global model, with the mean of the
    /// replicas' displacements as gradient.
    pub fn diloco(period: u64) -> Self {
        Self {
            kind: AlgorithmKind::Diloco,
            period: Some(period),
            outer: Some(OuterSettings::diloco()),
            ..Self::default()
        }
    }

    /// Streaming DiLoCo (torchft's `DiLoCo` with fragments): DiLoCo's outer step taken by
    /// `fragments` fragments in turn, one every `period / fragments` local steps, no delay and
    /// no mixing (set them in `outer.streaming`).
    pub fn streaming_diloco(period: u64, fragments: usize) -> Self {
        let mut outer = OuterSettings::diloco();
        outer.streaming = Some(StreamingConfig::new(period, fragments));
        Self {
            kind: AlgorithmKind::StreamingDiloco,
            period: Some(period),
            outer: Some(outer),
            ..Self::default()
        }
    }

    /// SlowMo (fairscale's `SlowMoDistributedDataParallel` arithmetic, slow learning rate 1,
    /// slow momentum 0.5): the models averaged every `localsgd_frequency` local steps, the
    /// slow momentum step every `slowmo_frequency` (fairscale's defaults: 3 and 48).
    pub fn slowmo(localsgd_frequency: u64, slowmo_frequency: u64) -> Self {
        Self {
            kind: AlgorithmKind::Slowmo,
            period: Some(localsgd_frequency),
            outer: Some(OuterSettings::slowmo(slowmo_frequency)),
            ..Self::default()
        }
    }

    /// `kind` averaging on one `period` after `warmup` synchronous steps, as a program with a
    /// `--algorithm` and a `--period` flag builds it: hierarchical averaging on
    /// [`default_levels`]`(workers, period)`, Streaming DiLoCo with 2 fragments, SlowMo with
    /// fairscale's slow-step frequency ([`SLOWMO_FREQUENCY`](crate::settings::SLOWMO_FREQUENCY));
    /// DDP takes neither a period nor a warmup.
    pub fn of(kind: AlgorithmKind, warmup: u64, period: u64, workers: usize) -> Self {
        let spec = match kind {
            AlgorithmKind::Ddp => return Self::ddp(),
            AlgorithmKind::LocalSgd => Self::local_sgd(period),
            AlgorithmKind::PostLocalSgd => Self::post_local_sgd(warmup, period),
            AlgorithmKind::Hierarchical => {
                Self::hierarchical(warmup, Levels::from(default_levels(workers, period)))
            }
            AlgorithmKind::Diloco => Self::diloco(period),
            AlgorithmKind::StreamingDiloco => Self::streaming_diloco(period, 2),
            AlgorithmKind::Slowmo => Self::slowmo(period, crate::settings::SLOWMO_FREQUENCY),
        };
        spec.with_warmup(warmup)
    }

    /// These settings with `warmup` synchronous steps first (the post-local SGD hook's
    /// `start_localSGD_iter`, the averagers' `warmup_steps`).
    pub fn with_warmup(mut self, warmup: u64) -> Self {
        self.warmup = warmup;
        self
    }

    /// Check every rule these settings must follow on `world` ranks, before any rank
    /// communicates: the one place the algorithm rules live (the `localsgd` binary's
    /// configuration and the burn-train strategy call it). The error names the setting as the
    /// binary's TOML file and flags do. The outer optimizer's own settings are checked when
    /// they are resolved into [`OuterSettings`].
    pub fn validate(&self, world: usize) -> Result<(), SettingError> {
        if i64::try_from(self.warmup).is_err() {
            return Err(SettingError::new(
                "warmup",
                self.warmup,
                format!("at most {} (PyTorch's step counter is an i64)", i64::MAX),
            ));
        }
        let averages = matches!(
            self.kind,
            AlgorithmKind::LocalSgd | AlgorithmKind::PostLocalSgd
        );
        if self.kind.is_outer() && self.outer.is_none() {
            return Err(SettingError::new(
                "outer",
                "unset",
                format!(
                    "`{}` takes outer-optimizer steps: give its outer settings (e.g. \
                     `AlgorithmSpec::{}(period)` fills in the defaults)",
                    self.kind.name(),
                    match self.kind {
                        AlgorithmKind::StreamingDiloco => "streaming_diloco",
                        AlgorithmKind::Slowmo => "slowmo",
                        _ => "diloco",
                    }
                ),
            ));
        }
        // Outer settings on an averaging algorithm: only its averages' wire format.
        if let (false, Some(o)) = (self.kind.is_outer(), &self.outer) {
            let averages = AlgorithmSetting::AverageCompression.applies_to(self.kind);
            let compression = AverageCompressionKind::from(o.compression).to_string();
            match (averages, o.compression) {
                (true, Some(c)) if *o == OuterSettings::averaging(c) => {}
                (true, _) => {
                    return Err(SettingError::new(
                        "outer",
                        format!("{:?}", o.optimizer),
                        format!(
                            "`OuterSettings::averaging(compression)` or unset: `{}` averages \
                             models with no outer optimizer; it takes only the averages' wire \
                             format",
                            self.kind.name()
                        ),
                    ));
                }
                (false, Some(c)) if *o == OuterSettings::averaging(c) => {
                    return Err(SettingError::new(
                        "average-compression",
                        compression,
                        format!(
                            "unset: `{}` averages no models (outer settings apply to `diloco`, \
                             `streaming-diloco` and `slowmo`, and `average-compression` to the \
                             averages of `local-sgd`, `post-local-sgd` and `hierarchical`)",
                            self.kind.name()
                        ),
                    ));
                }
                (false, _) => {
                    return Err(SettingError::new(
                        "outer",
                        format!("{:?}", o.optimizer),
                        format!(
                            "unset: `{}` takes no outer optimizer (`diloco`, \
                             `streaming-diloco` and `slowmo` do)",
                            self.kind.name()
                        ),
                    ));
                }
            }
            // (Hierarchical averaging refuses any overlap below, compressed or not.)
            if self.overlap > 0 && self.kind != AlgorithmKind::Hierarchical {
                return Err(SettingError::new(
                    "overlap",
                    self.overlap,
                    format!(
                        "0 with `average-compression` = {compression}: a compressed average is \
                         applied at its own step (its delta is measured from the last average)"
                    ),
                ));
            }
        }
        // Settings that would do nothing for this algorithm are refused, not ignored.
        if let Some(p) = self.period
            && !AlgorithmSetting::Period.applies_to(self.kind)
        {
            return Err(SettingError::new(
                "period",
                p,
                format!(
                    "unset: `{}` {}",
                    self.kind.name(),
                    if self.kind == AlgorithmKind::Ddp {
                        "all-reduces the gradients every step and never averages models"
                    } else {
                        "averages on the periods of its `levels`"
                    }
                ),
            ));
        }
        if !self.levels.is_empty() && !AlgorithmSetting::Levels.applies_to(self.kind) {
            return Err(SettingError::new(
                "levels",
                format!("{:?}", Levels::from(self.levels.clone()).to_string()),
                format!(
                    "\"\": levels are hierarchical averaging's (`hierarchical`, and the lower \
                     levels of `diloco` and `slowmo`); `{}` {}",
                    self.kind.name(),
                    match self.kind {
                        AlgorithmKind::Ddp => "never averages models",
                        AlgorithmKind::StreamingDiloco => "has its own schedule of fragments",
                        _ => "averages the whole world every `period` steps",
                    }
                ),
            ));
        }
        let outer_levels = self.kind.is_outer() && !self.levels.is_empty();
        let needs_period = averages || (self.kind.is_outer() && !outer_levels);
        let period = match self.period {
            Some(0) if needs_period => {
                return Err(SettingError::new(
                    "period",
                    0,
                    "period must be positive (1 or more)",
                ));
            }
            None if needs_period => {
                // Lightning's rule, in Lightning's words (semantics §4).
                let lightning = match self.kind {
                    AlgorithmKind::PostLocalSgd => "Post-localSGD",
                    AlgorithmKind::LocalSgd => "Local SGD",
                    other => other.name(),
                };
                return Err(SettingError::new(
                    "period",
                    "unset",
                    format!(
                        "{lightning} algorithm is used, but model averaging period is not \
                         provided: `{}` averages the models every `period` steps (Lightning's \
                         `model_averaging_period`); set it to 1 or more",
                        self.kind.name()
                    ),
                ));
            }
            p => p.unwrap_or(0),
        };
        if self.overlap > 0 && !AlgorithmSetting::Overlap.applies_to(self.kind) {
            if self.kind.is_outer() {
                return Err(SettingError::new(
                    "overlap",
                    self.overlap,
                    format!(
                        "`0`: `{}` takes its outer step on the synchronised average at the \
                         synchronisation step itself, so its averages cannot be overlapped",
                        self.kind.name()
                    ),
                ));
            }
            return Err(SettingError::new(
                "overlap",
                self.overlap,
                format!(
                    "`0`: overlapped averaging works with the periodic averaging of `local-sgd` \
                     and `post-local-sgd`; algorithm `{}` {}",
                    self.kind.name(),
                    if self.kind == AlgorithmKind::Ddp {
                        "does not average models"
                    } else {
                        "does not support it yet"
                    }
                ),
            ));
        }
        if averages && self.overlap > period {
            return Err(SettingError::new(
                "overlap",
                self.overlap,
                format!(
                    "0 (blocking) to the period {period}: each average must be applied before \
                     the next starts"
                ),
            ));
        }
        if self.kind == AlgorithmKind::Hierarchical || outer_levels {
            validate_levels(&self.levels, world).map_err(|e| {
                SettingError::new(
                    "levels",
                    format!("{:?}", Levels::from(self.levels.clone()).to_string()),
                    format!("{e} ({world} workers)"),
                )
            })?;
        }
        if let Some(s) = self.subgroup_size
            && let Err(e) = localsgd_comm::validate_subgroup_size(s, world)
        {
            return Err(SettingError::new(
                "subgroup-size",
                s,
                format!("{e} ({world} workers)"),
            ));
        }
        // Settings built in code skip `OuterSettings::resolve`: its codec rules again.
        if let Some(o) = &self.outer {
            check_compression(o.compression, o.reduce)?;
        }
        if self.compression != GradientCompression::None
            && !AlgorithmSetting::Compression.applies_to(self.kind)
        {
            return Err(SettingError::new(
                "compression",
                format!("{:?}", self.compression).to_lowercase(),
                "\"none\": local-sgd communicates no gradients to compress",
            ));
        }
        Ok(())
    }

    /// The same settings on `world` ranks: the last level of hierarchical averaging (the whole
    /// world) takes `world` as its group size; the lower levels and every other setting stay
    /// as they are ([`validate`](Self::validate) says whether they still fit). What the
    /// survivors of a rank failure run, and what a checkpoint of another number of ranks was
    /// written with (book: Fault tolerance).
    pub fn for_world(&self, world: usize) -> Self {
        let mut spec = self.clone();
        if let Some(last) = spec.levels.last_mut() {
            last.group_size = world;
        }
        spec
    }

    /// A one-line description, stored in checkpoints to refuse resuming with other settings.
    pub fn identity(&self) -> String {
        // Overlap appears only when on, so checkpoints of blocking runs keep their identity.
        let overlap = match self.overlap {
            0 => String::new(),
            d => format!(" overlap={d}"),
        };
        let outer = match &self.outer {
            None => String::new(),
            Some(o) => {
                // Half precision as checkpoints have always recorded it (`average_compression=fp16`);
                // a lossy codec with its chunk, rounding and error feedback (not the stochastic
                // rounding's seed: the run's seed, which the identity leaves out).
                let compression = match o.compression {
                    Some(AverageCompression::Half(p)) => format!(" average_compression={p}"),
                    // The exchange only when set: `auto` is what checkpoints before it did
                    // on 2 ranks.
                    Some(AverageCompression::Lossy {
                        spec,
                        error_feedback,
                        exchange,
                    }) => format!(
                        " average_compression={} average_compression_chunk={} average_rounding={} \
                         average_error_feedback={error_feedback}{}",
                        spec.codec,
                        spec.chunk,
                        rounding_name(spec.rounding),
                        match exchange {
                            LossyExchange::Auto => String::new(),
                            e => format!(" average_exchange={e}"),
                        }
                    ),
                    None => String::new(),
                };
                let streaming = match &o.streaming {
                    Some(s) => format!(
                        " fragments={} fragment_sync_delay={} fragment_alpha={}",
                        s.fragments, s.delay, s.alpha
                    ),
                    None => String::new(),
                };
                // Only a slow-step frequency other than the period changes the schedule (and
                // only it is written, so checkpoints of earlier runs keep their identity).
                let slowmo_frequency = match o.slowmo_frequency {
                    Some(f) if Some(f) != self.period => format!(" slowmo_frequency={f}"),
                    _ => String::new(),
                };
                format!(
                    " outer={:?} reduce={:?}{compression}{streaming}{slowmo_frequency}",
                    o.optimizer, o.reduce
                )
            }
        };
        format!(
            "algorithm={:?} warmup={} period={:?} levels={:?} subgroup_size={:?} post_local_allreduce={} compression={:?}{overlap}",
            self.kind,
            self.warmup,
            self.period,
            // The pairs as checkpoints have always recorded them: `[(2, 2), (4, 4)]`.
            self.levels
                .iter()
                .map(|l| (l.period, l.group_size))
                .collect::<Vec<_>>(),
            self.subgroup_size,
            self.post_local_allreduce,
            self.compression
        ) + &outer
    }
}

impl Default for AlgorithmSpec {
    /// DDP with the binary's defaults for everything else: no warmup, no period, blocking
    /// averaging, no levels, the intra-node subgroup, no post-local gradient all-reduce,
    /// `PipelineBuckets::Auto`, 1 MiB / 25 MiB buckets (PyTorch's), no compression.
    fn default() -> Self {
        Self {
            kind: AlgorithmKind::Ddp,
            warmup: 0,
            period: None,
            overlap: 0,
            levels: Vec::new(),
            subgroup_size: None,
            post_local_allreduce: false,
            pipeline_buckets: PipelineBuckets::Auto,
            caps: BucketCaps::default(),
            compression: GradientCompression::None,
            outer: None,
        }
    }
}

/// The parts an algorithm adds to the pipeline.
pub struct AlgorithmParts {
    /// Gradient hook and reducer (none for local SGD).
    pub sync: Option<(Box<dyn CommHook>, GradientReducer)>,
    /// Model averager (none for DDP).
    pub averager: Option<Box<dyn ModelAverager>>,
}

fn wrap(hook: Box<dyn CommHook>, compression: GradientCompression) -> Box<dyn CommHook> {
    match compression.precision() {
        None => hook,
        Some(p) => Box::new(CompressHook::new(p, hook)),
    }
}

/// Build the hook and averager for `spec` on `world`, after checking it
/// ([`AlgorithmSpec::validate`]; a broken rule is [`PipelineError::Config`] naming the setting).
/// Collective: every rank calls it with the same spec (subgroups are created here).
pub fn build(spec: &AlgorithmSpec, world: &Group) -> Result<AlgorithmParts, PipelineError> {
    spec.validate(world.size())
        .map_err(|e| PipelineError::Config(e.to_string()))?;
    let warmup_iters = spec.warmup;
    // The averagers take PyTorch's signed `warmup_steps`; `validate` bounded it by `i64::MAX`.
    let warmup_steps = i64::try_from(spec.warmup).unwrap_or(i64::MAX);
    // `validate` refused a missing period wherever one is needed; a 0 left here would be the
    // averager's own error, never a silent schedule.
    let period = spec.period.unwrap_or(0);
    let pipelined = match spec.pipeline_buckets {
        PipelineBuckets::On => true,
        PipelineBuckets::Off => false,
        // Local SGD sends no gradients: nothing to decide, no collective.
        PipelineBuckets::Auto => spec.kind != AlgorithmKind::LocalSgd && pipelining_pays(world)?,
    };
    let reducer = || GradientReducer::new(spec.caps).pipelined(pipelined);
    let post_local_hook = || -> Result<Box<dyn CommHook>, PipelineError> {
        let subgroup = match spec.subgroup_size {
            Some(size) => {
                Some(
                    world
                        .new_subgroups(size)
                        .map_err(|source| PipelineError::Comm {
                            phase: "setup",
                            source,
                        })?,
                )
            }
            None => None,
        };
        Ok(wrap(
            Box::new(PostLocalSgdHook::new(
                world.clone(),
                subgroup,
                warmup_iters,
                spec.post_local_allreduce,
            )),
            spec.compression,
        ))
    };
    // An averaging algorithm's averages: plain, or with `average-compression` each rank's delta
    // from the last average sent compressed and applied as an outer SGD(lr 1) step on the same
    // schedule (semantics §11.2). θ, the last average, is the model where the local steps
    // start: after the warmup's gradient all-reduces, or (local SGD, whose replicas step alone
    // from the first step) the model every rank starts from.
    let local_start = match spec.kind {
        AlgorithmKind::LocalSgd => 0,
        _ => warmup_iters,
    };
    let averager =
        |schedule: Box<dyn ModelAverager>| -> Result<Box<dyn ModelAverager>, PipelineError> {
            Ok(match spec.outer {
                Some(o) => Box::new(
                    OuterAverager::new(schedule, o.optimizer, world.clone())?
                        .with_local_start(local_start)
                        .with_reduce(o.reduce)?
                        .with_compression(o.compression)?,
                ),
                None => schedule,
            })
        };
    let periodic = |period: u64| -> Result<Box<dyn ModelAverager>, PipelineError> {
        averager(Box::new(
            PeriodicModelAverager::new(period, warmup_steps, world.clone())?
                .with_overlap(spec.overlap)?,
        ))
    };
    Ok(match spec.kind {
        AlgorithmKind::Ddp => AlgorithmParts {
            sync: Some((
                wrap(
                    Box::new(AllReduceHook::new(world.clone())),
                    spec.compression,
                ),
                reducer(),
            )),
            averager: None,
        },
        AlgorithmKind::LocalSgd => AlgorithmParts {
            sync: None,
            averager: Some(periodic(period)?),
        },
        AlgorithmKind::PostLocalSgd => AlgorithmParts {
            sync: Some((post_local_hook()?, reducer())),
            averager: Some(periodic(period)?),
        },
        AlgorithmKind::Hierarchical => AlgorithmParts {
            sync: Some((post_local_hook()?, reducer())),
            averager: Some(averager(Box::new(HierarchicalModelAverager::new(
                &spec.levels,
                warmup_steps,
                world.clone(),
            )?))?),
        },
        AlgorithmKind::Diloco | AlgorithmKind::StreamingDiloco | AlgorithmKind::Slowmo => {
            let outer = spec.outer.ok_or_else(|| {
                PipelineError::Config(format!(
                    "algorithm `{}` needs its outer optimizer settings",
                    spec.kind.name()
                ))
            })?;
            // Without levels: sync after every `period` local steps (the cadence of the book's semantics §8.1).
            // With levels: the lower levels average plainly, the whole-world level steps.
            let averager = if let Some(streaming) = outer.streaming {
                // Streaming DiLoCo: `period` is its sync_every.
                let OuterOptimizer::Sgd(sgd) = outer.optimizer else {
                    return Err(PipelineError::Config(
                        "Streaming DiLoCo takes an outer SGD, not SlowMo's slow step".into(),
                    ));
                };
                OuterAverager::streaming(streaming, warmup_iters, sgd, world.clone())?
            } else if let (OuterOptimizer::SlowMo { lr, momentum }, Some(frequency), true) = (
                outer.optimizer,
                outer.slowmo_frequency.filter(|&f| f != period),
                spec.levels.is_empty(),
            ) {
                // A slow step every `frequency` steps, plain averages every `period` between.
                let config = SlowMoConfig::new(period, frequency)
                    .with_lr(lr)
                    .with_momentum(momentum);
                OuterAverager::slowmo(config, warmup_iters, world.clone())?
            } else if spec.levels.is_empty() {
                OuterAverager::periodic(period, warmup_iters, outer.optimizer, world.clone())?
            } else {
                let schedule =
                    HierarchicalModelAverager::new(&spec.levels, warmup_steps, world.clone())?;
                OuterAverager::new(Box::new(schedule), outer.optimizer, world.clone())?
                    .with_local_start(warmup_iters)
            }
            .with_reduce(outer.reduce)?
            .with_compression(outer.compression)?;
            AlgorithmParts {
                sync: Some((post_local_hook()?, reducer())),
                averager: Some(Box::new(averager)),
            }
        }
    })
}

/// `pipeline-buckets = "auto"`: whether `world`'s ranks run on more than one host, none of them
/// on a host with more ranks than cores
/// ([`ranks_share_cores`](localsgd_comm::ProcessGroup::ranks_share_cores)). Collective (one
/// all-gather of two words per rank) except on the thread backend, whose ranks are one process.
///
/// Where ranks share cores the pipelined sync's helper thread waits for its turn on a core
/// between the polls that move each piece, and blocking buckets are faster
/// (`bench/results/2026-12-04-blocking-pieces/`, run 5).
fn pipelining_pays(world: &Group) -> Result<bool, PipelineError> {
    if world.size() < 2 || world.backend() == "threads" {
        return Ok(false);
    }
    let ranks = world
        .all_gather_u64(&[world.host_id(), u64::from(world.ranks_share_cores())])
        .map_err(|source| PipelineError::Comm {
            phase: "setup",
            source,
        })?;
    Ok(pipelines(&ranks))
}

/// [`pipelining_pays`] from every rank's `[host id, shares cores (0 or 1)]`, concatenated: more
/// than one host, and no rank that shares cores. The same answer on every rank.
fn pipelines(ranks: &[u64]) -> bool {
    let mut ranks = ranks.chunks_exact(2);
    let Some(first) = ranks.next() else {
        return false;
    };
    let mut spans = false;
    for rank in std::iter::once(first).chain(ranks) {
        if rank[1] != 0 {
            return false;
        }
        spans |= rank[0] != first[0];
    }
    spans
}

/// Default levels for `compare` when none are configured: pairs... halves every `period` steps,
/// the whole world every `2 * period`.
pub fn default_levels(workers: usize, period: u64) -> Vec<Level> {
    let pairs = if workers >= 2 && workers.is_multiple_of(2) {
        vec![(period, workers / 2), (2 * period, workers)]
    } else {
        vec![(period, workers)]
    };
    pairs.into_iter().map(Level::from).collect()
}

#[cfg(test)]
mod tests {
    use super::{AlgorithmSpec, pipelines};
    use crate::settings::{
        AlgorithmKind, AverageCompressionKind, LossyExchange, OuterOptions, OuterSettings,
    };
    use localsgd_averagers::{AverageCompression, PseudoGradient};
    use localsgd_comm::Precision;
    use localsgd_comm::codec::Rounding;

    fn diloco_with(options: OuterOptions) -> Result<AlgorithmSpec, String> {
        let outer = OuterSettings::resolve(AlgorithmKind::Diloco, 50, &[], &options)
            .map_err(|e| e.to_string())?;
        Ok(AlgorithmSpec {
            outer,
            ..AlgorithmSpec::diloco(50)
        })
    }

    fn kind(text: &str) -> Option<AverageCompression> {
        text.parse::<AverageCompressionKind>()
            .unwrap()
            .compression()
    }

    #[test]
    fn half_precision_keeps_the_identity_checkpoints_have_always_recorded() {
        let base = "algorithm=Diloco warmup=0 period=Some(50) levels=[] subgroup_size=None \
                    post_local_allreduce=false compression=None outer=Sgd(OuterSgdConfig { lr: \
                    0.7, momentum: 0.9, dampening: 0.0, nesterov: true, weight_decay: 0.0 }) \
                    reduce=MeanOfDeltas";
        for (text, suffix) in [
            ("none", ""),
            ("fp16", " average_compression=fp16"),
            ("bf16", " average_compression=bf16"),
        ] {
            let spec = diloco_with(OuterOptions {
                compression: kind(text),
                ..OuterOptions::default()
            })
            .unwrap();
            assert_eq!(spec.identity(), format!("{base}{suffix}"), "{text}");
        }
    }

    #[test]
    fn a_lossy_codec_writes_its_chunk_rounding_and_error_feedback_into_the_identity() {
        let spec = diloco_with(OuterOptions {
            compression: kind("topk:0.01+int8"),
            ..OuterOptions::default()
        })
        .unwrap();
        assert!(
            spec.identity().ends_with(
                " average_compression=topk:0.01+int8 average_compression_chunk=1024 \
                 average_rounding=nearest average_error_feedback=true"
            ),
            "{}",
            spec.identity()
        );
        let spec = diloco_with(OuterOptions {
            compression: kind("int4"),
            compression_chunk: Some(64),
            rounding: Some(Rounding::Stochastic { seed: 7 }),
            error_feedback: Some(false),
            ..OuterOptions::default()
        })
        .unwrap();
        let Some(AverageCompression::Lossy {
            spec: codec,
            error_feedback,
            ..
        }) = spec.outer.unwrap().compression
        else {
            panic!("not lossy");
        };
        assert_eq!(
            (codec.chunk, codec.rounding, error_feedback),
            (64, Rounding::Stochastic { seed: 7 }, false)
        );
        // The seed is the run's, which the identity leaves out.
        assert!(
            spec.identity().ends_with(
                " average_compression=int4 average_compression_chunk=64 \
                 average_rounding=stochastic average_error_feedback=false"
            ),
            "{}",
            spec.identity()
        );
    }

    #[test]
    fn codec_settings_are_refused_where_they_would_do_nothing_or_cannot_work() {
        let err = |options: OuterOptions| diloco_with(options).unwrap_err();
        assert_eq!(
            err(OuterOptions {
                compression: kind("fp16"),
                error_feedback: Some(false),
                ..OuterOptions::default()
            }),
            "invalid setting `average-error-feedback` = false: unset with `average-compression` = \
             fp16: chunks, rounding, error feedback and the exchange are the lossy codecs' \
             (`int8`, `int4`, `topk:F`, `topk:F+int8`, `topk:F+int4`)"
        );
        assert_eq!(
            err(OuterOptions {
                compression: kind("bf16"),
                exchange: Some(LossyExchange::AllReduce),
                ..OuterOptions::default()
            }),
            "invalid setting `average-exchange` = all-reduce: unset with `average-compression` = \
             bf16: chunks, rounding, error feedback and the exchange are the lossy codecs' \
             (`int8`, `int4`, `topk:F`, `topk:F+int8`, `topk:F+int4`)"
        );
        assert!(
            err(OuterOptions {
                compression_chunk: Some(64),
                ..OuterOptions::default()
            })
            .starts_with("invalid setting `average-compression-chunk` = 64: unset with `average-compression` = none")
        );
        assert!(
            err(OuterOptions {
                compression: kind("topk:0.5"),
                rounding: Some(Rounding::Stochastic { seed: 0 }),
                ..OuterOptions::default()
            })
            .starts_with("invalid setting `average-rounding` = stochastic: `nearest` (or unset) with `average-compression` = topk:0.5")
        );
        assert_eq!(
            err(OuterOptions {
                compression: kind("int8"),
                compression_chunk: Some(0),
                ..OuterOptions::default()
            }),
            "invalid setting `average-compression-chunk` = 0: codec chunk 0 is invalid (valid: \
             chunk >= 1)"
        );
        assert!(
            err(OuterOptions {
                compression: kind("topk:0.1+int4"),
                compression_chunk: Some(65537),
                ..OuterOptions::default()
            })
            .contains(
                "`average-compression-chunk` = 65537: codec chunk 65537 is too large for topk"
            )
        );
        // 65536 is the largest top-k chunk; int8 takes any.
        diloco_with(OuterOptions {
            compression: kind("topk:0.1"),
            compression_chunk: Some(65536),
            ..OuterOptions::default()
        })
        .unwrap();
        diloco_with(OuterOptions {
            compression: kind("int8"),
            compression_chunk: Some(1 << 20),
            ..OuterOptions::default()
        })
        .unwrap();
        // SlowMo reduces the delta of the mean: nothing to compress, lossy or not.
        let slowmo = |c| {
            OuterSettings::resolve(
                AlgorithmKind::Slowmo,
                3,
                &[],
                &OuterOptions {
                    compression: kind(c),
                    ..OuterOptions::default()
                },
            )
            .unwrap_err()
            .to_string()
        };
        assert!(
            slowmo("topk:0.01+int4").starts_with(
                "invalid setting `average-compression` = topk:0.01+int4: `none` with `delta-of-mean`"
            ),
            "{}",
            slowmo("topk:0.01+int4")
        );
        assert!(slowmo("bf16").starts_with("invalid setting `average-compression` = bf16: "));
        // The averaging algorithms take the codec settings, by the same rules; DDP none.
        let averaging = |kind, options: OuterOptions| {
            OuterSettings::resolve(kind, 4, &[], &options).map_err(|e| e.to_string())
        };
        let err = averaging(
            AlgorithmKind::PostLocalSgd,
            OuterOptions {
                error_feedback: Some(true),
                ..OuterOptions::default()
            },
        )
        .unwrap_err();
        assert!(
            err.starts_with(
                "invalid setting `average-error-feedback` = true: unset with `average-compression` = none"
            ),
            "{err}"
        );
        let int4 = OuterOptions {
            compression: kind("int4"),
            compression_chunk: Some(64),
            ..OuterOptions::default()
        };
        for k in [
            AlgorithmKind::LocalSgd,
            AlgorithmKind::PostLocalSgd,
            AlgorithmKind::Hierarchical,
        ] {
            let Some(AverageCompression::Lossy {
                spec,
                error_feedback,
                ..
            }) = averaging(k, int4).unwrap().and_then(|o| o.compression)
            else {
                panic!("{k:?}: no lossy compression");
            };
            assert_eq!((spec.chunk, error_feedback), (64, true), "{k:?}");
        }
        assert_eq!(
            averaging(AlgorithmKind::PostLocalSgd, OuterOptions::default()),
            Ok(None)
        );
        let err = averaging(AlgorithmKind::Ddp, int4).unwrap_err();
        assert!(
            err.starts_with(
                "invalid setting `average-compression` = int4: unset: outer settings apply"
            ),
            "{err}"
        );
        let err = averaging(
            AlgorithmKind::Hierarchical,
            OuterOptions {
                momentum: Some(0.9),
                ..int4
            },
        )
        .unwrap_err();
        assert!(
            err.starts_with(
                "invalid setting `outer-momentum` = 0.9: unset: `hierarchical` averages models \
                 with no outer optimizer"
            ),
            "{err}"
        );
    }

    #[test]
    fn averages_with_compression_are_checked_by_validate() {
        let mut spec = AlgorithmSpec::post_local_sgd(0, 4);
        spec.outer = Some(OuterSettings::averaging(AverageCompression::lossy(
            "int8".parse().unwrap(),
        )));
        assert_eq!(spec.validate(2), Ok(()));
        spec.overlap = 2;
        assert!(
            spec.validate(2)
                .unwrap_err()
                .to_string()
                .starts_with("invalid setting `overlap` = 2: 0 with `average-compression` = int8"),
        );
        spec.overlap = 0;
        spec.outer = Some(OuterSettings::diloco());
        assert!(
            spec.validate(2)
                .unwrap_err()
                .to_string()
                .contains("`OuterSettings::averaging(compression)` or unset"),
        );
        let mut ddp = AlgorithmSpec::ddp();
        ddp.outer = Some(OuterSettings::averaging(AverageCompression::Half(
            localsgd_comm::Precision::Fp16,
        )));
        assert!(ddp.validate(2).unwrap_err().to_string().starts_with(
            "invalid setting `average-compression` = fp16: unset: `ddp` averages no models"
        ));
        ddp.outer = Some(OuterSettings::diloco());
        let err = ddp.validate(2).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid setting `outer` = Sgd(")
                && err.contains("takes no outer optimizer"),
            "{err}"
        );
    }

    #[test]
    fn settings_built_in_code_are_checked_by_validate() {
        let mut spec = AlgorithmSpec::diloco(8);
        let outer = spec.outer.as_mut().unwrap();
        outer.compression = Some(AverageCompression::lossy("int8".parse().unwrap()));
        spec.validate(2).unwrap();
        let Some(AverageCompression::Lossy { spec: codec, .. }) =
            &mut outer_mut(&mut spec).compression
        else {
            unreachable!()
        };
        codec.chunk = 0;
        assert!(
            spec.validate(2)
                .unwrap_err()
                .to_string()
                .starts_with("invalid setting `average-compression-chunk` = 0: ")
        );
        let mut slowmo = AlgorithmSpec::slowmo(3, 48);
        outer_mut(&mut slowmo).compression = Some(Precision::Fp16.into());
        assert_eq!(outer_mut(&mut slowmo).reduce, PseudoGradient::DeltaOfMean);
        assert!(slowmo.validate(2).unwrap_err().to_string().starts_with(
            "invalid setting `average-compression` = fp16: `none` with `delta-of-mean`"
        ));
    }

    fn outer_mut(spec: &mut AlgorithmSpec) -> &mut OuterSettings {
        spec.outer.as_mut().unwrap()
    }

    #[test]
    fn average_compression_parses_names_and_codecs_and_names_bad_values() {
        for text in [
            "none",
            "fp16",
            "bf16",
            "int8",
            "int4",
            "topk:0.01",
            "topk:0.5+int8",
            "topk:1+int4",
        ] {
            let kind: AverageCompressionKind = text.parse().unwrap();
            assert_eq!(kind.to_string(), text);
            assert_eq!(AverageCompressionKind::from(kind.compression()), kind);
        }
        assert_eq!(kind("none"), None);
        assert_eq!(
            kind("bf16"),
            Some(AverageCompression::Half(Precision::Bf16))
        );
        assert_eq!(
            kind("int8"),
            Some(AverageCompression::lossy("int8".parse().unwrap()))
        );
        let err = |text: &str| {
            text.parse::<AverageCompressionKind>()
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("fp32"),
            "invalid setting `average-compression` = fp32: one of `none`, `fp16`, `bf16`, `int8`, \
             `int4`, `topk:F`, `topk:F+int8`, `topk:F+int4` (0 < F <= 1)"
        );
        assert_eq!(
            err("topk:1.5"),
            "invalid setting `average-compression` = topk:1.5: topk fraction 1.5 is outside (0, 1] \
             (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)"
        );
        assert!(err("topk:0.1+int2").contains("unknown topk quantizer \"int2\""));
    }

    #[test]
    fn auto_pipelines_across_hosts_unless_a_rank_shares_cores() {
        // [host id, shares cores] per rank.
        assert!(!pipelines(&[]));
        assert!(!pipelines(&[7, 0]));
        assert!(!pipelines(&[7, 0, 7, 0]), "one host");
        assert!(pipelines(&[7, 0, 9, 0]));
        assert!(pipelines(&[7, 0, 7, 0, 9, 0, 9, 0]));
        assert!(!pipelines(&[7, 0, 9, 1]), "the last rank shares cores");
        assert!(
            !pipelines(&[7, 1, 7, 1, 9, 0, 9, 0]),
            "one host oversubscribed"
        );
    }

    /// The survivors' settings: the whole-world level follows the world, nothing else moves;
    /// a lower level that no longer divides the world is refused by `validate`, naming it.
    #[test]
    fn for_world_resizes_the_whole_world_level_only() {
        let spec = AlgorithmSpec::hierarchical(2, "2:2,4:4".parse().unwrap());
        let three = spec.for_world(3);
        let pairs: Vec<(u64, usize)> = three
            .levels
            .iter()
            .map(|l| (l.period, l.group_size))
            .collect();
        assert_eq!(pairs, vec![(2, 2), (4, 3)]);
        assert_eq!(three.warmup, 2);
        let e = three.validate(3).unwrap_err().to_string();
        assert!(e.contains("levels"), "{e}");
        assert!(spec.for_world(6).validate(6).is_ok());
        let periodic = AlgorithmSpec::default();
        assert_eq!(periodic.for_world(3).identity(), periodic.identity());
    }
}
