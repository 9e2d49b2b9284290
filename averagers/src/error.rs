//! Typed errors of the averagers: invalid configurations, ranks that disagree on what to average,
//! mismatched saved state, and communication failures.

use localsgd_comm::CommError;
use std::fmt;

/// What one rank intended to average, as reported during the agreement check that precedes every
/// fused all-reduce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankParams {
    /// World rank.
    pub rank: usize,
    /// Number of selected parameter tensors.
    pub params: u64,
    /// Total number of elements of those tensors.
    pub elements: u64,
    /// Element type of the flat buffer ("f32" or "f64").
    pub element_type: &'static str,
    /// [`FlatLayout::fingerprint`](localsgd_comm::params::FlatLayout::fingerprint) of the
    /// selection (traversal positions and sizes of the selected tensors).
    pub fingerprint: u64,
}

impl fmt::Display for RankParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} has {} parameter tensor(s) with {} {} element(s) (layout {:016x})",
            self.rank, self.params, self.elements, self.element_type, self.fingerprint
        )
    }
}

/// Everything that can go wrong when building an averager or averaging parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AveragerError {
    /// `warmup_steps` was negative.
    #[error("warmup_steps must be non-negative (got {0})")]
    NegativeWarmup(i64),
    /// A periodic averager's period was 0.
    #[error("period must be positive (got {0}); use 1 to average after every step")]
    NonPositivePeriod(u64),
    /// A hierarchical averager was given no levels.
    #[error(
        "levels must not be empty: give at least one (period, group size) level, the last one \
         averaging over the whole group"
    )]
    EmptyLevels,
    /// A hierarchical level's period was 0 (every level is checked, not just the first).
    #[error("period must be positive: level {index} is (period {period}, group size {size})")]
    NonPositiveLevelPeriod {
        /// Position of the level in the list (0-based).
        index: usize,
        /// Its period.
        period: u64,
        /// Its group size.
        size: usize,
    },
    /// Hierarchical levels whose periods are not strictly increasing: a later level with a period
    /// not larger than an earlier one would shadow it (PyTorch silently never uses the shadowed
    /// level; we refuse).
    #[error(
        "levels must have strictly increasing periods: level {index} (period {period}, group size \
         {size}) follows level {previous_index} (period {previous_period}, group size \
         {previous_size}) and would shadow it"
    )]
    ShadowedLevel {
        /// Position of the offending level.
        index: usize,
        /// Its period.
        period: u64,
        /// Its group size.
        size: usize,
        /// Position of the level before it.
        previous_index: usize,
        /// That level's period.
        previous_period: u64,
        /// That level's group size.
        previous_size: usize,
    },
    /// The last hierarchical level does not cover the whole group.
    #[error(
        "the last level must average over the whole group of {group_size} ranks: level {index} is \
         (period {period}, group size {size})"
    )]
    LastLevelNotWholeGroup {
        /// Position of the last level.
        index: usize,
        /// Its period.
        period: u64,
        /// Its group size.
        size: usize,
        /// Size of the averager's group.
        group_size: usize,
    },
    /// A hierarchical level's group size cannot cut the group into contiguous blocks.
    #[error("level {index} (period {period}, group size {size}): {reason}")]
    InvalidLevelGroupSize {
        /// Position of the level.
        index: usize,
        /// Its period.
        period: u64,
        /// Its group size.
        size: usize,
        /// Why the size is invalid (0, larger than the group, or not dividing it).
        reason: String,
    },
    /// `new_group` was given members that are not distinct ranks of the parent group.
    #[error("invalid group members {members:?} for a group of {size} ranks: {reason}")]
    InvalidMembers {
        /// The requested members (ranks of the parent group).
        members: Vec<usize>,
        /// Size of the parent group.
        size: usize,
        /// What is wrong with them.
        reason: String,
    },
    /// Ranks of the averaging group selected different parameter sets (different tensors, sizes
    /// or element types), so a fused all-reduce would hang or mix unrelated values.
    #[error(
        "ranks of group {group:?} disagree on the parameters to average: {}",
        ranks.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    ParameterSetMismatch {
        /// World ranks of the averaging group.
        group: Vec<usize>,
        /// What every rank reported, in group-rank order.
        ranks: Vec<RankParams>,
    },
    /// A saved averager state does not belong to this averager's configuration.
    #[error(
        "cannot load averager state saved for {saved} into an averager configured as {current}"
    )]
    StateMismatch {
        /// The configuration stored in the state.
        saved: String,
        /// This averager's configuration.
        current: String,
    },
    /// An overlap delay outside `1..=period`, or an overlapped average that cannot be started,
    /// applied or restored as its schedule says (the message names the steps).
    #[error("overlapped averaging: {0}")]
    Overlap(String),
    /// An outer-optimizer setting, state or step that cannot be used (the message names the
    /// value and what would be valid).
    #[error("outer averaging: {0}")]
    Outer(String),
    /// A collective failed (peer failure, timeout, mismatch) or parameters could not be
    /// flattened / written back.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A lossy codec's settings are invalid, or a peer's message could not be decoded (the
    /// codec's message).
    #[error("pseudo-gradient codec: {0}")]
    Codec(String),
}

impl AveragerError {
    /// Whether the average failed because a peer is gone
    /// ([`CommError::is_peer_lost`](localsgd_comm::CommError::is_peer_lost)).
    pub fn is_peer_lost(&self) -> bool {
        matches!(self, AveragerError::Comm(c) if c.is_peer_lost())
    }
}

impl From<localsgd_comm::codec::QuantizedMeanError> for AveragerError {
    fn from(e: localsgd_comm::codec::QuantizedMeanError) -> Self {
        match e {
            localsgd_comm::codec::QuantizedMeanError::Comm(c) => AveragerError::Comm(c),
            other => AveragerError::Codec(other.to_string()),
        }
    }
}

impl From<localsgd_comm::codec::CodecError> for AveragerError {
    fn from(e: localsgd_comm::codec::CodecError) -> Self {
        AveragerError::Codec(e.to_string())
    }
}
