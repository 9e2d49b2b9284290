//! The record of a run's membership changes: which ranks left, which joined, from which
//! iteration the new world went on and how long it took to get going again
//! (`membership.csv` in the run directory).

use std::io::Write;
use std::path::Path;

/// A change of the ranks a run trains on: ranks that failed left, replacements (if any)
/// joined, and the new world went on from the last checkpoint (`on-rank-failure = "continue"`
/// or `"replace"`; book: Fault tolerance).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MembershipChange {
    /// The iteration the new world continues from: the last published checkpoint's (0 without
    /// one). Its averages and data are the new world's from here on.
    pub iteration: u64,
    /// Iterations the old world had completed on this rank when the failure reached it.
    pub detected_at: u64,
    /// Ranks (of the job's first world) that left.
    pub left: Vec<usize>,
    /// Ranks (of the job's first world) whose replacements joined (`replace`; empty with
    /// `continue`).
    pub joined: Vec<usize>,
    /// Ranks (of the job's first world) of the new world, in its rank order.
    pub members: Vec<usize>,
    /// Seconds from the failure reaching this rank to the new world's first completed
    /// iteration (`None` if it completed none); this rank's own measurement.
    pub recovery_seconds: Option<f64>,
}

/// The run directory's record of membership changes (`on-rank-failure = "continue"` or
/// `"replace"`), one row
/// per change.
pub const MEMBERSHIP_FILE: &str = "membership.csv";

/// Append one membership change to `run_dir/membership.csv` (header first when the file is
/// new) and sync it: `iteration` the new world continued from, `detected_at` the iteration the
/// failure reached rank 0 in, `left`, `joined` (replacements) and `members` as ranks of the
/// job's first world separated by spaces, `world_size` after the change, `recovery_seconds` until the new world's first
/// iteration.
pub fn append_membership(run_dir: &Path, change: &MembershipChange) -> std::io::Result<()> {
    let path = run_dir.join(MEMBERSHIP_FILE);
    let new = !path.exists();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    let ranks = |r: &[usize]| r.iter().map(usize::to_string).collect::<Vec<_>>().join(" ");
    let mut text = String::new();
    if new {
        text.push_str("iteration,detected_at,left,joined,world_size,members,recovery_seconds\n");
    }
    text.push_str(&format!(
        "{},{},{},{},{},{},{}\n",
        change.iteration,
        change.detected_at,
        ranks(&change.left),
        ranks(&change.joined),
        change.members.len(),
        ranks(&change.members),
        change
            .recovery_seconds
            .map_or_else(String::new, |s| format!("{s:.6}"))
    ));
    file.write_all(text.as_bytes())?;
    file.sync_all()
}
