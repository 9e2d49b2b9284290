//! The shared state of one thread group: per-rank slots and a generation barrier that fails fast
//! on timeouts and on peers that left.

use crate::error::CommError;
use crate::signature::CallSignature;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a rank published for the current collective: its signature and its buffer.
#[derive(Clone, Copy)]
pub(crate) struct Slot {
    pub sig: CallSignature,
    /// Address of the caller's buffer (valid between the two barriers of a collective).
    pub ptr: usize,
}

/// Why a group can no longer complete collectives.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    Left {
        rank: usize,
        reason: String,
    },
    Timeout {
        call: String,
        waited: Duration,
        missing: Vec<usize>,
    },
}

struct BarrierState {
    generation: u64,
    arrived: Vec<bool>,
    count: usize,
    left: Vec<bool>,
    failure: Option<Failure>,
    shrink: ShrinkState,
}

/// The (one) shrink of a group: who called it, and how it ended. Kept under the barrier's lock
/// because whether it can complete depends on `left`.
struct ShrinkState {
    /// Ranks that called [`Rendezvous::shrink`]; stays set, so a second call is refused.
    called: Vec<bool>,
    outcome: Option<ShrinkOutcome>,
}

enum ShrinkOutcome {
    /// Every live rank arrived: `members` (group ranks, ascending) form `shared`.
    Formed {
        members: Vec<usize>,
        /// Dropped once every member has picked it up.
        shared: Option<Arc<Rendezvous>>,
        unclaimed: usize,
    },
    /// Some live ranks (group ranks) did not call within the timeout.
    TimedOut {
        waited: Duration,
        missing: Vec<usize>,
    },
}

/// One rank's share of a completed shrink.
pub(crate) struct Shrunk {
    /// This rank's rank in the new group.
    pub rank: usize,
    /// The survivors, as ranks of the old group, in order.
    pub members: Vec<usize>,
    /// The new group's shared state.
    pub shared: Arc<Rendezvous>,
}

/// Subgroups being created, keyed by (split sequence number, color): the new group's shared
/// state and how many members have yet to pick it up.
pub(crate) type SplitRegistry = HashMap<(u64, u64), (Arc<Rendezvous>, usize)>;

/// Spin on `done` for a while (yielding now and then); returns whether it became true.
fn spin_until(done: impl Fn() -> bool) -> bool {
    for i in 0..SPIN_LIMIT {
        if done() {
            return true;
        }
        if i % 64 == 63 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    false
}

/// Starts the workers a [`grow`](crate::ProcessGroup::grow) adds: the channel to the thread
/// of [`ThreadWorld::run_each`](super::ThreadWorld::run_each) that runs the world's closure on
/// each handle it receives, and the world's host ids (by world rank) for the new members.
pub(crate) struct Spawner {
    pub tx: Mutex<std::sync::mpsc::Sender<super::group::ThreadGroup>>,
    pub hosts: Vec<u64>,
}

/// Shared by all ranks of one thread group.
pub(crate) struct Rendezvous {
    pub size: usize,
    pub world_ranks: Vec<usize>,
    pub timeout: Duration,
    /// Set on the world group of a world run by `run_each` (and the groups that replace it:
    /// shrunk and grown), `None` elsewhere: which groups can grow.
    pub spawner: Option<Arc<Spawner>>,
    slots: Vec<Mutex<Option<Slot>>>,
    state: Mutex<BarrierState>,
    generation: AtomicU64,
    cv: Condvar,
    /// Set once the shrink has an outcome (spun on before parking, like `generation`).
    shrink_done: AtomicBool,
    /// Subgroups being created (see [`SplitRegistry`]).
    pub registry: Mutex<SplitRegistry>,
}

// Spin this many times on the generation counter before parking on the condvar: collectives
// on small buffers complete in microseconds and a park/unpark costs more than that.
const SPIN_LIMIT: u32 = 2_000;

impl Rendezvous {
    pub fn new(world_ranks: Vec<usize>, timeout: Duration, spawner: Option<Arc<Spawner>>) -> Self {
        let size = world_ranks.len();
        Self {
            size,
            world_ranks,
            timeout,
            spawner,
            slots: (0..size).map(|_| Mutex::new(None)).collect(),
            state: Mutex::new(BarrierState {
                generation: 0,
                arrived: vec![false; size],
                count: 0,
                left: vec![false; size],
                failure: None,
                shrink: ShrinkState {
                    called: vec![false; size],
                    outcome: None,
                },
            }),
            generation: AtomicU64::new(0),
            cv: Condvar::new(),
            shrink_done: AtomicBool::new(false),
            registry: Mutex::new(HashMap::new()),
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, BarrierState> {
        // A poisoned lock only means a peer panicked while holding it; the state itself is
        // always left consistent (plain assignments), so keep going and let `left` report it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn publish(&self, rank: usize, slot: Slot) {
        *self.slots[rank].lock().unwrap_or_else(|e| e.into_inner()) = Some(slot);
    }

    pub fn slot(&self, rank: usize) -> Option<Slot> {
        *self.slots[rank].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn failure_error(&self, failure: &Failure, call: &CallSignature) -> CommError {
        match failure {
            Failure::Left { rank, reason } => CommError::PeerFailed {
                rank: self.world_ranks[*rank],
                reason: reason.clone(),
                call: call.to_string(),
                group: self.world_ranks.clone(),
            },
            Failure::Timeout {
                call,
                waited,
                missing,
            } => CommError::Timeout {
                call: call.clone(),
                waited: *waited,
                missing: missing.iter().map(|&r| self.world_ranks[r]).collect(),
                group: self.world_ranks.clone(),
            },
        }
    }

    /// Arrive at the entry barrier of a collective: fails on a recorded failure, and records a
    /// timeout (naming the ranks that did not arrive) when the wait exceeds the group timeout.
    pub fn enter(&self, rank: usize, call: &CallSignature) -> Result<(), CommError> {
        let mut st = self.lock_state();
        if let Some(f) = &st.failure {
            return Err(self.failure_error(f, call));
        }
        let my_gen = st.generation;
        if self.arrive_locked(&mut st, rank) {
            return Ok(());
        }
        drop(st);
        if self.spin(my_gen) {
            return Ok(());
        }
        self.wait_locked(
            self.lock_state(),
            Instant::now(),
            |st| {
                if st.generation != my_gen {
                    return Some(Ok(()));
                }
                st.failure
                    .as_ref()
                    .map(|f| Err(self.failure_error(f, call)))
            },
            |st, waited| {
                let missing: Vec<usize> = (0..self.size).filter(|&r| !st.arrived[r]).collect();
                let failure = Failure::Timeout {
                    call: call.to_string(),
                    waited,
                    missing,
                };
                let err = self.failure_error(&failure, call);
                st.failure = Some(failure);
                Err(err)
            },
        )
    }

    /// Park on the condition variable until `ready` gives the answer, or until the group
    /// timeout after `start`: then `timed_out` records the timeout in the state (the waiters
    /// are woken to see it) and gives the answer.
    fn wait_locked<R>(
        &self,
        mut st: MutexGuard<'_, BarrierState>,
        start: Instant,
        mut ready: impl FnMut(&mut BarrierState) -> Option<R>,
        timed_out: impl FnOnce(&mut BarrierState, Duration) -> R,
    ) -> R {
        loop {
            if let Some(answer) = ready(&mut st) {
                return answer;
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                let answer = timed_out(&mut st, waited);
                self.cv.notify_all();
                return answer;
            }
            st = self
                .cv
                .wait_timeout(st, self.timeout - waited)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Arrive at the exit barrier of a collective. Peers are between the two barriers doing
    /// bounded memory work on each other's buffers, so this waits for every rank that has not
    /// left, without a timeout: returning early would free a buffer a peer is still writing.
    /// Returns whether a peer left meanwhile (the results may then be incomplete).
    pub fn exit(&self, rank: usize) -> Option<Failure> {
        let mut st = self.lock_state();
        let my_gen = st.generation;
        if self.arrive_locked(&mut st, rank) {
            return None;
        }
        drop(st);
        if self.spin(my_gen) {
            return None;
        }
        let mut st = self.lock_state();
        loop {
            if st.generation != my_gen {
                return None;
            }
            let live_missing = (0..self.size).any(|r| !st.arrived[r] && !st.left[r]);
            if !live_missing {
                // Everyone still alive is here: complete the barrier without the leavers.
                let failure = st.failure.clone();
                self.complete_locked(&mut st);
                return failure;
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn spin(&self, my_gen: u64) -> bool {
        spin_until(|| self.generation.load(Ordering::Acquire) != my_gen)
    }

    /// Take part in the shrink of this group (see [`ProcessGroup::shrink`]): wait until every
    /// rank that has not left has called it (a rank leaving meanwhile wakes the waiters, which
    /// then complete without it), or until the group timeout. The first caller to see every
    /// live rank arrived creates the new group's state; the others pick it up.
    ///
    /// One shrink per group: a second call by a rank, or a call after the shrink timed out, is
    /// an error at once. The collective state (`failure`, the barrier) is neither read nor
    /// changed.
    ///
    /// [`ProcessGroup::shrink`]: crate::ProcessGroup::shrink
    pub fn shrink(&self, rank: usize) -> Result<Shrunk, CommError> {
        let mut st = self.lock_state();
        if let Some(ShrinkOutcome::TimedOut { waited, missing }) = &st.shrink.outcome {
            return Err(self.shrink_timeout(*waited, missing));
        }
        if st.shrink.called[rank] || st.shrink.outcome.is_some() {
            return Err(self.shrunk_already());
        }
        st.shrink.called[rank] = true;
        if self.try_form_locked(&mut st) {
            return self.claim_locked(&mut st, rank);
        }
        drop(st);
        spin_until(|| self.shrink_done.load(Ordering::Acquire));
        self.wait_locked(
            self.lock_state(),
            Instant::now(),
            |st| {
                (st.shrink.outcome.is_some() || self.try_form_locked(st))
                    .then(|| self.claim_locked(st, rank))
            },
            |st, waited| {
                let missing: Vec<usize> = (0..self.size)
                    .filter(|&r| !st.left[r] && !st.shrink.called[r])
                    .collect();
                let err = self.shrink_timeout(waited, &missing);
                st.shrink.outcome = Some(ShrinkOutcome::TimedOut { waited, missing });
                self.shrink_done.store(true, Ordering::Release);
                Err(err)
            },
        )
    }

    /// Form the shrunk group if every rank that has not left has called shrink. Returns whether
    /// it formed now.
    fn try_form_locked(&self, st: &mut BarrierState) -> bool {
        if st.shrink.outcome.is_some()
            || (0..self.size).any(|r| !st.left[r] && !st.shrink.called[r])
        {
            return false;
        }
        // A rank that called cannot have left since: its handle is borrowed by the call.
        let members: Vec<usize> = (0..self.size)
            .filter(|&r| !st.left[r] && st.shrink.called[r])
            .collect();
        let world = members.iter().map(|&r| self.world_ranks[r]).collect();
        st.shrink.outcome = Some(ShrinkOutcome::Formed {
            unclaimed: members.len(),
            shared: Some(Arc::new(Rendezvous::new(
                world,
                self.timeout,
                self.spawner.clone(),
            ))),
            members,
        });
        self.shrink_done.store(true, Ordering::Release);
        self.cv.notify_all();
        true
    }

    /// This rank's share of the shrink's outcome.
    fn claim_locked(&self, st: &mut BarrierState, rank: usize) -> Result<Shrunk, CommError> {
        match &mut st.shrink.outcome {
            Some(ShrinkOutcome::Formed {
                members,
                shared,
                unclaimed,
            }) => {
                let new_rank = members.iter().position(|&r| r == rank);
                let (Some(new_rank), Some(new_shared)) = (new_rank, shared.clone()) else {
                    // Unreachable: members are exactly the callers, and each claims once.
                    return Err(self.shrunk_already());
                };
                *unclaimed -= 1;
                if *unclaimed == 0 {
                    *shared = None;
                }
                Ok(Shrunk {
                    rank: new_rank,
                    members: members.clone(),
                    shared: new_shared,
                })
            }
            Some(ShrinkOutcome::TimedOut { waited, missing }) => {
                Err(self.shrink_timeout(*waited, missing))
            }
            None => Err(self.shrunk_already()),
        }
    }

    fn shrink_timeout(&self, waited: Duration, missing: &[usize]) -> CommError {
        CommError::Timeout {
            call: "shrink".to_string(),
            waited,
            missing: missing.iter().map(|&r| self.world_ranks[r]).collect(),
            group: self.world_ranks.clone(),
        }
    }

    fn shrunk_already(&self) -> CommError {
        CommError::InvalidConfig(format!(
            "group {:?} was shrunk already: this rank already called shrink on it (one shrink \
             per group); after a further failure, shrink the group the first shrink returned",
            self.world_ranks
        ))
    }

    /// Returns true when this arrival completed the barrier.
    fn arrive_locked(&self, st: &mut BarrierState, rank: usize) -> bool {
        st.arrived[rank] = true;
        st.count += 1;
        let live = st.left.iter().filter(|&&l| !l).count();
        if st.count >= live {
            self.complete_locked(st);
            true
        } else {
            false
        }
    }

    fn complete_locked(&self, st: &mut BarrierState) {
        st.count = 0;
        st.arrived.iter_mut().for_each(|a| *a = false);
        st.generation += 1;
        self.generation.store(st.generation, Ordering::Release);
        self.cv.notify_all();
    }

    /// Record that `rank` left the group (its handle was dropped, possibly while panicking).
    pub fn leave(&self, rank: usize, reason: String) {
        let mut st = self.lock_state();
        st.left[rank] = true;
        if st.failure.is_none() {
            st.failure = Some(Failure::Left { rank, reason });
        }
        // A leaver may complete an exit barrier, or a shrink, the others were waiting on.
        self.cv.notify_all();
    }
}
