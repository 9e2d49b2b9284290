//! Typed errors returned by every collective and group operation.

use std::time::Duration;

/// Everything that can go wrong in a collective or a group operation.
///
/// Every variant names the ranks involved (as *world* ranks) so a user reading a log from one rank
/// knows which peer to look at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// A peer panicked, dropped its group handle, or (MPI/NCCL) died, so the collective cannot
    /// complete.
    #[error("rank {rank} failed ({reason}); collective {call} on group {group:?} cannot complete")]
    PeerFailed {
        /// World rank of the peer that failed.
        rank: usize,
        /// What happened to it.
        reason: String,
        /// The collective this rank was attempting.
        call: String,
        /// World ranks of the group.
        group: Vec<usize>,
    },
    /// A peer revoked the group after a rank failed (MPI with ULFM: `MPIX_ERR_REVOKED`), so no
    /// collective on it completes any more; the survivors [`shrink`](crate::ProcessGroup::shrink).
    #[error("group {group:?} was revoked after a rank failed; collective {call} cannot complete")]
    Revoked {
        /// The collective this rank was attempting.
        call: String,
        /// World ranks of the group.
        group: Vec<usize>,
    },
    /// The collective did not complete within the group's timeout.
    #[error(
        "collective {call} on group {group:?} timed out after {waited:?}: rank(s) {missing:?} did not arrive"
    )]
    Timeout {
        /// The collective that timed out.
        call: String,
        /// How long this rank waited.
        waited: Duration,
        /// World ranks that never arrived.
        missing: Vec<usize>,
        /// World ranks of the group.
        group: Vec<usize>,
    },
    /// Ranks of one group issued different collectives (kind, element type, length, op or root).
    #[error("collective mismatch on group {group:?}: {}", describe_calls(calls))]
    Mismatch {
        /// What each rank called: (world rank, description).
        calls: Vec<(usize, String)>,
        /// World ranks of the group.
        group: Vec<usize>,
    },
    /// A subgroup size that cannot partition the group.
    #[error("invalid subgroup size: {0}")]
    InvalidSubgroupSize(String),
    /// A broadcast root outside the group.
    #[error("broadcast root {root} is not a rank of this group (valid: 0..{size})")]
    InvalidRoot {
        /// The root that was asked for.
        root: usize,
        /// The group size.
        size: usize,
    },
    /// An output buffer whose length does not fit the collective (for
    /// [`all_gather_bytes`](crate::ProcessGroup::all_gather_bytes): group size x the local
    /// length). Checked on this rank before any communication, so this rank does not take part
    /// in the collective.
    #[error("{call}: the output buffer has length {actual}, but the collective needs {expected}")]
    OutputLength {
        /// The collective that was called.
        call: String,
        /// The length the collective needs.
        expected: usize,
        /// The length passed.
        actual: usize,
    },
    /// A world or group configuration that cannot work (zero workers, bad host list, ...).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// Two ranks disagree about a parameter layout (set, order or sizes of tensors).
    #[error("parameter layout differs across ranks: {0}")]
    LayoutMismatch(String),
    /// Burn-side problem while flattening or writing back parameters.
    #[error("parameter flattening failed: {0}")]
    Params(String),
    /// Non-blocking collectives were started and never waited for before their group closed.
    #[error(
        "{count} of {started} non-blocking collectives were never waited for; every started \
         collective must be completed at its completion point"
    )]
    LeftPending {
        /// Collectives never waited for.
        count: u64,
        /// Collectives started on the group.
        started: u64,
    },
    /// An operation this backend does not offer (or not in this situation), with what to do
    /// instead.
    #[error("{operation} is not supported by the {backend} backend: {hint}")]
    Unsupported {
        /// The operation that was called (`"shrink"`, ...).
        operation: &'static str,
        /// Backend name ("threads", "mpi", "nccl").
        backend: &'static str,
        /// What to use or do instead.
        hint: String,
    },
    /// A backend-specific failure (MPI, NCCL).
    #[error("{backend} backend error: {message}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What it reported.
        message: String,
    },
}

impl CommError {
    /// Whether this error says a peer is gone: it failed, or (MPI with ULFM) the group was
    /// revoked after a failure. What a run that survives a failed rank recovers from.
    pub fn is_peer_lost(&self) -> bool {
        matches!(
            self,
            CommError::PeerFailed { .. } | CommError::Revoked { .. }
        )
    }
}

fn describe_calls(calls: &[(usize, String)]) -> String {
    calls
        .iter()
        .map(|(rank, call)| format!("rank {rank} called {call}"))
        .collect::<Vec<_>>()
        .join(", ")
}
