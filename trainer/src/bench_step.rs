//! `localsgd bench-step` (part of the binary): milliseconds per iteration of a bare burn loop —
//! forward, loss (read back, as the pipeline does), backward, optimizer step — on the model, data
//! and batch size of a run's settings, with no pipeline and no communication. It is the
//! compute term of `localsgd plan` and the "bare burn" column of the benchmark matrix.

use anyhow::{Context, Result, bail};
use burn::optim::GradientsParams;
use burn::tensor::Device;
use localsgd_trainer::cli::ConfigFlags;
use localsgd_trainer::init_weights::load_pytorch_safetensors;
use localsgd_trainer::run;
use std::path::PathBuf;
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
    /// Also write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The model, data, batch size and optimizer settings (as for `train`).
    #[command(flatten)]
    config: ConfigFlags,
}

pub(crate) fn run(flags: &BenchStepFlags) -> Result<()> {
    if flags.iters == 0 {
        bail!("invalid --iters 0: at least 1 timed iteration");
    }
    let cfg = crate::resolve_settings(&flags.config)?;
    if cfg.flush_denormals {
        localsgd_trainer::denormals::flush_on_compute_threads()?;
    }
    let data = run::load_data(&cfg).context("loading the data set")?;
    let device = Device::flex().autodiff();
    let mcfg = run::model_config(&cfg, &data.train)?;
    let mut model = match &cfg.init_weights {
        Some(path) => load_pytorch_safetensors(path, &mcfg, &device)?,
        None => mcfg.init(cfg.seed, &device)?,
    };
    let params = mcfg.num_params();
    let n = data.train.len();
    let per_epoch = (n / cfg.batch_size).max(1);
    let mut optim = run::optimizer(&cfg);
    let mut times = Vec::with_capacity(flags.iters);
    for it in 0..flags.warmup_iters + flags.iters {
        // Consecutive batches through the whole training set, as training sees them, built
        // outside the clock.
        let b = it % per_epoch;
        let idx: Vec<usize> = (0..cfg.batch_size)
            .map(|k| (b * cfg.batch_size + k) % n)
            .collect();
        let batch = &data.train.batch_tensors(&idx, &device)?;
        let started = Instant::now();
        let l = run::loss(&model, batch);
        let _value = l.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(cfg.lr, model, grads);
        if it >= flags.warmup_iters {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    println!(
        "bare burn step: {params} parameters, batch {}: median {median:.3} ms, mean {mean:.3} ms over {} iterations",
        cfg.batch_size, flags.iters
    );
    if let Some(path) = &flags.json {
        let out = serde_json::json!({
            "params": params,
            "batch_size": cfg.batch_size,
            "hidden": cfg.hidden,
            "iters": flags.iters,
            "median_ms": median,
            "mean_ms": mean,
            "rayon_num_threads": std::env::var("RAYON_NUM_THREADS").ok(),
        });
        localsgd_trainer::atomic::write_atomic(path, format!("{out:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
