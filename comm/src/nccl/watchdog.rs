//! The last-resort watchdog: a thread that ends the process when a call into NCCL or CUDA has
//! blocked past its deadline.
//!
//! Collectives do not need it in the common case: after enqueueing, the group polls the stream
//! and, at the group timeout, aborts the communicator (`ncclCommAbort`) and returns
//! [`CommError::Timeout`](crate::CommError::Timeout). But some NCCL calls block the calling
//! thread themselves (`ncclCommInitRank` and `ncclCommSplit` wait for every rank; the first
//! collective on a communicator may wait for connections), and a thread stuck inside a C call
//! cannot be interrupted. For those, this thread prints what was stuck and ends the process with
//! exit code [`WATCHDOG_EXIT_CODE`] (`_exit`: no atexit handlers, which could block on the same
//! stuck NCCL state) once the deadline plus [`WATCHDOG_GRACE`] has passed.

use crate::signature::CallSignature;
use std::collections::HashMap;
use std::ffi::c_int;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Exit code of a process the NCCL watchdog ends.
pub const WATCHDOG_EXIT_CODE: i32 = 70;

/// How long past a call's own timeout the watchdog waits before ending the process (gives the
/// polling path time to abort the communicator and return an error instead).
pub const WATCHDOG_GRACE: Duration = Duration::from_secs(15);

const POLL: Duration = Duration::from_millis(200);

unsafe extern "C" {
    /// POSIX `_exit`: ends the process at once, without atexit handlers.
    fn _exit(status: c_int) -> !;
}

struct InFlight {
    what: String,
    group: Arc<[usize]>,
    started: Instant,
    limit: Duration,
}

#[derive(Default)]
struct State {
    next_id: u64,
    in_flight: HashMap<u64, InFlight>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    world_rank: usize,
    host: String,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The process's watchdog (one thread, started with the first NCCL world).
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("world_rank", &self.shared.world_rank)
            .finish()
    }
}

/// Removes its call from the watch list when dropped.
pub(crate) struct Watch<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.shared.lock().in_flight.remove(&self.id);
    }
}

impl Watchdog {
    /// Start the watchdog thread. It lives as long as the process (it only sleeps when idle).
    pub fn start(world_rank: usize, host: String) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            world_rank,
            host,
        });
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("localsgd-nccl-watchdog".into())
            .spawn(move || run(weak))?;
        Ok(Self { shared })
    }

    /// Watch a collective until the guard is dropped; the process ends `timeout` +
    /// [`WATCHDOG_GRACE`] after now if it has not returned.
    pub fn watch(
        &self,
        call: &CallSignature,
        group: &Arc<[usize]>,
        timeout: Duration,
    ) -> Watch<'_> {
        self.watch_named(call.to_string(), group, timeout)
    }

    /// Watch any blocking step (communicator creation, ...).
    pub fn watch_named(&self, what: String, group: &Arc<[usize]>, timeout: Duration) -> Watch<'_> {
        let mut st = self.shared.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.in_flight.insert(
            id,
            InFlight {
                what,
                group: group.clone(),
                started: Instant::now(),
                limit: timeout.saturating_add(WATCHDOG_GRACE),
            },
        );
        self.shared.cv.notify_all();
        Watch {
            shared: &self.shared,
            id,
        }
    }
}

fn run(weak: std::sync::Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let st = shared.lock();
        let now = Instant::now();
        let mut next = POLL;
        for f in st.in_flight.values() {
            let waited = now.duration_since(f.started);
            if waited >= f.limit {
                fail(&shared, f, waited);
            }
            next = next.min(f.limit - waited);
        }
        let _unused = shared
            .cv
            .wait_timeout(st, next.max(Duration::from_millis(1)))
            .unwrap_or_else(|e| e.into_inner());
    }
}

fn fail(shared: &Shared, f: &InFlight, waited: Duration) -> ! {
    let message = format!(
        "localsgd-comm nccl: world rank {} on host {:?}: {} on group {:?} (world ranks) is stuck \
         inside NCCL/CUDA after {waited:?} (limit: the group timeout plus {WATCHDOG_GRACE:?}): \
         a peer rank died, hangs, or issued a different collective. Ending this process with \
         exit code {WATCHDOG_EXIT_CODE}.",
        shared.world_rank,
        shared.host,
        f.what,
        &f.group[..],
    );
    tracing::error!("{message}");
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{message}");
    let _ = err.flush();
    drop(err);
    // SAFETY: `_exit` only ends the process.
    unsafe { _exit(WATCHDOG_EXIT_CODE) }
}
