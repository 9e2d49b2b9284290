//! `localsgd bench-step` (part of the binary): milliseconds per iteration of a bare burn loop —
//! forward, loss, backward, optimizer step, no pipeline and no communication — on the model,
//! data and batch size of a run's settings, timed by `localsgd_planner::measure::measure_step`
//! (its documentation says what is timed, and how with `--backend mpi` or `nccl`). This file
//! builds the model and the batches from the settings, and prints. The optimizer is the
//! trainer's (`run::optimizer`, fused in PyTorch's arithmetic); `--burn-optimizer` steps with
//! burn's own SGD / Adam / AdamW instead, the bare-burn baseline (bench/step-vs-pytorch).

use anyhow::{Context, Result};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, AdamWConfig, ModuleOptimizer, SgdConfig};
use localsgd_comm::Group;
use localsgd_models::pytorch::load_pytorch_safetensors;
use localsgd_planner::measure::{StepSettings, StepTiming, measure_step};
use localsgd_trainer::config::ConfigFlags;
use localsgd_trainer::config::{Backend, OptimizerKind, TrainConfig};
use localsgd_trainer::run;
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `localsgd bench-step`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchStepFlags {
    /// Timed iterations.
    #[arg(long, default_value_t = 100)]
    iters: usize,
    /// Untimed iterations first (allocator and caches warm up).
    #[arg(long, default_value_t = 10)]
    warmup_iters: usize,
    /// Start training again every this many iterations (warm-up ones included): the initial
    /// weights, a fresh optimizer, the first batch. The steps measured are then those of runs
    /// this long, as a benchmark's short runs take them; 0: never. A long run can reach
    /// subnormal floats, which x86 CPUs compute many times slower (book: Performance, "A
    /// finding: burn's step slows down in long runs").
    #[arg(long, default_value_t = 0)]
    restart_every: usize,
    /// Spin this many microseconds before each step, off the clock, as a rank waits in its
    /// collectives between two steps (0: none; at most 1,000,000). A step that follows a wait
    /// can be slower than one that follows another step
    /// (bench/results/2026-12-05-step-gap-sweep/).
    #[arg(long, default_value_t = 0)]
    gap_us: u64,
    /// Step with burn's own optimizer (`SgdConfig`, `AdamConfig`, `AdamWConfig`, configured
    /// to PyTorch's defaults as far as burn allows) instead of the trainer's fused one: the
    /// bare-burn baseline that bench/step-vs-pytorch compares the fused optimizer against.
    #[arg(long)]
    burn_optimizer: bool,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The model, data, batch size and optimizer settings (as for `train`).
    #[command(flatten)]
    config: ConfigFlags,
}

/// What one rank measured (for a process backend, the step times are each step's slowest rank's).
struct Measured {
    params: u64,
    timing: StepTiming,
}

impl BenchStepFlags {
    /// The loop the flags ask for, each checked.
    fn settings(&self) -> Result<StepSettings> {
        Ok(StepSettings::new(
            self.iters,
            self.warmup_iters,
            self.restart_every,
            Duration::from_micros(self.gap_us),
        )?)
    }
}

pub(crate) fn run(flags: &BenchStepFlags) -> Result<()> {
    let settings = flags.settings()?;
    let cfg = crate::launch::resolve(&flags.config)?;
    match cfg.backend {
        Backend::Threads => report(
            flags,
            &cfg,
            &measure(&settings, &cfg, flags.burn_optimizer, None)?,
        ),
        Backend::Mpi | Backend::Nccl => process(flags, &settings, &cfg),
    }
}

/// One rank of a process backend's world: measure between collectives; rank 0 reports.
#[cfg(any(feature = "mpi", feature = "nccl"))]
fn process(flags: &BenchStepFlags, settings: &StepSettings, cfg: &TrainConfig) -> Result<()> {
    let world = crate::process_world::ProcessWorld::start(
        cfg.backend,
        localsgd_comm::thread::DEFAULT_TIMEOUT,
    )?;
    let rank = world.group.rank();
    match measure(settings, cfg, flags.burn_optimizer, Some(&world.group)) {
        Ok(measured) => {
            let reported = if rank == 0 {
                report(flags, cfg, &measured)
            } else {
                Ok(())
            };
            world.finish();
            reported
        }
        Err(e) => {
            eprintln!("error on rank {rank}: {e:#}");
            world.abort(2);
        }
    }
}

#[cfg(not(any(feature = "mpi", feature = "nccl")))]
fn process(_flags: &BenchStepFlags, _settings: &StepSettings, cfg: &TrainConfig) -> Result<()> {
    // Unreachable in practice: `launch::resolve` refused the backend already.
    anyhow::bail!(
        "invalid setting `backend` = {}: not available in this binary",
        cfg.backend.name()
    )
}

/// The run's model and data, timed by the planner's bare loop; with `peers`, between steps
/// (outside the clock) a one-float all-reduce of the step's time (max), so that each step
/// counts its slowest rank. `burn_optimizer`: burn's own optimizer ([`burn_optimizer`]) instead
/// of the trainer's.
fn measure(
    settings: &StepSettings,
    cfg: &TrainConfig,
    burn_optimizer: bool,
    peers: Option<&Group>,
) -> Result<Measured> {
    if cfg.flush_denormals {
        localsgd_trainer::denormals::flush_on_compute_threads()?;
    }
    let data = run::load_data(cfg).context("loading the data set")?;
    // The configured device (`device`): with `peers`, this rank's place on its host.
    let device = match peers {
        Some(group) => run::compute_device(cfg.device, group)?,
        None => run::device_on_host(cfg.device, 0, 1)?,
    };
    let mcfg = run::model_config(cfg, &data.train)?;
    let model = match &cfg.init_weights {
        Some(path) => load_pytorch_safetensors(path, &mcfg, &device)?,
        None => mcfg.init(cfg.seed, &device)?,
    };
    let n = data.train.len();
    let per_epoch = (n / cfg.batch_size).max(1);
    // Consecutive batches through the whole training set, as training sees them (built by the
    // loop outside the clock).
    let batch = |step: usize| {
        let b = step % per_epoch;
        let idx: Vec<usize> = (0..cfg.batch_size)
            .map(|k| (b * cfg.batch_size + k) % n)
            .collect();
        data.train.batch_tensors(&idx, &device)
    };
    let optimizer = if burn_optimizer {
        self::burn_optimizer(cfg)
    } else {
        run::optimizer(cfg)?
    };
    let timing = measure_step(
        model,
        || optimizer.clone(),
        cfg.lr,
        localsgd_models::network::loss,
        batch,
        settings,
        peers,
    )?;
    Ok(Measured {
        params: mcfg.num_params(),
        timing,
    })
}

/// burn's own optimizer for the configuration, as the trainer configured it before its fused
/// optimizer (`--burn-optimizer`, a baseline only): SGD without dampening or Nesterov, Adam /
/// AdamW with epsilon 1e-8, burn's betas (0.9 / 0.999); weight decay coupled (L2 on the
/// gradient) for SGD and Adam, decoupled for AdamW (default 0.01).
fn burn_optimizer(cfg: &TrainConfig) -> ModuleOptimizer {
    let coupled = cfg
        .weight_decay
        .filter(|&wd| wd > 0.0)
        .map(|wd| WeightDecayConfig::new(wd as f32));
    match cfg.optimizer {
        OptimizerKind::Sgd => SgdConfig::new()
            .with_momentum((cfg.momentum > 0.0).then_some(MomentumConfig {
                momentum: cfg.momentum,
                dampening: 0.0,
                nesterov: false,
            }))
            .with_weight_decay(coupled)
            .init(),
        OptimizerKind::Adam => AdamConfig::new()
            .with_epsilon(1e-8)
            .with_weight_decay(coupled)
            .init(),
        OptimizerKind::Adamw => AdamWConfig::new()
            .with_epsilon(1e-8)
            .with_weight_decay(cfg.weight_decay.unwrap_or(0.01) as f32)
            .init(),
    }
}

/// Print the result and write its JSON (`--json`).
fn report(flags: &BenchStepFlags, cfg: &TrainConfig, m: &Measured) -> Result<()> {
    let params = m.params;
    let StepTiming {
        median_ms: median,
        mean_ms: mean,
        cycle_mean_ms: cycle_mean,
        copy_ms,
        ranks,
        last_loss,
    } = m.timing;
    // Gradient bytes per second of that handling: `localsgd plan --copy-gbps`.
    let copy_gbps = 4.0 * params as f64 / (copy_ms * 1e-3) / 1e9;
    let among = if ranks > 1 {
        format!(
            " (each step's slowest of {ranks} ranks, a one-float all-reduce between steps; step and all-reduce {cycle_mean:.3} ms)"
        )
    } else {
        String::new()
    };
    let runs = match flags.restart_every {
        0 => String::new(),
        every => format!(" (runs of {every} steps from the start)"),
    };
    let gap = match flags.gap_us {
        0 => String::new(),
        us => format!(" (each after {us} µs of spinning)"),
    };
    let optimizer_impl = if flags.burn_optimizer {
        "burn"
    } else {
        "fused"
    };
    let optimizer_name = match cfg.optimizer {
        OptimizerKind::Sgd => "sgd",
        OptimizerKind::Adam => "adam",
        OptimizerKind::Adamw => "adamw",
    };
    let optimizer = format!("{optimizer_name} ({optimizer_impl})");
    println!(
        "bare burn step: {params} parameters, batch {}: median {median:.3} ms, mean {mean:.3} ms over {} iterations{runs}{gap}{among}, optimizer {optimizer}, device {}; gradient flatten + one-rank mean + write-back {copy_ms:.3} ms ({copy_gbps:.2} GB/s of gradients, `plan --copy-gbps`)",
        cfg.batch_size,
        flags.iters,
        cfg.device.name()
    );
    if let Some(path) = &flags.json {
        let out = serde_json::json!({
            "params": params,
            "batch_size": cfg.batch_size,
            "hidden": cfg.hidden,
            "optimizer": optimizer_name,
            "optimizer_impl": optimizer_impl,
            "iters": flags.iters,
            "restart_every": flags.restart_every,
            "gap_us": flags.gap_us,
            "median_ms": median,
            "mean_ms": mean,
            "cycle_mean_ms": cycle_mean,
            "copy_ms": copy_ms,
            "copy_gbps": copy_gbps,
            "ranks": ranks,
            "device": cfg.device.name(),
            "rayon_num_threads": std::env::var("RAYON_NUM_THREADS").ok(),
            "omp_num_threads": std::env::var("OMP_NUM_THREADS").ok(),
            "last_loss": last_loss,
        });
        localsgd_pipeline::atomic::write_atomic(path, format!("{out:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
