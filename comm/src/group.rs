//! The process-group contract every backend (threads, MPI, NCCL) implements.

use crate::buffer::{BufferMut, Element};
use crate::error::CommError;
use crate::signature::{CallSignature, ReduceOp};
use crate::traffic::Traffic;
use std::fmt::Debug;
use std::sync::Arc;

/// A shared handle to one rank's view of a process group. Cheap to clone.
pub type Group = Arc<dyn ProcessGroup>;

/// One rank's handle on a group of ranks that communicate.
///
/// Contract, for every backend:
/// - Every collective is called by all ranks of the group, in the same order, with the same
///   signature (kind, element type, length, op, root). A backend detects disagreement where it can
///   and returns [`CommError::Mismatch`] on every participant instead of a wrong result.
/// - Collectives work in place on the caller's buffer.
/// - A failed peer or a timeout is an error, never a hang.
/// - Creating subgroups is collective and deterministic: all ranks of this group call
///   [`split`](ProcessGroup::split) / [`new_subgroups`](ProcessGroup::new_subgroups) /
///   [`intra_node`](ProcessGroup::intra_node) in the same order.
pub trait ProcessGroup: Send + Sync + Debug {
    /// This rank's index within the group, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn size(&self) -> usize;
    /// World ranks of the members, indexed by group rank.
    fn world_ranks(&self) -> &[usize];
    /// Backend name ("threads", "mpi", "nccl").
    fn backend(&self) -> &'static str;

    /// All-reduce `buf` in place with `op`. Every rank ends with bit-identical results.
    fn all_reduce(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<(), CommError>;
    /// Overwrite `buf` on every rank with the root's `buf` (`root` is a group rank).
    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), CommError>;
    /// Wait until every rank of the group has arrived.
    fn barrier(&self) -> Result<(), CommError>;
    /// Gather a small vector from every rank (all ranks pass the same length); returns the
    /// concatenation in group-rank order. Meant for flags and fingerprints, not bulk data.
    fn all_gather_u64(&self, local: &[u64]) -> Result<Vec<u64>, CommError>;
    /// Gather `local` from every rank: `out` (length `size() * local.len()`; every rank passes
    /// the same `local.len()`) receives rank r's bytes at `r * local.len()..`, in group-rank
    /// order. For bulk data whose sum would overflow or mean nothing: compressed (quantized,
    /// sparse) pseudo-gradients, decoded and combined by each rank.
    ///
    /// - Traffic: one collective of `local.len()` bytes, counted as data
    ///   ([`Traffic::data_bytes`]): the bytes this rank contributes, as an all-reduce counts
    ///   its buffer (a ring moves `(size() - 1) * local.len()` bytes per rank; see
    ///   [`CallSignature::payload_bytes`]).
    /// - Errors: an `out` of another length is [`CommError::OutputLength`] naming both
    ///   lengths, returned before any communication (this rank then does not take part). Ranks
    ///   passing different `local.len()` get [`CommError::Mismatch`] where the backend checks
    ///   signatures (the signature is [`CallSignature::all_gather_bytes`]); a failed peer or a
    ///   timeout is an error, as for every collective.
    fn all_gather_bytes(&self, local: &[u8], out: &mut [u8]) -> Result<(), CommError>;

    /// Exchange equal blocks with every rank: `send` and `recv` are `size()` blocks of the same
    /// length (every rank passes the same lengths); block `j` of `send` goes to rank `j`, and
    /// block `r` of `recv` is rank `r`'s block for this rank (its own block is copied). The
    /// quantized all-reduce's first half: each rank sends every owner its shard.
    ///
    /// - Traffic: one collective of one block's bytes, counted as data (its wire bytes,
    ///   `(size() - 1)` blocks, [`CallSignature::wire_bytes`]).
    /// - Errors: buffers whose lengths differ or are not a multiple of `size()` are
    ///   [`CommError::OutputLength`], before any communication; otherwise as for every
    ///   collective.
    ///
    /// The thread and MPI backends exchange the blocks (`MPI_Alltoall`). This default, which
    /// NCCL uses, gathers every rank's whole `send` (an [`all_gather_bytes`](Self::all_gather_bytes)
    /// of `size()` blocks, charged as such: `size()` times the bytes) and keeps its blocks.
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let size = self.size();
        let block = validate_all_to_all(size, send.len(), recv.len())?;
        let mut all = vec![0u8; size * send.len()];
        self.all_gather_bytes(send, &mut all)?;
        let me = self.rank();
        for (r, dst) in recv.chunks_exact_mut(block.max(1)).enumerate().take(size) {
            let at = r * send.len() + me * block;
            dst.copy_from_slice(&all[at..at + block]);
        }
        Ok(())
    }

    /// Collectively split this group: ranks passing the same `color` form one new group, ordered
    /// by their rank in this group. Returns this rank's new group.
    fn split(&self, color: u64) -> Result<Group, CommError>;
    /// Collectively create a second communicator over the same ranks (same rank order) for
    /// collectives issued from another thread of each rank while this group keeps working: the
    /// helper of [`AsyncGroup`](crate::AsyncGroup). The two never share a queue, so their
    /// collectives cannot interleave wrongly; each keeps its own order across ranks.
    ///
    /// Its traffic is *not* charged to this group as it happens: whoever issues work on it
    /// charges it with [`charge`](ProcessGroup::charge) at a point every rank agrees on (the
    /// start), so per-iteration counters do not depend on thread timing.
    ///
    /// Errors when the backend cannot run two communicators from two threads at once (MPI
    /// without `MPI_THREAD_MULTIPLE`).
    fn dedicated(&self) -> Result<Group, CommError>;

    /// The members of this group that are still alive, as a new group (ULFM's
    /// `MPIX_Comm_shrink`).
    ///
    /// - Collective over the survivors only: every rank that has not failed calls it on the
    ///   same group, typically after a collective failed with [`CommError::PeerFailed`] (or,
    ///   under MPI, [`CommError::Revoked`]). It
    ///   does not need the failure cleared: the old group stays failed, and the new one is
    ///   healthy. On a group where nobody failed it returns an equivalent group of all members.
    /// - Survivors keep their relative order (new rank = position among the survivors);
    ///   [`world_ranks`](ProcessGroup::world_ranks) of the new group are the survivors' world
    ///   ranks, and [`host_id`](ProcessGroup::host_id)s carry over.
    /// - Traffic: the new group replaces the old one in the accounting: it charges the same
    ///   counters (the old group's, then its ancestors'), so its
    ///   [`traffic`](ProcessGroup::traffic) continues the old group's totals and a counter
    ///   read before the failure on the old group subtracts from one read after it on the new
    ///   group.
    /// - Errors: [`CommError::Timeout`] (call `"shrink"`) naming the live ranks that did not
    ///   call it within the group's timeout. Shrinking the same group a second time is an
    ///   error, never a hang: shrink the group the first shrink returned instead (repeatedly,
    ///   after each further failure).
    ///
    /// Backends: the thread backend; MPI with ULFM (Open MPI 5 under `mpirun --with-ft ulfm`).
    /// A second shrink of one group is [`CommError::InvalidConfig`] on both. Under MPI a shrink
    /// revokes every communicator of the group's world first (so even without a failure the
    /// other groups of that world are unusable afterwards), and a survivor that never calls it
    /// is ended by the watchdog at the group timeout instead of a returned
    /// [`CommError::Timeout`]. The default (NCCL) returns [`CommError::Unsupported`].
    fn shrink(&self) -> Result<Group, CommError> {
        Err(CommError::Unsupported {
            operation: "shrink",
            backend: self.backend(),
            hint: "continuing after a rank failure needs the thread backend (ThreadWorld) or MPI \
                   with ULFM; with this backend, restart the run without the failed rank"
                .into(),
        })
    }

    /// This group with new members at world ranks `ranks`, started by the backend to replace
    /// ranks that failed (the way back after a [`shrink`](ProcessGroup::shrink)).
    ///
    /// - Collective over the current members, who all pass the same `ranks`: world ranks that
    ///   are no member's (typically the ranks the shrink lost), each once, at least one. The
    ///   backend starts one new process or thread per rank; each gets a handle on the grown
    ///   group whose [`joined`](ProcessGroup::joined) is true, and takes part in the grown
    ///   group's collectives from its first one on. What a new member runs, and how it learns
    ///   the state it continues from (a broadcast from a live member, say), is the caller's.
    /// - The grown group is ordered by world rank (a new member takes the position its world
    ///   rank gives it); the members' [`host_id`](ProcessGroup::host_id)s carry over. The
    ///   members' new handles charge this handle's traffic counters (as after a shrink); a
    ///   new member's count from zero.
    /// - Errors: [`CommError::InvalidConfig`] for a rank that is a member, repeated, or for an
    ///   empty list, and when the members pass different lists; a failed peer or a timeout as
    ///   for any collective.
    ///
    /// Backends: the thread backend, on a world run by
    /// [`ThreadWorld::run_each`](crate::ThreadWorld::run_each) (or `run`), which starts the
    /// new workers with the world's closure; MPI, which starts this program again with this
    /// process's arguments (`MPI_Comm_spawn`; the job needs free slots, `mpirun
    /// --oversubscribe`), its new processes finding their place in
    /// `MpiWorld::init`. The default (NCCL) returns
    /// [`CommError::Unsupported`].
    fn grow(&self, ranks: &[usize]) -> Result<Group, CommError> {
        let _ = ranks;
        Err(CommError::Unsupported {
            operation: "grow",
            backend: self.backend(),
            hint: "replacing a failed rank in a running job needs the thread or MPI backend; \
                   with this backend, restart the job and resume its last checkpoint"
                .into(),
        })
    }

    /// Whether this handle is the one a [`grow`](ProcessGroup::grow) gave a new member (a
    /// replacement started to join a running world), rather than a handle of a member that
    /// was there: true only on that grown group's handle of the new member (its subgroups,
    /// and the groups a later shrink or grow returns, say false). Not collective. `false`
    /// unless a backend knows better.
    fn joined(&self) -> bool {
        false
    }

    /// Record `sig` in this group's traffic counters (and its ancestors'), for a collective run
    /// on this group's behalf on a [`dedicated`](ProcessGroup::dedicated) communicator.
    fn charge(&self, sig: &CallSignature);

    /// Host identifier of this rank (ranks with equal ids share a machine).
    fn host_id(&self) -> u64;
    /// Whether this rank was started knowing that its host runs more ranks than it has cores
    /// (MPI: Open MPI's `mpi_yield_when_idle`, or the oversubscription flag its launcher sets).
    /// Work that a helper thread would overlap then runs blocking where the caller lets it
    /// choose: the helper would take the core another rank's compute needs. Not collective;
    /// ranks on different hosts may differ. `false` unless a backend knows better.
    fn ranks_share_cores(&self) -> bool {
        false
    }
    /// Traffic counters of this group on this rank (including subgroups split from it).
    fn traffic(&self) -> Traffic;

    /// The ranks of this group that run on this rank's host (threads in one process: all of
    /// them; MPI: the shared-memory split). Collective.
    fn intra_node(&self) -> Result<Group, CommError> {
        self.split(self.host_id())
    }

    /// Collectively cut the group into contiguous blocks of `size` ranks and return this rank's
    /// block (size 2 on 4 ranks: {0,1} and {2,3}).
    ///
    /// Errors (checked identically on every rank, before any communication): size 0, a size
    /// larger than the group, a size that does not divide the group size.
    fn new_subgroups(&self, size: usize) -> Result<Group, CommError> {
        validate_subgroup_size(size, self.size())?;
        self.split((self.rank() / size) as u64)
    }
}

/// Check a block size for [`ProcessGroup::new_subgroups`] against a group of `group_size` ranks.
pub fn validate_subgroup_size(size: usize, group_size: usize) -> Result<(), CommError> {
    if size == 0 {
        return Err(CommError::InvalidSubgroupSize(
            "subgroup size must be positive (got 0)".into(),
        ));
    }
    if size > group_size {
        return Err(CommError::InvalidSubgroupSize(format!(
            "subgroup size {size} must not exceed the group size {group_size}"
        )));
    }
    if !group_size.is_multiple_of(size) {
        return Err(CommError::InvalidSubgroupSize(format!(
            "group size {group_size} must be divisible by subgroup size {size}"
        )));
    }
    Ok(())
}

/// Check the world ranks a [`grow`](ProcessGroup::grow) of a group with world ranks `current`
/// adds: at least one, none twice, none a member ([`CommError::InvalidConfig`] otherwise).
pub(crate) fn validate_grow(current: &[usize], ranks: &[usize]) -> Result<(), CommError> {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if ranks.is_empty() || sorted.len() != ranks.len() || ranks.iter().any(|r| current.contains(r))
    {
        return Err(CommError::InvalidConfig(format!(
            "grow needs new world ranks, each once, none of them a member of the group \
             {current:?}: got {ranks:?}"
        )));
    }
    Ok(())
}

/// Check that every member of `group` passes the same `ranks` to a grow: the lengths are
/// gathered first, then the lists, so members that disagree all learn it from the same data
/// ([`CommError::InvalidConfig`] on every one of them).
pub(crate) fn check_same_grow<G: ProcessGroup + ?Sized>(
    group: &G,
    ranks: &[usize],
) -> Result<(), CommError> {
    let lengths = group.all_gather_u64(&[ranks.len() as u64])?;
    let disagree = |other: String| {
        CommError::InvalidConfig(format!(
            "grow: the members of {:?} add different ranks ({ranks:?} here, {other} on a peer): \
             every member must pass the same list",
            group.world_ranks()
        ))
    };
    if let Some(n) = lengths.iter().find(|&&n| n != ranks.len() as u64) {
        return Err(disagree(format!("{n} ranks")));
    }
    let wanted: Vec<u64> = ranks.iter().map(|&r| r as u64).collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let all = group.all_gather_u64(&wanted)?;
    if let Some(other) = all.chunks(wanted.len()).find(|c| *c != wanted.as_slice()) {
        return Err(disagree(format!("{other:?}")));
    }
    Ok(())
}

/// Check the output buffer of an [`all_gather_bytes`](ProcessGroup::all_gather_bytes) on a
/// group of `group_size` ranks: `out_len` must be `group_size * local_len`
/// ([`CommError::OutputLength`] for `call` otherwise). For backends, before any communication.
pub fn validate_gather_output(
    call: &CallSignature,
    group_size: usize,
    local_len: usize,
    out_len: usize,
) -> Result<(), CommError> {
    // Saturating: a product past usize::MAX is no buffer's length, so still a mismatch.
    let expected = group_size.saturating_mul(local_len);
    if out_len == expected {
        return Ok(());
    }
    Err(CommError::OutputLength {
        call: format!("{call} on {group_size} ranks"),
        expected,
        actual: out_len,
    })
}

/// Check the buffers of an [`all_to_all_bytes`](ProcessGroup::all_to_all_bytes) on a group of
/// `group_size` ranks: both of one length, a multiple of `group_size`
/// ([`CommError::OutputLength`] otherwise). Returns the block length. For backends, before any
/// communication.
pub fn validate_all_to_all(
    group_size: usize,
    send_len: usize,
    recv_len: usize,
) -> Result<usize, CommError> {
    let block = send_len / group_size.max(1);
    let call = CallSignature::all_to_all_bytes(block);
    if !send_len.is_multiple_of(group_size.max(1)) {
        return Err(CommError::OutputLength {
            call: format!("{call} on {group_size} ranks: the send buffer"),
            expected: (block + 1) * group_size,
            actual: send_len,
        });
    }
    if recv_len != send_len {
        return Err(CommError::OutputLength {
            call: format!("{call} on {group_size} ranks"),
            expected: send_len,
            actual: recv_len,
        });
    }
    Ok(block)
}

/// Typed conveniences over [`ProcessGroup`] for `&mut [f32]`, `&mut [f64]`, ...
pub trait GroupExt: ProcessGroup {
    /// All-reduce a typed slice in place.
    fn all_reduce_slice<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce(T::buffer(buf), op)
    }
    /// Broadcast a typed slice in place from `root`.
    fn broadcast_slice<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        self.broadcast(T::buffer(buf), root)
    }
    /// Average a typed slice the way the reference does: divide by the group size first, then
    /// sum (the rounding of the book's semantics §1: `flat /= size; all_reduce_sum(flat)`).
    fn average_slice<T: Element>(&self, buf: &mut [T]) -> Result<(), CommError> {
        let n = self.size();
        for x in buf.iter_mut() {
            *x = x.div_count(n);
        }
        self.all_reduce(T::buffer(buf), ReduceOp::Sum)
    }
    /// Replace `bytes` on every rank with the root's `bytes` (any length; the others' contents
    /// and lengths do not matter). Two broadcasts: the length, then the bytes packed eight to
    /// an `f64`'s bits (a broadcast copies bits unchanged, on every backend). For state handed
    /// from one rank to the others: a live rank's checkpoint file to a replacement that
    /// [`joined`](ProcessGroup::joined).
    fn broadcast_bytes(&self, bytes: &mut Vec<u8>, root: usize) -> Result<(), CommError> {
        let mut len = [bytes.len() as u64 as f64];
        // Lengths up to 2^53 are exact in an f64.
        self.broadcast_slice(&mut len, root)?;
        let len = len[0] as usize;
        let mut words: Vec<f64> = vec![0.0; len.div_ceil(8)];
        if self.rank() == root {
            for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
                let mut b = [0u8; 8];
                b[..chunk.len()].copy_from_slice(chunk);
                *w = f64::from_bits(u64::from_le_bytes(b));
            }
        }
        self.broadcast_slice(&mut words, root)?;
        if self.rank() != root {
            bytes.clear();
            bytes.extend(words.iter().flat_map(|w| w.to_bits().to_le_bytes()));
            bytes.truncate(len);
        }
        Ok(())
    }
    /// Whether every rank passed `true` (one small all-gather).
    fn all_true(&self, flag: bool) -> Result<bool, CommError> {
        Ok(self.all_gather_u64(&[flag as u64])?.iter().all(|&v| v == 1))
    }
}

impl<G: ProcessGroup + ?Sized> GroupExt for G {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group that implements only what the trait requires, so the defaults show.
    #[derive(Debug)]
    struct Minimal;

    impl ProcessGroup for Minimal {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            1
        }
        fn world_ranks(&self) -> &[usize] {
            &[0]
        }
        fn backend(&self) -> &'static str {
            "minimal"
        }
        fn all_reduce(&self, _: BufferMut<'_>, _: ReduceOp) -> Result<(), CommError> {
            Ok(())
        }
        fn broadcast(&self, _: BufferMut<'_>, _: usize) -> Result<(), CommError> {
            Ok(())
        }
        fn barrier(&self) -> Result<(), CommError> {
            Ok(())
        }
        fn all_gather_u64(&self, local: &[u64]) -> Result<Vec<u64>, CommError> {
            Ok(local.to_vec())
        }
        fn all_gather_bytes(&self, local: &[u8], out: &mut [u8]) -> Result<(), CommError> {
            out.copy_from_slice(local);
            Ok(())
        }
        fn split(&self, _: u64) -> Result<Group, CommError> {
            Ok(Arc::new(Minimal))
        }
        fn dedicated(&self) -> Result<Group, CommError> {
            Ok(Arc::new(Minimal))
        }
        fn charge(&self, _: &CallSignature) {}
        fn host_id(&self) -> u64 {
            0
        }
        fn traffic(&self) -> Traffic {
            Traffic::default()
        }
    }

    #[test]
    fn default_shrink_is_unsupported_and_says_what_to_use() {
        let err = Minimal.shrink().unwrap_err();
        assert!(
            matches!(
                err,
                CommError::Unsupported {
                    operation: "shrink",
                    backend: "minimal",
                    ..
                }
            ),
            "{err}"
        );
        let message = err.to_string();
        assert!(
            message.starts_with("shrink is not supported by the minimal backend: "),
            "{message}"
        );
        assert!(message.contains("thread backend"), "{message}");
    }
}
