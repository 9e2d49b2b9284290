//! The embedded backend: W worker threads in one process, each with its own group handle.

mod group;
mod reduce;
mod rendezvous;

pub use group::ThreadGroup;

use crate::error::CommError;
use crate::group::Group;
use crate::traffic::TrafficChain;
use rendezvous::Rendezvous;
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

    /// One world-group handle per rank, in rank order. Hand each to its own thread.
    pub fn groups(&self) -> Vec<ThreadGroup> {
        let shared = Arc::new(Rendezvous::new((0..self.size).collect(), self.timeout));
        let hosts = Arc::new(self.hosts.clone());
        (0..self.size)
            .map(|rank| ThreadGroup::new(rank, shared.clone(), hosts.clone(), TrafficChain::root()))
            .collect()
    }

    /// Run `f` on every worker thread with its world group; returns the results in rank order.
    ///
    /// A panicking worker drops its handle while unwinding, so its peers' collectives fail fast
    /// with the rank named; the panic itself is reported here as [`WorkerPanicked`] (lowest rank
    /// first).
    pub fn run<F, R>(&self, f: F) -> Result<Vec<R>, WorkerPanicked>
    where
        F: Fn(Group) -> R + Sync,
        R: Send,
    {
        let groups = self.groups();
        let f = &f;
        std::thread::scope(|scope| {
            let handles: Vec<_> = groups
                .into_iter()
                .enumerate()
                .map(|(rank, g)| {
                    std::thread::Builder::new()
                        .name(format!("localsgd-rank-{rank}"))
                        .spawn_scoped(scope, move || f(Arc::new(g)))
                })
                .collect();
            let mut results = Vec::with_capacity(self.size);
            let mut first_panic = None;
            for (rank, h) in handles.into_iter().enumerate() {
                let joined = match h {
                    Ok(h) => h.join().map_err(|payload| panic_message(payload.as_ref())),
                    Err(e) => Err(format!("could not spawn the worker thread: {e}")),
                };
                match joined {
                    Ok(r) => results.push(r),
                    Err(message) => {
                        first_panic.get_or_insert(WorkerPanicked { rank, message });
                    }
                }
            }
            match first_panic {
                Some(p) => Err(p),
                None => Ok(results),
            }
        })
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
