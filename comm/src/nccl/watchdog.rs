//! What the shared [watchdog](crate::watchdog) does for NCCL: the last resort when a call into
//! NCCL or CUDA has blocked past its deadline.
//!
//! Collectives do not need it in the common case: after enqueueing, the group polls the stream
//! and, at the group timeout, aborts the communicator (`ncclCommAbort`) and returns
//! [`CommError::Timeout`](crate::CommError::Timeout). But some NCCL calls block the calling
//! thread themselves (`ncclCommInitRank` and `ncclCommSplit` wait for every rank; the first
//! collective on a communicator may wait for connections), and a thread stuck inside a C call
//! cannot be interrupted. For those, the watchdog prints what was stuck and ends the process with
//! exit code [`WATCHDOG_EXIT_CODE`] (`_exit`: no atexit handlers, which could block on the same
//! stuck NCCL state) once the deadline plus [`WATCHDOG_GRACE`] has passed.

use crate::watchdog::{Expired, Watchdog, report};
use std::ffi::c_int;
use std::time::Duration;

/// Exit code of a process the NCCL watchdog ends.
pub const WATCHDOG_EXIT_CODE: i32 = 70;

/// How long past a call's own timeout the watchdog waits before ending the process (gives the
/// polling path time to abort the communicator and return an error instead).
pub const WATCHDOG_GRACE: Duration = Duration::from_secs(15);

unsafe extern "C" {
    /// POSIX `_exit`: ends the process at once, without atexit handlers.
    fn _exit(status: c_int) -> !;
}

/// Start this process's NCCL watchdog thread.
pub(crate) fn start(world_rank: usize, host: String) -> std::io::Result<Watchdog> {
    Watchdog::start("localsgd-nccl-watchdog", world_rank, host, expire)
}

/// The watchdog limit of a call with group timeout `timeout`.
pub(crate) fn limit(timeout: Duration) -> Duration {
    timeout.saturating_add(WATCHDOG_GRACE)
}

fn expire(e: &Expired<'_>) -> ! {
    report(&format!(
        "localsgd-comm nccl: world rank {} on host {:?}: {} on group {:?} (world ranks) is stuck \
         inside NCCL/CUDA after {:?} (limit {:?}: the group timeout plus {WATCHDOG_GRACE:?}): \
         a peer rank died, hangs, or issued a different collective. Ending this process with \
         exit code {WATCHDOG_EXIT_CODE}.",
        e.world_rank, e.host, e.what, e.group, e.waited, e.limit,
    ));
    // SAFETY: `_exit` only ends the process.
    unsafe { _exit(WATCHDOG_EXIT_CODE) }
}
