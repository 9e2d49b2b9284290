//! What the shared [watchdog](crate::watchdog) does for MPI: MPI collectives block forever when
//! a peer dies without the launcher noticing, or when ranks issue different collectives. A
//! collective that exceeds its group's timeout is reported (naming the collective, the group and
//! this rank) and the whole job is ended with `MPI_Abort`.

use super::ffi::abort_world;
use crate::watchdog::{Expired, Watchdog, report};

/// Exit code of a job the watchdog aborts (`MPI_Abort` error code; `mpirun` exits with it).
pub const WATCHDOG_EXIT_CODE: i32 = 70;

/// Start this process's MPI watchdog thread.
pub(crate) fn start(world_rank: usize, host: String) -> std::io::Result<Watchdog> {
    Watchdog::start("localsgd-mpi-watchdog", world_rank, host, expire)
}

fn expire(e: &Expired<'_>) -> ! {
    report(&format!(
        "localsgd-comm mpi: world rank {} on host {:?}: {} on group {:?} (world ranks) \
         did not complete within the timeout of {:?} (waited {:?}): a peer rank died, hangs, or \
         issued a different collective. Aborting the MPI job with exit code {}.",
        e.world_rank, e.host, e.what, e.group, e.limit, e.waited, WATCHDOG_EXIT_CODE
    ));
    abort_world(WATCHDOG_EXIT_CODE)
}
