//! The process-wide watchdog of the backends whose calls can block forever inside a C library
//! (MPI, NCCL): one timer thread watches every call in flight and, when one passes its limit,
//! hands it to the backend's `expire` function, which reports it (see [`report`]) and ends the
//! process its own way (`MPI_Abort` for MPI, `_exit` for NCCL).

use crate::signature::CallSignature;
use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the watchdog looks at the calls in flight when none is close to its deadline.
const POLL: Duration = Duration::from_millis(200);

/// What is being watched. A collective is kept as its signature (no formatting on the hot path).
#[derive(Debug, Clone)]
pub(crate) enum What {
    /// A collective.
    Call(CallSignature),
    /// Any other blocking step (NCCL communicator creation and destruction, MPI's connection
    /// set-up at start-up).
    #[cfg_attr(not(any(feature = "nccl", feature = "mpi")), allow(dead_code))]
    Named(String),
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            What::Call(sig) => write!(f, "collective {sig}"),
            What::Named(name) => f.write_str(name),
        }
    }
}

/// A call that passed its limit, as handed to the backend's `expire` function.
pub(crate) struct Expired<'a> {
    /// The call.
    pub what: &'a What,
    /// World ranks of the call's group.
    pub group: &'a [usize],
    /// How long it has been running.
    pub waited: Duration,
    /// The limit it passed.
    pub limit: Duration,
    /// This process's world rank.
    pub world_rank: usize,
    /// This process's host name.
    pub host: &'a str,
}

/// Ends the process after reporting an expired call.
pub(crate) type Expire = fn(&Expired<'_>) -> !;

struct InFlight {
    what: What,
    group: Arc<[usize]>,
    started: Instant,
    limit: Duration,
}

#[derive(Default)]
struct State {
    next_id: u64,
    in_flight: HashMap<u64, InFlight>,
    stop: bool,
    /// When the sleeping thread looks again on its own; `None` while it is looking.
    wake_at: Option<Instant>,
    /// Times the thread has looked at the calls in flight.
    looks: u64,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    world_rank: usize,
    host: String,
    expire: Expire,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is only ever changed by plain inserts and removes: usable after a panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The watchdog thread of one backend in this process.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watchdog")
            .field("world_rank", &self.shared.world_rank)
            .finish()
    }
}

/// Removes its call from the watch list when dropped (the call returned).
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
    /// Start a watchdog thread named `thread_name`. It ends when [`stop`](Self::stop) is called
    /// or the watchdog is dropped.
    pub fn start(
        thread_name: &str,
        world_rank: usize,
        host: String,
        expire: Expire,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            world_rank,
            host,
            expire,
        });
        let weak = Arc::downgrade(&shared);
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || run(weak))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Watch one call until the returned guard is dropped; `limit` after now it expires.
    ///
    /// The thread is woken only when this call's deadline comes before the thread's next look:
    /// waking it for every collective would cost every iteration two context switches (the
    /// woken thread preempts the caller), about 5% of a core at a few thousand iterations a
    /// second, for nothing.
    pub fn watch(&self, what: What, group: &Arc<[usize]>, limit: Duration) -> Watch<'_> {
        let mut st = self.shared.lock();
        let id = st.next_id;
        st.next_id += 1;
        let started = Instant::now();
        st.in_flight.insert(
            id,
            InFlight {
                what,
                group: group.clone(),
                started,
                limit,
            },
        );
        // A limit past what an `Instant` can hold (NCCL's `Duration::MAX`) is never due first.
        if st
            .wake_at
            .is_some_and(|at| started.checked_add(limit).is_some_and(|due| due < at))
        {
            self.shared.cv.notify_all();
        }
        Watch {
            shared: &self.shared,
            id,
        }
    }

    /// Stop and join the watchdog thread (MPI: at shutdown, before `MPI_Finalize`).
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

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(weak: Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let mut st = shared.lock();
        if st.stop {
            return;
        }
        st.looks += 1;
        let now = Instant::now();
        let mut next = POLL;
        for f in st.in_flight.values() {
            let waited = now.duration_since(f.started);
            if waited >= f.limit {
                (shared.expire)(&Expired {
                    what: &f.what,
                    group: &f.group,
                    waited,
                    limit: f.limit,
                    world_rank: shared.world_rank,
                    host: &shared.host,
                });
            }
            next = next.min(f.limit - waited);
        }
        // Set under the lock the wait releases: a call watched after this line sees when the
        // thread will look again; one watched before it was in the scan above.
        let wait = next.max(Duration::from_millis(1));
        st.wake_at = Some(now + wait);
        let (mut st, _) = shared
            .cv
            .wait_timeout(st, wait)
            .unwrap_or_else(|e| e.into_inner());
        st.wake_at = None;
    }
}

/// Report an expired call through `tracing` and, because the process ends right after, directly
/// on stderr as well (the message must arrive even when no tracing subscriber is installed).
pub(crate) fn report(message: &str) {
    tracing::error!("{message}");
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{message}");
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::CallSignature;
    use crate::{ElementType, ReduceOp};
    use std::sync::atomic::{AtomicU64, Ordering};

    fn call() -> What {
        What::Call(CallSignature::all_reduce(
            ReduceOp::Sum,
            ElementType::F32,
            8,
        ))
    }

    fn looks(dog: &Watchdog) -> u64 {
        dog.shared.lock().looks
    }

    /// Waits until the thread sleeps (it has looked once and set its next look).
    fn sleeping(dog: &Watchdog) {
        while dog.shared.lock().wake_at.is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn never(_: &Expired<'_>) -> ! {
        panic!("no call here passes its limit")
    }

    #[test]
    fn calls_with_a_limit_past_the_next_look_do_not_wake_the_thread() {
        let dog = Watchdog::start("test-watchdog", 0, "h".into(), never).unwrap();
        sleeping(&dog);
        let before = looks(&dog);
        let group: Arc<[usize]> = Arc::from(vec![0, 1]);
        for _ in 0..1000 {
            let _watch = dog.watch(call(), &group, Duration::from_secs(60));
        }
        // Only the thread's own poll (every 200 ms) can have come in between.
        assert!(looks(&dog) - before <= 1, "{} looks", looks(&dog) - before);
    }

    static EXPIRED_AFTER_MS: AtomicU64 = AtomicU64::new(0);

    fn record(e: &Expired<'_>) -> ! {
        EXPIRED_AFTER_MS.store(e.waited.as_millis() as u64 + 1, Ordering::SeqCst);
        // A real expire ends the process; this one ends the watchdog thread (its lock recovers
        // from the poisoning, and `stop` ignores the failed join).
        panic!("test expire: the watched call passed its limit")
    }

    #[test]
    fn a_call_due_before_the_next_look_wakes_the_thread_in_time() {
        let dog = Watchdog::start("test-watchdog", 0, "h".into(), record).unwrap();
        sleeping(&dog);
        let group: Arc<[usize]> = Arc::from(vec![0, 1]);
        let started = Instant::now();
        let _watch = dog.watch(call(), &group, Duration::from_millis(20));
        while EXPIRED_AFTER_MS.load(Ordering::SeqCst) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the call never expired"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Reported soon after its 20 ms limit. Without the wake-up the thread would only see it
        // at its next look, about 200 ms (`POLL`) after it went to sleep, just before the
        // call was watched.
        let waited = EXPIRED_AFTER_MS.load(Ordering::SeqCst) - 1;
        assert!(waited < POLL.as_millis() as u64 / 2, "{waited} ms");
    }

    #[test]
    fn a_limit_past_what_an_instant_holds_is_watched_without_panicking() {
        let dog = Watchdog::start("test-watchdog", 0, "h".into(), never).unwrap();
        sleeping(&dog);
        let group: Arc<[usize]> = Arc::from(vec![0, 1]);
        let _watch = dog.watch(call(), &group, Duration::MAX);
    }
}
