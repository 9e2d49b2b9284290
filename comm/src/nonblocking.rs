//! Non-blocking collectives: start now, complete later ([`AsyncGroup`], [`Pending`]).
//!
//! An [`AsyncGroup`] owns a [dedicated](crate::ProcessGroup::dedicated) communicator over the
//! ranks of a group and one helper thread that drives it. [`AsyncGroup::start_all_reduce`] hands
//! an owned buffer to the helper and returns at once with a [`Pending`] handle; [`Pending::wait`]
//! gives the reduced buffer back (the same allocation: the collective works in place), and
//! [`Pending::test`] asks without blocking. [`AsyncGroup::start_all_gather_bytes`] does the same
//! for a byte all-gather (compressed payloads); its wait gives the gathered bytes of every rank.
//! Meanwhile the calling thread keeps computing and may issue collectives on the original group:
//! the two communicators never share a queue.
//!
//! The guarantees are the blocking ones, because the helper runs the backend's own blocking
//! collective: mismatch detection, [`CommError::PeerFailed`] / [`CommError::Timeout`] naming
//! ranks (so a wait never hangs), bit-identical results on every rank.
//!
//! # The ordering rule
//!
//! Every rank starts the same non-blocking collectives on an `AsyncGroup` in the same order (the
//! helper runs them first-in first-out), and the *completion point* of each — where the program
//! waits for it — is fixed by the program's schedule, the same on every rank. Completion itself
//! does not communicate, so completion order never has to agree; starting order does. A
//! collective still pending when the group is [closed](AsyncGroup::close) is an error
//! ([`CommError::LeftPending`]), not a silent drop and not a hang.
//!
//! # Traffic
//!
//! A non-blocking collective is charged to the original group's traffic counters when it is
//! *started* (on the starting thread, like a blocking collective issued there), not when the
//! helper happens to finish it, so per-iteration counters are the same on every run and equal
//! those of the blocking schedule.
//!
//! ```
//! use localsgd_comm::{AsyncGroup, ReduceOp, ThreadWorld};
//!
//! let out = ThreadWorld::new(2)?.run(|group| {
//!     let mut side = AsyncGroup::new(group.clone()).unwrap();
//!     let rank = group.rank() as f32;
//!     let pending = side.start_all_reduce(vec![rank, 1.0], ReduceOp::Sum).unwrap();
//!     // ... compute, or use `group` for other collectives ...
//!     let sum = pending.wait().unwrap();
//!     side.close().unwrap();
//!     sum
//! })?;
//! assert_eq!(out[0], vec![1.0, 2.0]);
//! assert_eq!(out[1], vec![1.0, 2.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::buffer::Element;
use crate::error::CommError;
use crate::group::Group;
use crate::signature::{CallSignature, ReduceOp};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce(&Group) + Send>;

/// Threads of this process blocked in [`Pending::wait`]. While there is one, the helper that
/// drives a dedicated MPI communicator polls its pieces without sleeping: the waiting thread's
/// core is free, and every sleep between two polls is time the transfer stands still (Open
/// MPI's TCP transport moves data only inside a poll).
static BLOCKED_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Whether a thread of this process is blocked waiting for a non-blocking collective.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn someone_waits() -> bool {
    BLOCKED_WAITERS.load(Ordering::Relaxed) > 0
}

/// Non-blocking collectives over the ranks of a group (see the [module docs](self)).
pub struct AsyncGroup {
    parent: Group,
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    /// Started and not yet waited for.
    outstanding: Arc<AtomicU64>,
    started: u64,
}

impl std::fmt::Debug for AsyncGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncGroup")
            .field("group", &self.parent)
            .field("started", &self.started)
            .field("outstanding", &self.outstanding.load(Ordering::Relaxed))
            .finish()
    }
}

impl AsyncGroup {
    /// Non-blocking collectives over `group`'s ranks. Collective on `group` (it creates the
    /// dedicated communicator). Fails where the backend cannot drive two communicators from two
    /// threads (MPI without `MPI_THREAD_MULTIPLE`).
    pub fn new(group: Group) -> Result<Self, CommError> {
        let side = group.dedicated()?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let worker = std::thread::Builder::new()
            .name(format!(
                "localsgd-async-{}",
                group.world_ranks()[group.rank()]
            ))
            .spawn(move || {
                for job in queue {
                    job(&side);
                }
            })
            .map_err(|e| CommError::Backend {
                backend: group.backend(),
                message: format!("cannot start the non-blocking collectives' thread: {e}"),
            })?;
        Ok(Self {
            parent: group,
            jobs: Some(jobs),
            worker: Some(worker),
            outstanding: Arc::new(AtomicU64::new(0)),
            started: 0,
        })
    }

    /// The group whose ranks take part (and whose traffic counters are charged).
    pub fn group(&self) -> &Group {
        &self.parent
    }

    /// Non-blocking collectives started on this group so far.
    pub fn started(&self) -> u64 {
        self.started
    }

    /// Started collectives not yet waited for.
    pub fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Start an all-reduce of `buf` with `op`; returns at once.
    pub fn start_all_reduce<T: Element>(
        &mut self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Result<Pending<T>, CommError> {
        let sig = CallSignature::all_reduce(op, T::TYPE, buf.len());
        self.submit(sig, move |side| {
            let outcome = side.all_reduce(T::buffer(&mut buf), op);
            (buf, outcome)
        })
    }

    /// Start an all-gather of `local` (see
    /// [`ProcessGroup::all_gather_bytes`](crate::ProcessGroup::all_gather_bytes)); returns at
    /// once. [`Pending::wait`] gives back the gathered bytes: `size * local.len()` of them,
    /// rank r's at `r * local.len()..`. Charged to the group's traffic now, as the blocking call
    /// counts it (`local.len()` bytes of data).
    pub fn start_all_gather_bytes(&mut self, local: Vec<u8>) -> Result<Pending<u8>, CommError> {
        let sig = CallSignature::all_gather_bytes(local.len());
        let total = self.parent.size().checked_mul(local.len()).ok_or_else(|| {
            CommError::InvalidConfig(format!(
                "{sig} on {} ranks: the gathered bytes exceed the address space",
                self.parent.size()
            ))
        })?;
        self.submit(sig, move |side| {
            let mut out = vec![0u8; total];
            let outcome = side.all_gather_bytes(&local, &mut out);
            (out, outcome)
        })
    }

    /// Start an average of `buf` with the reference's rounding (divide by the group size, then
    /// sum, as [`GroupExt::average_slice`](crate::GroupExt::average_slice)); returns at once.
    pub fn start_average<T: Element>(&mut self, mut buf: Vec<T>) -> Result<Pending<T>, CommError> {
        let n = self.parent.size();
        for x in buf.iter_mut() {
            *x = x.div_count(n);
        }
        self.start_all_reduce(buf, ReduceOp::Sum)
    }

    /// Queue `run` (on the helper: the collective, returning its result buffer and outcome)
    /// and charge `sig` to the group now.
    fn submit<T: Send + 'static>(
        &mut self,
        sig: CallSignature,
        run: impl FnOnce(&Group) -> (Vec<T>, Result<(), CommError>) + Send + 'static,
    ) -> Result<Pending<T>, CommError> {
        let (done, result) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |side| {
            // The receiver is gone only if the handle was dropped unwaited: nothing to tell.
            let _ = done.send(run(side));
        });
        let stopped = || CommError::Backend {
            backend: self.parent.backend(),
            message: "the non-blocking collectives' thread has stopped".into(),
        };
        self.jobs
            .as_ref()
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| stopped())?;
        self.parent.charge(&sig);
        self.started += 1;
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        Ok(Pending {
            result,
            done: None,
            sig,
            parent: self.parent.clone(),
            outstanding: self.outstanding.clone(),
            index: self.started - 1,
        })
    }

    /// Finish: wait for the helper to run everything started, stop it, and check that every
    /// started collective was waited for. Returns [`CommError::LeftPending`] otherwise (the
    /// collectives themselves still ran, so peers are not left hanging).
    pub fn close(mut self) -> Result<(), CommError> {
        self.shutdown();
        match self.outstanding() {
            0 => Ok(()),
            count => Err(CommError::LeftPending {
                count,
                started: self.started,
            }),
        }
    }

    fn shutdown(&mut self) {
        drop(self.jobs.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Drop for AsyncGroup {
    fn drop(&mut self) {
        self.shutdown();
        let left = self.outstanding();
        if left > 0 {
            tracing::warn!(
                left,
                "a non-blocking collectives group was dropped with collectives never waited for"
            );
        }
    }
}

/// A non-blocking collective in flight (from [`AsyncGroup`]).
///
/// Dropping it without [`wait`](Pending::wait) does not cancel the collective (peers need this
/// rank's part); it is then reported by [`AsyncGroup::close`].
#[derive(Debug)]
pub struct Pending<T> {
    result: mpsc::Receiver<(Vec<T>, Result<(), CommError>)>,
    done: Option<(Vec<T>, Result<(), CommError>)>,
    sig: CallSignature,
    parent: Group,
    outstanding: Arc<AtomicU64>,
    index: u64,
}

impl<T> Pending<T> {
    /// What this collective is.
    pub fn signature(&self) -> CallSignature {
        self.sig
    }

    /// Its position among the group's non-blocking collectives (0 for the first started).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Whether it has completed (never blocks).
    pub fn test(&mut self) -> bool {
        if self.done.is_none()
            && let Ok(done) = self.result.try_recv()
        {
            self.done = Some(done);
        }
        self.done.is_some()
    }

    /// Block until it completes; the buffer comes back with the result (for an all-gather, the
    /// gathered bytes).
    pub fn wait(mut self) -> Result<Vec<T>, CommError> {
        let (buf, outcome) = match self.done.take() {
            Some(done) => done,
            None => {
                BLOCKED_WAITERS.fetch_add(1, Ordering::Relaxed);
                let received = self.result.recv();
                BLOCKED_WAITERS.fetch_sub(1, Ordering::Relaxed);
                received.map_err(|_| CommError::Backend {
                    backend: self.parent.backend(),
                    message: format!(
                        "the non-blocking collectives' thread stopped before finishing {}",
                        self.sig
                    ),
                })?
            }
        };
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        outcome?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ThreadWorld;
    use std::time::{Duration, Instant};

    /// A thread blocked in `Pending::wait` is seen by `someone_waits` (what lets the MPI helper
    /// poll without sleeping): rank 1 joins the all-reduce only once it sees rank 0 waiting.
    #[test]
    fn a_thread_blocked_in_wait_is_seen_waiting() {
        let out = ThreadWorld::new(2)
            .unwrap()
            .run(|group| {
                let mut side = AsyncGroup::new(group.clone()).unwrap();
                let saw_a_waiter = if group.rank() == 1 {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while !someone_waits() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    someone_waits()
                } else {
                    true
                };
                let pending = side.start_all_reduce(vec![1.0f32], ReduceOp::Sum).unwrap();
                let sum = pending.wait().unwrap();
                side.close().unwrap();
                (saw_a_waiter, sum)
            })
            .unwrap();
        for (saw_a_waiter, sum) in out {
            assert!(saw_a_waiter, "rank 0's wait was not registered");
            assert_eq!(sum, vec![2.0]);
        }
    }
}
