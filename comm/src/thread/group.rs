//! `ThreadGroup`: one rank's handle on a group of threads in this process.

use super::reduce::{chunk, reduce_chunk};
use super::rendezvous::{Rendezvous, Slot};
use crate::buffer::{BufferMut, Element, with_typed_slice};
use crate::error::CommError;
use crate::group::{Group, ProcessGroup, validate_gather_output};
use crate::signature::{CallSignature, ReduceOp};
use crate::traffic::{Traffic, TrafficChain};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One rank's handle on a group of worker threads (the embedded backend).
///
/// Created by [`ThreadWorld`](super::ThreadWorld). Dropping the handle (normally or while
/// panicking) tells the peers this rank is gone: their pending and later collectives on the group
/// fail with [`CommError::PeerFailed`] naming it.
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Rendezvous>,
    /// Host id of every member, by group rank.
    hosts: Arc<Vec<u64>>,
    traffic: TrafficChain,
    splits: AtomicU64,
    /// Serializes collectives issued through this handle by several threads of one rank (like a
    /// communicator's queue): each still enters the group in the order it got the lock, so ranks
    /// whose threads interleave differently get a mismatch error, never a corrupted barrier.
    issue: Mutex<()>,
    /// Whether a [`grow`](ProcessGroup::grow) started this rank to join a running world.
    joined: bool,
}

impl fmt::Debug for ThreadGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadGroup")
            .field("rank", &self.rank)
            .field("world_ranks", &self.shared.world_ranks)
            .finish()
    }
}

impl ThreadGroup {
    pub(crate) fn new(
        rank: usize,
        shared: Arc<Rendezvous>,
        hosts: Arc<Vec<u64>>,
        traffic: TrafficChain,
    ) -> Self {
        Self {
            rank,
            shared,
            hosts,
            traffic,
            splits: AtomicU64::new(0),
            issue: Mutex::new(()),
            joined: false,
        }
    }

    /// Run one collective: publish, enter, check signatures, run `body` on the peers' buffer
    /// addresses, exit. `body` receives the addresses in group-rank order.
    fn collective<R>(
        &self,
        sig: CallSignature,
        ptr: usize,
        body: impl FnOnce(&[usize]) -> R,
    ) -> Result<R, CommError> {
        let _issuing = self.issue.lock().unwrap_or_else(|e| e.into_inner());
        let shared = &*self.shared;
        shared.publish(self.rank, Slot { sig, ptr });
        shared.enter(self.rank, &sig)?;
        let slots: Vec<Option<Slot>> = (0..shared.size).map(|r| shared.slot(r)).collect();
        let agree = slots.iter().all(|s| s.is_some_and(|s| s.sig == sig));
        let result = if agree {
            let ptrs: Vec<usize> = slots.iter().map(|s| s.map_or(0, |s| s.ptr)).collect();
            Ok(body(&ptrs))
        } else {
            Err(CommError::Mismatch {
                calls: slots
                    .iter()
                    .enumerate()
                    .map(|(r, s)| {
                        let call = s.map_or_else(|| "nothing".to_string(), |s| s.sig.to_string());
                        (shared.world_ranks[r], call)
                    })
                    .collect(),
                group: shared.world_ranks.clone(),
            })
        };
        if let Some(failure) = shared.exit(self.rank) {
            return Err(shared.failure_error(&failure, &sig));
        }
        self.traffic.record(&sig, self.size());
        result
    }

    fn all_reduce_typed<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let sig = CallSignature::all_reduce(op, T::TYPE, buf.len());
        let len = buf.len();
        let (rank, size) = (self.rank, self.shared.size);
        self.collective(sig, buf.as_mut_ptr() as usize, |addrs| {
            let ptrs: Vec<*mut T> = addrs.iter().map(|&a| a as *mut T).collect();
            let (start, end) = chunk(len, rank, size);
            // SAFETY: every peer published a live buffer of `len` elements (signatures agree)
            // and stays inside this collective until the exit barrier; ranks touch disjoint
            // chunks.
            unsafe { reduce_chunk(&ptrs, start, end, op) };
        })
    }

    fn broadcast_typed<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        if root >= self.shared.size {
            return Err(CommError::InvalidRoot {
                root,
                size: self.shared.size,
            });
        }
        let sig = CallSignature::broadcast(root, T::TYPE, buf.len());
        let len = buf.len();
        let me = self.rank;
        let dst = buf.as_mut_ptr();
        self.collective(sig, dst as usize, |addrs| {
            if me != root && len > 0 {
                // SAFETY: the root's buffer has `len` elements and is only read until the exit
                // barrier; `dst` is this rank's own buffer.
                unsafe { std::ptr::copy_nonoverlapping(addrs[root] as *const T, dst, len) };
            }
        })
    }

    /// `split`, with the new group charging `traffic`.
    fn split_into(&self, color: u64, traffic: TrafficChain) -> Result<Group, CommError> {
        let colors = {
            let sig = CallSignature::split();
            let local = [color];
            self.collective(sig, local.as_ptr() as usize, |addrs| {
                addrs
                    .iter()
                    // SAFETY: each peer's one-element `local` outlives the collective.
                    .map(|&a| unsafe { *(a as *const u64) })
                    .collect::<Vec<u64>>()
            })?
        };
        let seq = self.splits.fetch_add(1, Ordering::Relaxed);
        let members: Vec<usize> = (0..colors.len()).filter(|&r| colors[r] == color).collect();
        let new_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| CommError::InvalidConfig("rank missing from its own split".into()))?;
        let shared = {
            let mut registry = self
                .shared
                .registry
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let entry = registry.entry((seq, color)).or_insert_with(|| {
                let world: Vec<usize> = members
                    .iter()
                    .map(|&r| self.shared.world_ranks[r])
                    .collect();
                (
                    Arc::new(Rendezvous::new(world, self.shared.timeout, None)),
                    members.len(),
                )
            });
            let shared = entry.0.clone();
            entry.1 -= 1;
            if entry.1 == 0 {
                registry.remove(&(seq, color));
            }
            shared
        };
        let hosts: Vec<u64> = members.iter().map(|&r| self.hosts[r]).collect();
        Ok(Arc::new(ThreadGroup::new(
            new_rank,
            shared,
            Arc::new(hosts),
            traffic,
        )))
    }
}

impl ThreadGroup {
    /// [`ProcessGroup::grow`] on this backend (see the trait's documentation; the new workers
    /// run the closure of [`ThreadWorld::run_each`](super::ThreadWorld::run_each)).
    fn grow_into(&self, ranks: &[usize]) -> Result<Group, CommError> {
        let spawner = self
            .shared
            .spawner
            .clone()
            .ok_or_else(|| CommError::Unsupported {
                operation: "grow",
                backend: "threads",
                hint: "only a world run by ThreadWorld::run (or run_each) can start new workers; \
                   groups taken with ThreadWorld::groups cannot grow"
                    .into(),
            })?;
        let current = &self.shared.world_ranks;
        crate::group::check_same_grow(self, ranks)?;
        crate::group::validate_grow(current, ranks)?;
        let mut world: Vec<usize> = current.iter().chain(ranks).copied().collect();
        world.sort_unstable();
        let host = |r: usize| spawner.hosts.get(r).copied().unwrap_or(0);
        let hosts = Arc::new(world.iter().map(|&r| host(r)).collect::<Vec<u64>>());
        let seq = self.splits.fetch_add(1, Ordering::Relaxed);
        let (shared, created) = {
            let mut registry = self
                .shared
                .registry
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // A color no split uses at this sequence number (each number is one split or grow).
            let key = (seq, u64::MAX);
            let created = !registry.contains_key(&key);
            let entry = registry.entry(key).or_insert_with(|| {
                let shared =
                    Rendezvous::new(world.clone(), self.shared.timeout, Some(spawner.clone()));
                (Arc::new(shared), current.len())
            });
            let shared = entry.0.clone();
            entry.1 -= 1;
            if entry.1 == 0 {
                registry.remove(&key);
            }
            (shared, created)
        };
        if created {
            let tx = spawner.tx.lock().unwrap_or_else(|e| e.into_inner());
            for &r in ranks {
                let rank = world.iter().position(|&w| w == r).unwrap_or(0);
                let mut joiner =
                    ThreadGroup::new(rank, shared.clone(), hosts.clone(), TrafficChain::root());
                joiner.joined = true;
                // The receiver lives as long as any worker of the world; if it is gone, the
                // handle is dropped here and the members see the rank leave.
                let _ = tx.send(joiner);
            }
        }
        let rank = world
            .iter()
            .position(|&w| w == current[self.rank])
            .ok_or_else(|| CommError::InvalidConfig("rank missing from its own grow".into()))?;
        Ok(Arc::new(ThreadGroup::new(
            rank,
            shared,
            hosts,
            self.traffic.clone(),
        )))
    }
}

impl Drop for ThreadGroup {
    fn drop(&mut self) {
        let reason = if std::thread::panicking() {
            "its worker panicked"
        } else {
            "its group handle was dropped"
        };
        self.shared.leave(self.rank, reason.to_string());
    }
}

impl ProcessGroup for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn world_ranks(&self) -> &[usize] {
        &self.shared.world_ranks
    }

    fn backend(&self) -> &'static str {
        "threads"
    }

    fn all_reduce(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        with_typed_slice!(buf, b => self.all_reduce_typed(b, op))
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), CommError> {
        with_typed_slice!(buf, b => self.broadcast_typed(b, root))
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.collective(CallSignature::barrier(), 0, |_| ())
    }

    fn all_gather_u64(&self, local: &[u64]) -> Result<Vec<u64>, CommError> {
        let len = local.len();
        let sig = CallSignature::all_gather(len);
        self.collective(sig, local.as_ptr() as usize, |addrs| {
            let mut out = Vec::with_capacity(len * addrs.len());
            for &a in addrs {
                // SAFETY: each peer's `local` has `len` elements and outlives the collective.
                out.extend_from_slice(unsafe { std::slice::from_raw_parts(a as *const u64, len) });
            }
            out
        })
    }

    /// Each rank copies every peer's published `local` straight into its own `out` (one
    /// `memcpy` per peer, no lock, no central copy); the exit barrier keeps the peers' buffers
    /// alive until every rank has copied.
    fn all_gather_bytes(&self, local: &[u8], out: &mut [u8]) -> Result<(), CommError> {
        let len = local.len();
        let sig = CallSignature::all_gather_bytes(len);
        validate_gather_output(&sig, self.shared.size, len, out.len())?;
        self.collective(sig, local.as_ptr() as usize, |addrs| {
            if len == 0 {
                return;
            }
            for (&a, dst) in addrs.iter().zip(out.chunks_exact_mut(len)) {
                // SAFETY: each peer's `local` has `len` bytes (signatures agree) and is only
                // read until the exit barrier; `dst` is part of this rank's own `out`, which no
                // peer sees.
                dst.copy_from_slice(unsafe { std::slice::from_raw_parts(a as *const u8, len) });
            }
        })
    }

    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let size = self.shared.size;
        let block = crate::group::validate_all_to_all(size, send.len(), recv.len())?;
        let sig = CallSignature::all_to_all_bytes(block);
        let me = self.rank;
        self.collective(sig, send.as_ptr() as usize, |addrs| {
            if block == 0 {
                return;
            }
            for (&a, dst) in addrs.iter().zip(recv.chunks_exact_mut(block)) {
                // SAFETY: each peer's `send` has `size * block` bytes (signatures agree) and is
                // only read until the exit barrier; this rank reads its own block of each, and
                // `dst` is part of its own `recv`, which no peer sees.
                dst.copy_from_slice(unsafe {
                    std::slice::from_raw_parts((a + me * block) as *const u8, block)
                });
            }
        })
    }

    fn split(&self, color: u64) -> Result<Group, CommError> {
        self.split_into(color, self.traffic.child())
    }

    fn dedicated(&self) -> Result<Group, CommError> {
        self.split_into(0, TrafficChain::root())
    }

    /// Waits (spin, then park) until every member that has not left has called `shrink` on
    /// this group, or until the group timeout ([`CommError::Timeout`], call `"shrink"`, naming
    /// the live members that did not call). A member dropping its handle meanwhile wakes the
    /// waiters, which then complete without it. Every survivor gets a handle on one new shared
    /// group state; the new handles charge this handle's traffic counters (see the trait).
    ///
    /// One shrink per group: calling it again on this group (from this rank, after a shrink
    /// formed or timed out) returns an error at once — [`CommError::InvalidConfig`] after a
    /// formed shrink, the same [`CommError::Timeout`] after a timed-out one. Shrink the
    /// returned group after a further failure. Does not queue behind collectives issued
    /// through this handle by other threads of this rank.
    fn shrink(&self) -> Result<Group, CommError> {
        let shrunk = self.shared.shrink(self.rank)?;
        let hosts: Vec<u64> = shrunk.members.iter().map(|&r| self.hosts[r]).collect();
        Ok(Arc::new(ThreadGroup::new(
            shrunk.rank,
            shrunk.shared,
            Arc::new(hosts),
            self.traffic.clone(),
        )))
    }

    /// Every member adds the same `ranks` (checked with one all-gather); the world's
    /// [`run_each`](super::ThreadWorld::run_each) starts one worker thread per new rank, which
    /// runs the world's closure with its handle on the grown group ([`joined`](Self::joined):
    /// true). Only a world run by `run`/`run_each` (and the groups its shrinks and grows
    /// return) can grow: elsewhere [`CommError::Unsupported`]. The new group waits for the new
    /// workers at its first collective, within the group timeout.
    fn grow(&self, ranks: &[usize]) -> Result<Group, CommError> {
        self.grow_into(ranks)
    }

    fn joined(&self) -> bool {
        self.joined
    }

    fn charge(&self, sig: &CallSignature) {
        self.traffic.record(sig, self.size());
    }

    fn host_id(&self) -> u64 {
        self.hosts[self.rank]
    }

    fn traffic(&self) -> Traffic {
        self.traffic.snapshot()
    }
}
