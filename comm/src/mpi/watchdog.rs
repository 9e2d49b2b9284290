//! The collective watchdog: MPI collectives block forever when a peer dies without the launcher
//! noticing, or when ranks issue different collectives. One timer thread per process watches
//! every collective in flight; one that exceeds its group's timeout is reported (naming the
//! collective, the group and this rank) and the whole job is ended with `MPI_Abort`.

use super::ffi::abort_world;
use crate::signature::CallSignature;
use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Exit code of a job the watchdog aborts (`MPI_Abort` error code; `mpirun` exits with it).
pub const WATCHDOG_EXIT_CODE: i32 = 70;

/// How often the watchdog looks at the collectives in flight when none is close to its deadline.
const POLL: Duration = Duration::from_millis(200);

struct InFlight {
    call: CallSignature,
    group: Arc<[usize]>,
    started: Instant,
    timeout: Duration,
}

#[derive(Default)]
struct State {
    next_id: u64,
    in_flight: HashMap<u64, InFlight>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    world_rank: usize,
    host: String,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is only ever changed by plain inserts and removes: usable after a panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The process-wide watchdog thread.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("world_rank", &self.shared.world_rank)
            .finish()
    }
}

/// Removes its collective from the watch list when dropped (the collective returned).
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
    /// Start the watchdog thread for this process.
    pub fn start(world_rank: usize, host: String) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            world_rank,
            host,
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("localsgd-mpi-watchdog".into())
                .spawn(move || run(&shared))?
        };
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Watch one collective until the returned guard is dropped.
    pub fn watch(&self, call: CallSignature, group: &Arc<[usize]>, timeout: Duration) -> Watch<'_> {
        let mut st = self.shared.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.in_flight.insert(
            id,
            InFlight {
                call,
                group: group.clone(),
                started: Instant::now(),
                timeout,
            },
        );
        Watch {
            shared: &self.shared,
            id,
        }
    }

    /// Stop and join the watchdog thread (at shutdown, before `MPI_Finalize`).
    pub fn stop(&self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            // The thread only sleeps and reads the map; a join error would be its own panic,
            // which has already been reported by the panic hook.
            let _ = h.join();
        }
    }
}

fn run(shared: &Shared) {
    let mut st = shared.lock();
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        let mut next = POLL;
        for f in st.in_flight.values() {
            let waited = now.duration_since(f.started);
            if waited >= f.timeout {
                fail(shared, f, waited);
            }
            next = next.min(f.timeout - waited);
        }
        st = shared
            .cv
            .wait_timeout(st, next.max(Duration::from_millis(1)))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

fn fail(shared: &Shared, f: &InFlight, waited: Duration) -> ! {
    let message = format!(
        "localsgd-comm mpi: world rank {} on host {:?}: collective {} on group {:?} (world ranks) \
         did not complete within the timeout of {:?} (waited {:?}): a peer rank died, hangs, or \
         issued a different collective. Aborting the MPI job with exit code {}.",
        shared.world_rank,
        shared.host,
        f.call,
        &f.group[..],
        f.timeout,
        waited,
        WATCHDOG_EXIT_CODE
    );
    tracing::error!("{message}");
    // The process ends in the next call, so the message must reach stderr even when no tracing
    // subscriber is installed: write it there directly as well.
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{message}");
    let _ = err.flush();
    drop(err);
    abort_world(WATCHDOG_EXIT_CODE)
}
