//! The embedded backend: W worker threads in one process, each with its own group handle.
//!
//! Failures: a rank whose handle is dropped (also while its thread panics) has left; its peers'
//! pending and later collectives on the group fail with [`CommError::PeerFailed`], and the
//! group stays failed. The survivors can go on without it:
//! [`shrink`](crate::ProcessGroup::shrink), called by every rank that has not left, gives them a
//! new group of just themselves (same relative order, their world ranks and host ids, the old
//! group's traffic counters), and [`ThreadWorld::run_each`] returns the survivors' results next
//! to the failed rank's [`WorkerPanicked`]. Each group shrinks once; after a further failure the
//! shrunk group is shrunk in turn.
//!
//! ```
//! use localsgd_comm::{CommError, GroupExt, ProcessGroup, ReduceOp, ThreadWorld};
//!
//! let out = ThreadWorld::new(3)?.run_each(|world| -> Result<f32, CommError> {
//!     assert_ne!(world.rank(), 1, "rank 1 fails on purpose");
//!     let mut v = [world.rank() as f32];
//!     if let Err(CommError::PeerFailed { rank: 1, .. }) = world.all_reduce_slice(&mut v, ReduceOp::Sum) {
//!         let survivors = world.shrink()?; // world ranks [0, 2]
//!         survivors.all_reduce_slice(&mut v, ReduceOp::Sum)?;
//!     }
//!     Ok(v[0])
//! });
//! assert_eq!(out[0], Ok(Ok(2.0)));
//! assert!(out[1].is_err());
//! assert_eq!(out[2], Ok(Ok(2.0)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! How a collective runs and a world changes:
//!
//! `ThreadWorld::new(W).run(f)` runs `f` on W threads, each with
//! its own `ThreadGroup`. A collective is two barriers around shared-memory work: each rank publishes
//! its signature and buffer address and enters the barrier (spin briefly, then park; the wait times
//! out naming the ranks that did not arrive); every rank compares all signatures; for an all-reduce,
//! rank r reduces chunk r across all peers in rank order (so every rank gets bit-identical results)
//! and writes it into every peer's buffer — no central copy; the exit barrier keeps buffers alive
//! until all peers are done. A dropped handle (also in a panic) marks its rank gone, and pending and
//! later collectives fail with `PeerFailed`. Threads of one rank sharing a handle are serialized per
//! handle, and an interleaving that differs between ranks is a mismatch error. The failed group stays
//! failed; its survivors call `shrink()` (ULFM's `MPIX_Comm_shrink`), which waits, under the group timeout, until every rank that has not left
//! has called it, then hands them all one new group of themselves in their old order, charging the
//! old group's traffic counters; each group shrinks once, and `ThreadWorld::run_each` keeps the
//! survivors' results next to the failed rank's panic. (MPI shrinks through ULFM, below; NCCL
//! returns `Unsupported`.) `grow(ranks)` adds members back: the new group's shared state is made
//! once (through the split registry) and a handle per new rank, marked `joined`, goes down a
//! channel to `run_each`'s own thread, which starts a worker running the world's closure on it
//! (so only a world run by `run_each` grows; the channel lives in the world's `Rendezvous` and
//! those that replace it). MPI grows in `mpi/spawn.rs`: `MPI_Comm_spawn` of the running program,
//! `MPI_Intercomm_merge`, the members' world ranks sent to the new processes, `MPI_Comm_split`
//! ordered by world rank; a spawned process does its side in `MpiWorld::init`
//! (`MPI_Comm_get_parent`), and its runtime, like the members', frees every communicator before
//! leaving (`exit_after_failure`), the spawned one then calling `MPI_Finalize`.

mod group;
mod reduce;
mod rendezvous;

pub use group::ThreadGroup;

use crate::error::CommError;
use crate::group::{Group, ProcessGroup};
use crate::traffic::TrafficChain;
use rendezvous::{Rendezvous, Spawner};
use std::sync::Arc;
use std::time::Duration;

/// Default collective timeout for thread groups.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A world of `size` worker threads. Build it, then either [`run`](ThreadWorld::run) a closure on
/// every worker, or take the raw [`groups`](ThreadWorld::groups) and spawn threads yourself.
///
/// ```
/// use localsgd_comm::{GroupExt, ReduceOp, ThreadWorld};
///
/// let sums = ThreadWorld::new(4)?.run(|group| {
///     let mut v = vec![group.rank() as f32; 3];
///     group.all_reduce_slice(&mut v, ReduceOp::Sum).map(|_| v[0])
/// })?;
/// assert!(sums.iter().all(|s| *s == Ok(6.0)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ThreadWorld {
    size: usize,
    timeout: Duration,
    hosts: Vec<u64>,
}

/// A worker of [`ThreadWorld::run`] panicked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("worker rank {rank} panicked: {message}")]
pub struct WorkerPanicked {
    /// World rank of the worker.
    pub rank: usize,
    /// The panic payload, when it was a string.
    pub message: String,
}

impl ThreadWorld {
    /// A world of `size` workers on one host, with the [default timeout](DEFAULT_TIMEOUT).
    /// Fails for 0 workers and for more than [`max_workers`](Self::max_workers).
    pub fn new(size: usize) -> Result<Self, CommError> {
        if size == 0 {
            return Err(CommError::InvalidConfig(
                "a thread world needs at least 1 worker (got 0)".into(),
            ));
        }
        let max = Self::max_workers();
        if size > max {
            return Err(CommError::InvalidConfig(format!(
                "a thread world of {size} workers needs a thread each, and this machine allows \
                 about {max} (vm.max_map_count / 8, kernel.threads-max / 2): use at most {max} \
                 workers, or one process per rank (MPI)"
            )));
        }
        Ok(Self {
            size,
            timeout: DEFAULT_TIMEOUT,
            hosts: vec![0; size],
        })
    }

    /// The most workers a thread world runs on this machine. Each is a thread, and a thread
    /// takes a slot of the kernel's `threads-max` and a few memory mappings (its stack, guard
    /// pages, a signal stack) out of `vm.max_map_count`; past that, thread creation fails
    /// inside the allocator and the process aborts. On Linux: the smaller of
    /// `max_map_count / 8` and `threads-max / 2`, read from `/proc`; elsewhere 4096.
    pub fn max_workers() -> usize {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
        };
        let maps = read("/proc/sys/vm/max_map_count").map(|m| m / 8);
        let threads = read("/proc/sys/kernel/threads-max").map(|t| t / 2);
        [maps, threads]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(4096)
            .max(1)
    }

    /// Number of workers.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Set how long a collective may wait for its peers before failing.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Pretend the workers live on several hosts (one id per world rank), so intra-node groups
    /// and hierarchical layouts can be exercised in one process.
    pub fn with_hosts(mut self, hosts: Vec<u64>) -> Result<Self, CommError> {
        if hosts.len() != self.size {
            return Err(CommError::InvalidConfig(format!(
                "with_hosts needs one host id per worker: got {} ids for {} workers",
                hosts.len(),
                self.size
            )));
        }
        self.hosts = hosts;
        Ok(self)
    }

    /// One world-group handle per rank, in rank order. Hand each to its own thread. (These
    /// groups cannot [`grow`](crate::ProcessGroup::grow): nothing would start the new workers.)
    pub fn groups(&self) -> Vec<ThreadGroup> {
        self.groups_with(None)
    }

    fn groups_with(&self, spawner: Option<Arc<Spawner>>) -> Vec<ThreadGroup> {
        let shared = Arc::new(Rendezvous::new(
            (0..self.size).collect(),
            self.timeout,
            spawner,
        ));
        let hosts = Arc::new(self.hosts.clone());
        (0..self.size)
            .map(|rank| ThreadGroup::new(rank, shared.clone(), hosts.clone(), TrafficChain::root()))
            .collect()
    }

    /// Run `f` on every worker thread with its world group; returns the results in rank order
    /// (then those of the workers a [`grow`](crate::ProcessGroup::grow) added, in the order
    /// they started).
    ///
    /// A panicking worker drops its handle while unwinding, so its peers' collectives fail fast
    /// with the rank named; the panic itself is reported here as [`WorkerPanicked`] (lowest rank
    /// first). To keep the other ranks' results when one fails (survivors that
    /// [`shrink`](crate::ProcessGroup::shrink) and go on), use [`run_each`](Self::run_each).
    pub fn run<F, R>(&self, f: F) -> Result<Vec<R>, WorkerPanicked>
    where
        F: Fn(Group) -> R + Sync,
        R: Send,
    {
        self.run_each(f).into_iter().collect()
    }

    /// Run `f` on every worker thread with its world group, like [`run`](Self::run), and return
    /// every worker's own outcome: [`WorkerPanicked`] for a worker that panicked (or whose
    /// thread could not be spawned), its result for every other one. The first
    /// [`size`](Self::size) outcomes are the world's workers in rank order; after them come the
    /// workers a [`grow`](crate::ProcessGroup::grow) started (replacements of failed ranks,
    /// running `f` with a handle whose [`joined`](crate::ProcessGroup::joined) is true), in the
    /// order they started. Returns once every worker, started or added, has finished.
    ///
    /// ```
    /// use localsgd_comm::{ProcessGroup, ThreadWorld};
    ///
    /// let out = ThreadWorld::new(3)?.run_each(|group| {
    ///     assert_ne!(group.rank(), 1, "rank 1 fails on purpose");
    ///     group.rank()
    /// });
    /// assert_eq!(out[0], Ok(0));
    /// assert_eq!(out[1].as_ref().map_err(|p| p.rank), Err(1));
    /// assert_eq!(out[2], Ok(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_each<F, R>(&self, f: F) -> Vec<Result<R, WorkerPanicked>>
    where
        F: Fn(Group) -> R + Sync,
        R: Send,
    {
        let (tx, rx) = std::sync::mpsc::channel::<WorkerEnded>();
        let (grow_tx, grow_rx) = std::sync::mpsc::channel::<ThreadGroup>();
        let spawner = Arc::new(Spawner {
            tx: std::sync::Mutex::new(grow_tx),
            hosts: self.hosts.clone(),
        });
        let groups = self.groups_with(Some(spawner));
        let f = &f;
        std::thread::scope(|scope| {
            // Each worker reports its end (also while unwinding) so this thread knows when no
            // worker is left that could still grow the world.
            let start = |g: ThreadGroup, tx: std::sync::mpsc::Sender<WorkerEnded>| {
                let rank = g.world_ranks()[g.rank()];
                let spawned = std::thread::Builder::new()
                    .name(format!("localsgd-rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        let _done = ReportEnd(tx);
                        f(Arc::new(g))
                    });
                (rank, spawned)
            };
            let mut handles: Vec<_> = groups.into_iter().map(|g| start(g, tx.clone())).collect();
            let mut running = handles.iter().filter(|(_, h)| h.is_ok()).count();
            // Ends of workers and handles of added workers arrive on two channels; poll both
            // (a grow is rare, so a short sleep between polls costs nothing measurable). A
            // worker sends the handles it adds before it reports its end, so once every end is
            // in, a last look at the handles finds any sent meanwhile.
            loop {
                while let Ok(g) = grow_rx.try_recv() {
                    let (rank, h) = start(g, tx.clone());
                    running += usize::from(h.is_ok());
                    handles.push((rank, h));
                }
                if running == 0 {
                    break;
                }
                match rx.recv_timeout(Duration::from_millis(5)) {
                    Ok(WorkerEnded) => running -= 1,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            handles
                .into_iter()
                .map(|(rank, h)| {
                    let joined = match h {
                        Ok(h) => h.join().map_err(|payload| panic_message(payload.as_ref())),
                        Err(e) => Err(format!("could not spawn the worker thread: {e}")),
                    };
                    joined.map_err(|message| WorkerPanicked { rank, message })
                })
                .collect()
        })
    }
}

/// A worker's end, as reported to [`ThreadWorld::run_each`].
struct WorkerEnded;

/// Sends [`WorkerEnded`] when dropped: at the worker's return or unwinding.
struct ReportEnd(std::sync::mpsc::Sender<WorkerEnded>);

impl Drop for ReportEnd {
    fn drop(&mut self) {
        let _ = self.0.send(WorkerEnded);
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
