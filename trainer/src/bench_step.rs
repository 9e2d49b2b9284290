//! `localsgd bench-step` (part of the binary): milliseconds per iteration of a bare burn loop —
//! forward, loss (read back, as the pipeline does), backward, optimizer step — on the model, data
//! and batch size of a run's settings, with no pipeline and no communication. It is the
//! compute term of `localsgd plan` and the "bare burn" column of the benchmark matrix.
//!
//! Apart from the step's clock it also times what a gradient all-reduce costs this rank besides
//! the wire: the gradients flattened into one buffer, averaged over a one-rank thread group
//! (the mean's division and the backend's own pass over the buffer) and written back — the
//! reducer's blocking path with nobody to wait for — as `copy_ms`: the per-byte cost term of
//! `localsgd plan` (`--copy-gbps`). (A one-rank DDP run no longer measures it: its mean is the
//! identity and skips all of this.)
//!
//! With `backend = "mpi"` (under `mpirun`) or `"nccl"`, every rank runs the same loop and joins
//! a one-float all-reduce between steps, outside the clock, as a training iteration's has-data
//! agreement sits between its steps; that all-reduce takes the maximum of the step's time over
//! the ranks, so the mean and median are over each step's slowest rank (as a synchronous
//! iteration waits for it). That is the compute of a step as it runs between collectives, where
//! the network stack and the collective's progress engine take turns with it on the cores. The
//! loop's cycle — step and all-reduce together, on this rank's clock — is reported apart
//! (`cycle_mean_ms`): less the slowest step, it is what one small collective costs between real
//! steps, including the wait for ranks the scheduler has not run yet when there are more ranks
//! than cores (`scripts/bench-matrix` feeds it to `localsgd plan --latency-us`). On
//! two network namespaces of a 2-core machine, a 4.8k-parameter MLP's step read 0.147-0.149 ms
//! this way, and training runs' own compute phases 0.12-0.18 ms in the same runs (0.20-0.25 ms
//! before gradients from a flat buffer stopped carrying autodiff).
//!
//! Steps back to back are the best case. `--gap-us` spins before each step, off the clock, as a
//! rank waits in its collectives between steps: on a 2-vCPU VM, with no network involved, the
//! Fashion-MNIST MLP's step read 0.91 ms back to back, 0.99 ms after 2 ms of spinning and
//! 1.81 ms after 20 ms (the book's Benchmarks chapter, "A step after a wait").

use anyhow::{Context, Result, bail};
use burn::optim::GradientsParams;
use burn::tensor::Device;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_grads, grads_from_flat};
use localsgd_comm::{Group, GroupExt, ReduceOp, ThreadWorld};
use localsgd_trainer::cli::ConfigFlags;
use localsgd_trainer::config::{Backend, TrainConfig};
use localsgd_trainer::init_weights::load_pytorch_safetensors;
use localsgd_trainer::run;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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
    /// subnormal floats, which x86 CPUs compute many times slower: on an Intel Xeon VM the
    /// Fashion-MNIST MLP's step read 0.88 ms over 200 iterations and 1.98 ms over 3,000.
    #[arg(long, default_value_t = 0)]
    restart_every: usize,
    /// Spin this many microseconds before each step, off the clock, as a rank waits in its
    /// collectives between two steps (0: none; at most 1,000,000). A step that follows a wait
    /// can be slower than one that follows another step: on a 2-vCPU VM the Fashion-MNIST
    /// MLP's step read 0.91 ms back to back and 1.81 ms after 20 ms of spinning.
    #[arg(long, default_value_t = 0)]
    gap_us: u64,
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
    median: f64,
    mean: f64,
    /// Mean of step plus the between-steps all-reduce on this rank's clock (the step alone
    /// with one rank).
    cycle_mean: f64,
    copy_ms: f64,
    ranks: usize,
    /// The loss of the last timed step, as read back (a check of what was trained).
    last_loss: f32,
}

pub(crate) fn run(flags: &BenchStepFlags) -> Result<()> {
    if flags.iters == 0 {
        bail!("invalid --iters 0: at least 1 timed iteration");
    }
    crate::bench_comm::check_gap_us(flags.gap_us)?;
    let cfg = crate::launch::resolve(&flags.config)?;
    match cfg.backend {
        Backend::Threads => report(flags, &cfg, &measure(flags, &cfg, None)?),
        Backend::Mpi | Backend::Nccl => process(flags, &cfg),
    }
}

/// One rank of a process backend's world: measure between collectives; rank 0 reports.
#[cfg(any(feature = "mpi", feature = "nccl"))]
fn process(flags: &BenchStepFlags, cfg: &TrainConfig) -> Result<()> {
    let world = crate::process_world::ProcessWorld::start(
        cfg.backend,
        localsgd_comm::thread::DEFAULT_TIMEOUT,
    )?;
    let rank = world.group.rank();
    match measure(flags, cfg, Some(&world.group)) {
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
fn process(_flags: &BenchStepFlags, cfg: &TrainConfig) -> Result<()> {
    // Unreachable in practice: `launch::resolve` refused the backend already.
    bail!(
        "invalid setting `backend` = {}: not available in this binary",
        cfg.backend.name()
    )
}

/// The bare loop and the copies on this rank; with `peers`, between steps (outside the clock) a
/// one-float all-reduce of the step's time (max), so that each step counts its slowest rank.
fn measure(flags: &BenchStepFlags, cfg: &TrainConfig, peers: Option<&Group>) -> Result<Measured> {
    if cfg.flush_denormals {
        localsgd_trainer::denormals::flush_on_compute_threads()?;
    }
    let data = run::load_data(cfg).context("loading the data set")?;
    let device = Device::flex().autodiff();
    let mcfg = run::model_config(cfg, &data.train)?;
    let mut model = match &cfg.init_weights {
        Some(path) => load_pytorch_safetensors(path, &mcfg, &device)?,
        None => mcfg.init(cfg.seed, &device)?,
    };
    let params = mcfg.num_params();
    let n = data.train.len();
    let per_epoch = (n / cfg.batch_size).max(1);
    let mut optim = run::optimizer(cfg);
    // What `--restart-every` goes back to (burn's optimizer step makes new tensors, so this
    // clone keeps the initial values).
    let initial = model.clone();
    // A one-rank group (its handle used on this thread alone).
    let alone: Group = Arc::new(
        ThreadWorld::new(1)?
            .groups()
            .pop()
            .context("a one-rank thread world has one group")?,
    );
    let mut times = Vec::with_capacity(flags.iters);
    let mut cycles = Vec::with_capacity(flags.iters);
    let mut copies = Vec::with_capacity(flags.iters);
    let mut last_loss = f32::NAN;
    let gap = std::time::Duration::from_micros(flags.gap_us);
    for it in 0..flags.warmup_iters + flags.iters {
        // The iteration's step in its run: with `--restart-every`, runs of that many steps
        // one after the other, each from the start (outside the clock).
        let step = match flags.restart_every {
            0 => it,
            every => it % every,
        };
        if step == 0 && it > 0 {
            model = initial.clone();
            optim = run::optimizer(cfg);
        }
        // Consecutive batches through the whole training set, as training sees them, built
        // outside the clock.
        let b = step % per_epoch;
        let idx: Vec<usize> = (0..cfg.batch_size)
            .map(|k| (b * cfg.batch_size + k) % n)
            .collect();
        let batch = &data.train.batch_tensors(&idx, &device)?;
        localsgd_comm::throughput::spin(gap);
        let started = Instant::now();
        let l = run::loss(&model, batch);
        let value = l.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(cfg.lr, model, grads);
        let mut ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(group) = peers {
            // The collective between steps, off the clock: this step's slowest rank.
            let mut slowest = [ms as f32];
            group.all_reduce_slice(&mut slowest, ReduceOp::Max)?;
            ms = f64::from(slowest[0]);
        }
        let cycle = started.elapsed().as_secs_f64() * 1e3;
        if it >= flags.warmup_iters {
            times.push(ms);
            cycles.push(cycle);
            last_loss = value;
        }
    }
    // The copies, apart (inside the loop above they would change the bare step): gradients of
    // one batch, read once untimed (so the clock sees the copies, not the backward pass), then
    // flattened, averaged over one rank and written back on the clock, as the reducer does.
    let idx: Vec<usize> = (0..cfg.batch_size).map(|k| k % n).collect();
    let batch = &data.train.batch_tensors(&idx, &device)?;
    let grads = GradientsParams::from_grads(run::loss(&model, batch).backward(), &model);
    let _materialized = flatten_grads(&model, &grads, &ParamSelection::All)?;
    let mut grads = grads;
    for _ in 0..flags.iters.clamp(5, 200) {
        let started = Instant::now();
        let mut flat = flatten_grads(&model, &grads, &ParamSelection::All)?;
        match &mut flat.buffer {
            FlatBuffer::F32(v) => alone.average_slice(v)?,
            FlatBuffer::F64(v) => alone.average_slice(v)?,
        }
        grads = grads_from_flat(&model, &flat)?;
        copies.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let median_of = |v: &[f64]| {
        let mut sorted = v.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    let median = median_of(&times);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let cycle_mean = cycles.iter().sum::<f64>() / cycles.len() as f64;
    let ranks = peers.map_or(1, |g| g.size());
    Ok(Measured {
        params,
        median,
        mean,
        cycle_mean,
        copy_ms: median_of(&copies),
        ranks,
        last_loss,
    })
}

/// Print the result and write its JSON (`--json`).
fn report(flags: &BenchStepFlags, cfg: &TrainConfig, m: &Measured) -> Result<()> {
    let Measured {
        params,
        median,
        mean,
        cycle_mean,
        copy_ms,
        ranks,
        last_loss,
    } = *m;
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
    println!(
        "bare burn step: {params} parameters, batch {}: median {median:.3} ms, mean {mean:.3} ms over {} iterations{runs}{gap}{among}; gradient flatten + one-rank mean + write-back {copy_ms:.3} ms ({copy_gbps:.2} GB/s of gradients, `plan --copy-gbps`)",
        cfg.batch_size, flags.iters
    );
    if let Some(path) = &flags.json {
        let out = serde_json::json!({
            "params": params,
            "batch_size": cfg.batch_size,
            "hidden": cfg.hidden,
            "iters": flags.iters,
            "restart_every": flags.restart_every,
            "gap_us": flags.gap_us,
            "median_ms": median,
            "mean_ms": mean,
            "cycle_mean_ms": cycle_mean,
            "copy_ms": copy_ms,
            "copy_gbps": copy_gbps,
            "ranks": ranks,
            "rayon_num_threads": std::env::var("RAYON_NUM_THREADS").ok(),
            "last_loss": last_loss,
        });
        localsgd_trainer::atomic::write_atomic(path, format!("{out:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
