//! What a rehearsed fault ([`crate::fault`]) does on the faulty rank.

use super::error::RunError;
use super::loader::ShardEnd;
use crate::config::TrainConfig;
use crate::fault::{Fault, FaultKind};
use localsgd_comm::Group;
use std::time::Duration;
/// Do what an injected fault asks for ([`crate::fault`]), on the faulty rank.
pub(super) fn inject(
    f: Fault,
    cfg: &TrainConfig,
    group: &Group,
    shard: &ShardEnd,
) -> Result<(), RunError> {
    let (rank, iteration) = (f.rank, f.iteration);
    tracing::warn!(?f.kind, rank, iteration, "injecting a fault ({})", crate::fault::ENV);
    match f.kind {
        FaultKind::Panic => panic!(
            "injected fault: rank {rank} panics before iteration {iteration} ({})",
            crate::fault::ENV
        ),
        // A panic under MPI ends the whole job (`MPI_Abort`); a process that dies does not.
        FaultKind::Checkpoint if group.backend() != "threads" => {
            eprintln!(
                "injected fault: rank {rank} aborts its process after the checkpoint of \
                 {iteration} iterations was written, before it is published ({})",
                crate::fault::ENV
            );
            std::process::abort();
        }
        FaultKind::Checkpoint => panic!(
            "injected fault: rank {rank} panics after the checkpoint of {iteration} iterations \
             was written, before it is published ({})",
            crate::fault::ENV
        ),
        FaultKind::Stall => {
            std::thread::sleep(Duration::from_secs(cfg.timeout_secs.saturating_add(3)))
        }
        FaultKind::Abort => {
            eprintln!(
                "injected fault: rank {rank} aborts its process before iteration {iteration} ({})",
                crate::fault::ENV
            );
            std::process::abort();
        }
        FaultKind::Kill => {
            eprintln!(
                "injected fault: rank {rank} sends its process SIGKILL before iteration \
                 {iteration} ({})",
                crate::fault::ENV
            );
            kill_this_process();
        }
        // Its peers are about to agree on data (an all-reduce): a barrier does not match.
        FaultKind::Mismatch => group.barrier()?,
        FaultKind::Short => shard.end_here(),
        // Fired inside the iteration (`fail_mid_step`), not before it.
        FaultKind::Step => fail_mid_step(f, group),
    }
    Ok(())
}

/// `kill -9` of this process (`raise(SIGKILL)`).
fn kill_this_process() -> ! {
    unsafe extern "C" {
        fn raise(signal: std::ffi::c_int) -> std::ffi::c_int;
    }
    const SIGKILL: std::ffi::c_int = 9;
    // SAFETY: raising a signal has no preconditions; SIGKILL cannot be caught, so the process
    // ends here.
    unsafe { raise(SIGKILL) };
    std::process::abort()
}

/// A `step` fault ([`crate::fault`]): the rank fails inside its forward pass, while its peers
/// go on into the iteration's collectives (gradient sync, averaging): on the thread backend its
/// thread panics, with one process per rank its process ends (a panic under MPI would end the
/// whole job).
pub(super) fn fail_mid_step(f: Fault, group: &Group) {
    let (rank, iteration) = (f.rank, f.iteration);
    if group.backend() != "threads" {
        eprintln!(
            "injected fault: rank {rank} aborts its process inside iteration {iteration} ({})",
            crate::fault::ENV
        );
        std::process::abort();
    }
    panic!(
        "injected fault: rank {rank} panics inside iteration {iteration} ({})",
        crate::fault::ENV
    );
}
