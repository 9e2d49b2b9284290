//! `localsgd train --backend mpi|nccl` (part of the binary, built with the `mpi` or `nccl`
//! feature): one rank per process, started by `mpirun` or by a torchrun-style launcher. Rank 0
//! prints and writes the run directory; every rank writes its own checkpoint file into it, so
//! with several machines the run directory must be on a shared file system.
//!
//! Errors every rank detects identically before any training (configuration, world size) are
//! printed once by rank 0 and every rank exits with code 2 after leaving the world normally.
//! Any later error on one rank (data, a peer, a collective timeout) is printed with the rank
//! and ends the job (exit code 2): through `MPI_Abort` for MPI; for NCCL the rank exits and its
//! peers fail at their next collective after the collective timeout (or, blocked inside NCCL,
//! are ended by the watchdog). Returning normally would leave the other ranks waiting in their
//! next collective. A replacement process (`on-rank-failure = "replace"`, started by the
//! survivors of a failure) goes straight into the run, and on an error exits alone: the ranks
//! it joined treat its end as a failed rank.

use crate::outcome::{describe, prepare_run_dir, progress_bar, report};
use crate::process_world::ProcessWorld;
use anyhow::{Context, Result, bail};
use localsgd_comm::Group;
use localsgd_trainer::config::ConfigFlags;
use localsgd_trainer::config::TrainConfig;
use localsgd_trainer::run;
use std::time::Duration;

/// Exit code of a rank that fails (the same as the thread backend's `error:` exit).
const FAILURE_EXIT_CODE: i32 = 2;

/// Train one rank of a one-process-per-rank job. Never returns an error after the world is up:
/// failures end the process (see the module notes).
pub(crate) fn train(flags: &ConfigFlags, cfg: TrainConfig) -> Result<()> {
    let world = ProcessWorld::start(cfg.backend, Duration::from_secs(cfg.timeout_secs))?;
    let rank = world.group.rank();
    let size = world.group.size();
    // A panic's own message does not say which process it came from: say it first.
    let report_panic = std::panic::take_hook();
    let whereabouts = world.whereabouts();
    std::panic::set_hook(Box::new(move |info| {
        say(&format!(
            "error on rank {rank} of {size} ({whereabouts}): a panic (its message follows)"
        ));
        report_panic(info);
    }));

    // Deterministic checks: every rank reaches the same verdict, so rank 0 alone reports it and
    // everyone leaves normally (no abort, no duplicated messages).
    let cfg = match resolve_world_size(flags, cfg, &world) {
        Ok(cfg) => cfg,
        Err(e) => {
            if rank == 0 {
                say(&format!("error: {}", describe(&e)));
            }
            world.finish();
            std::process::exit(FAILURE_EXIT_CODE);
        }
    };
    match train_rank(&cfg, &world) {
        Ok(()) => {
            // Leave only once every rank is done (rank 0's report takes a moment).
            if let Err(e) = world.group.barrier() {
                say(&format!(
                    "error on rank {rank} of {size}: final barrier: {e}"
                ));
                world.abort(FAILURE_EXIT_CODE);
            }
            world.finish();
            Ok(())
        }
        Err(e) => {
            say(&format!(
                "error on rank {rank} of {size} ({}): {}",
                world.whereabouts(),
                describe(&e)
            ));
            if world.group.joined() {
                // A replacement that cannot go on leaves like a failed rank: the members it
                // joined continue without it (`MPI_Abort` could end their job too).
                std::process::exit(FAILURE_EXIT_CODE);
            }
            world.abort(FAILURE_EXIT_CODE)
        }
    }
}

/// Print one message to stderr in a single write, so that a launcher that forwards every
/// rank's output as it arrives does not interleave two ranks' messages mid-line.
fn say(message: &str) {
    use std::io::Write;
    let line = format!("{message}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// `workers` defaults to the world size; an explicit value must match it.
fn resolve_world_size(
    flags: &ConfigFlags,
    mut cfg: TrainConfig,
    world: &ProcessWorld,
) -> Result<TrainConfig> {
    let size = world.group.size();
    if world.group.joined() {
        // A replacement: the members checked the settings, and its number of workers is the
        // configured one, which a live rank hands it (`run::run_rank`).
        return Ok(cfg);
    }
    if cfg.on_rank_failure.survives()
        && let Some(why) = world.fault_tolerance_missing()
    {
        let value = match cfg.on_rank_failure {
            localsgd_trainer::config::OnRankFailure::Replace => "replace",
            _ => "continue",
        };
        bail!("invalid setting `on-rank-failure` = \"{value}\": {why}; use `abort`");
    }
    if !cfg.resume_ranks.is_empty() && cfg.resume_ranks.len() != size {
        bail!(
            "invalid setting `resume-ranks` = {:?}: one saved rank per rank of the job, {size} \
             here ({})",
            cfg.resume_ranks,
            world.size_hint(size)
        );
    }
    let given = flags.workers_given().map_err(anyhow::Error::msg)?;
    if given && cfg.workers != size {
        bail!(
            "invalid setting `workers` = {}: under {name} the number of workers is the world size, {size} here ({hint}); drop the setting or set it to {size}",
            cfg.workers,
            name = world.name(),
            hint = world.size_hint(size)
        );
    }
    cfg.workers = size;
    // Settings that depend on the worker count (levels, subgroup-size) are checked again, and
    // a resume against its run on this world size (every rank alike, so rank 0 reports it).
    cfg.validate()?;
    if cfg.resume {
        localsgd_trainer::resume::ResumePlan::check(&cfg)?;
    }
    Ok(cfg)
}

/// One process per rank: unless `RAYON_NUM_THREADS` says otherwise, give each of the ranks on
/// this host an equal share of its cores for burn's compute threads, so that the ranks do not
/// fight over cores (the thread backend's workers already share one pool).
fn limit_compute_threads(local: usize) {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / local.max(1)).max(1);
    // Fails only if the global pool already exists, which leaves the library's default.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global();
}

/// The intra-node groups (the backend's split by host, the same split the hooks use), as lists
/// of world ranks, and the size of this rank's group. Collective.
fn host_layout(group: &Group) -> Result<(Vec<Vec<usize>>, usize)> {
    let node = group.intra_node().context("splitting the world by host")?;
    let leaders =
        group.all_gather_u64(&[node.world_ranks().first().copied().unwrap_or(0) as u64])?;
    let mut groups: Vec<(u64, Vec<usize>)> = Vec::new();
    for (rank, leader) in leaders.into_iter().enumerate() {
        match groups.iter_mut().find(|(l, _)| *l == leader) {
            Some((_, members)) => members.push(rank),
            None => groups.push((leader, vec![rank])),
        }
    }
    Ok((groups.into_iter().map(|(_, m)| m).collect(), node.size()))
}

fn train_rank(cfg: &TrainConfig, world: &ProcessWorld) -> Result<()> {
    let group = &world.group;
    let rank = group.rank();
    if group.joined() {
        // A replacement the survivors of a failure started: they are inside the run, so it
        // goes straight to it (no layout, no run directory to prepare). It does not know how
        // many ranks share its host: it takes a world-size share of the cores.
        limit_compute_threads(group.size());
        let data = run::load_data(cfg).context("loading the data set")?;
        let progress = if rank == 0 { progress_bar(cfg) } else { None };
        let outcome = run::run_rank(cfg, group.clone(), &data, Some(&cfg.run_dir), progress)?;
        if outcome.result.rank == 0 {
            report(cfg, &outcome, &cfg.run_dir)?;
        }
        world.exit_after_failure(0);
        return Ok(());
    }
    let (hosts, local) = host_layout(group)?;
    limit_compute_threads(local);
    if rank == 0 {
        let groups: Vec<String> = hosts.iter().map(|g| format!("{g:?}")).collect();
        println!(
            "{}: {} ranks on {} host(s); intra-node groups (world ranks): {}",
            world.name(),
            group.size(),
            hosts.len(),
            groups.join(" ")
        );
    }
    let data = run::load_data(cfg).context("loading the data set")?;
    run::preflight(cfg, &data.train)?;
    // Rank 0 owns the run directory; the others wait until it exists (they write checkpoint
    // files into it).
    let dir = if rank == 0 {
        prepare_run_dir(cfg)?
    } else {
        cfg.run_dir.clone()
    };
    group
        .barrier()
        .context("waiting for rank 0 to prepare the run directory")?;
    let progress = if rank == 0 { progress_bar(cfg) } else { None };
    let outcome = run::run_rank(cfg, group.clone(), &data, Some(&dir), progress)?;
    // Rank 0 of the world that finished reports (after a failure, the survivors' rank 0).
    if outcome.result.rank == 0 {
        report(cfg, &outcome, &dir)?;
    }
    if !outcome.membership.is_empty() {
        // The world group is revoked: meet the survivors and leave without MPI_Finalize.
        world.exit_after_failure(0);
    }
    Ok(())
}
