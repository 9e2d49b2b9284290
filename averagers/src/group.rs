//! Groups of chosen ranks, for averaging within a group some ranks are not part of (PyTorch's
//! `new_group(ranks)`).

use crate::error::AveragerError;
use localsgd_comm::Group;

/// Collectively create a group of the ranks `members` of `parent` (ranks of `parent`, in any
/// order; the new group orders them by their rank in `parent`). Every rank of `parent` must call
/// this with the same `members`. Returns `Some(group)` on members and `None` elsewhere; pass the
/// result to [`average_if_member`](crate::average_if_member).
///
/// Errors (on every rank, before any communication): no members, a member outside
/// `0..parent.size()`, a member listed twice.
pub fn new_group(parent: &Group, members: &[usize]) -> Result<Option<Group>, AveragerError> {
    let size = parent.size();
    let invalid = |reason: String| AveragerError::InvalidMembers {
        members: members.to_vec(),
        size,
        reason,
    };
    if members.is_empty() {
        return Err(invalid("a group needs at least one member".into()));
    }
    if let Some(&bad) = members.iter().find(|&&m| m >= size) {
        return Err(invalid(format!("rank {bad} is not in 0..{size}")));
    }
    for (i, m) in members.iter().enumerate() {
        if members[..i].contains(m) {
            return Err(invalid(format!("rank {m} is listed twice")));
        }
    }
    let member = members.contains(&parent.rank());
    let group = parent.split(if member { 0 } else { 1 })?;
    Ok(member.then_some(group))
}
