//! `localsgd train` from flags to a finished run: the settings resolved and checked, the backend
//! chosen, the threads run here or one process per rank handed to `process_train`; what is
//! shown and written around the training is `outcome`'s.

use crate::outcome::{prepare_run_dir, progress_bar, report};
use anyhow::{Context, Result, bail};
use localsgd_trainer::config::ConfigFlags;
use localsgd_trainer::config::{Backend, TrainConfig};
use localsgd_trainer::resume::ResumePlan;
use localsgd_trainer::run;

/// The validated settings, with a backend this binary has.
pub(crate) fn resolve(flags: &ConfigFlags) -> Result<TrainConfig> {
    let cfg = resolve_settings(flags)?;
    check_backend_built(cfg.backend)?;
    Ok(cfg)
}

/// The settings (file, then flags; on `resume`, over the run's own), validated; a resume is
/// checked against its run (every rank checks it, so under MPI every rank refuses alike).
pub(crate) fn resolve_settings(flags: &ConfigFlags) -> Result<TrainConfig> {
    let cfg = flags.resolve().map_err(anyhow::Error::msg)?;
    cfg.validate()?;
    if cfg.resume {
        ResumePlan::check(&cfg)?;
    }
    Ok(cfg)
}

/// Refuse a backend this binary was built without, naming the feature that brings it.
pub(crate) fn check_backend_built(backend: Backend) -> Result<()> {
    match backend {
        Backend::Mpi if !cfg!(feature = "mpi") => bail!(
            "invalid setting `backend` = mpi: this binary was built without MPI support; rebuild with `cargo build -p localsgd-trainer --features mpi` and launch under mpirun, or use `backend = \"threads\"`"
        ),
        Backend::Nccl if !cfg!(feature = "nccl") => bail!(
            "invalid setting `backend` = nccl: this binary was built without NCCL support; rebuild with `cargo build -p localsgd-trainer --features nccl` and start one process per GPU with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (e.g. by `torchrun --no-python`), or use `backend = \"threads\"`"
        ),
        _ => Ok(()),
    }
}

/// `localsgd train`: the one place the binary picks a backend. Every backend runs the same
/// per-rank function, [`run::run_rank`] (train, then the slowest wall time and the totals over
/// every rank), and rank 0's outcome is reported by [`report`]. Threads: one process, ranks as
/// threads ([`run::train_threads`]); MPI and NCCL: this process is one rank
/// (`process_train.rs`).
pub(crate) fn train(flags: &ConfigFlags) -> Result<()> {
    let cfg = resolve(flags)?;
    match cfg.backend {
        Backend::Threads => train_threads(&cfg),
        Backend::Mpi | Backend::Nccl => train_one_process_per_rank(flags, cfg),
    }
}

fn train_threads(cfg: &TrainConfig) -> Result<()> {
    let data = run::load_data(cfg).context("loading the data set")?;
    // A model the data cannot feed (a CNN on non-square inputs), or an `init-weights` file
    // that does not fit it, is refused before the run directory is touched.
    run::preflight(cfg, &data.train)?;
    let dir = prepare_run_dir(cfg)?;
    let outcomes = run::train_threads(cfg, &data, Some(&dir), progress_bar(cfg))?;
    let r0 = outcomes.first().context("no worker results")?;
    report(cfg, r0, &dir)
}

#[cfg(any(feature = "mpi", feature = "nccl"))]
fn train_one_process_per_rank(flags: &ConfigFlags, cfg: TrainConfig) -> Result<()> {
    crate::process_train::train(flags, cfg)
}

#[cfg(not(any(feature = "mpi", feature = "nccl")))]
fn train_one_process_per_rank(_flags: &ConfigFlags, cfg: TrainConfig) -> Result<()> {
    // `resolve` refuses a backend this binary was built without, naming the feature.
    check_backend_built(cfg.backend)?;
    bail!(
        "backend {} is not available in this binary",
        cfg.backend.name()
    )
}
