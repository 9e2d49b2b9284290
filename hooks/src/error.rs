//! Typed errors of the hooks and the gradient reducer.

use localsgd_comm::CommError;

/// Everything that can go wrong while communicating gradients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    /// A collective (or the parameter flattening glue) failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A saved [`HookState`](crate::HookState) does not fit the hook it is loaded into (another
    /// hook kind, or another configuration).
    #[error("cannot load hook state: {0}")]
    StateMismatch(String),
    /// A hook left a bucket in a shape the reducer cannot write back (another length or element
    /// type than it was given).
    #[error("invalid bucket: {0}")]
    InvalidBucket(String),
}

impl HookError {
    /// Whether the hook failed because a peer is gone ([`CommError::is_peer_lost`]).
    pub fn is_peer_lost(&self) -> bool {
        matches!(self, HookError::Comm(c) if c.is_peer_lost())
    }
}
