//! Where the survivors of a failure continue: the last published checkpoint, agreed by all of
//! them.

use super::store::CheckpointStore;
use super::{RecoveryError, Start};
use crate::checkpoint::CheckpointError;
use crate::settings::SettingError;
use localsgd_comm::Group;

/// Where the survivors continue after a rank failure, and whether some survivor's world failed
/// again before completing an iteration (agreed): the last published checkpoint, if it is one
/// of this job's (`checkpoints`: its iterations and this rank's saved rank in it); the start
/// when there is none, or when `latest` names another job's checkpoint (a run directory used
/// before) that this job neither wrote nor resumed from. Collective over `survivors`.
pub(super) fn continue_point(
    checkpoints: &[(u64, usize)],
    survivors: &Group,
    store: Option<&dyn CheckpointStore>,
    failed_again: bool,
) -> Result<(Start, bool), RecoveryError> {
    let store = store.ok_or_else(|| {
        RecoveryError::Setting(SettingError::new(
            "on-rank-failure",
            "continue",
            "`abort`, or a run directory: the survivors continue from its last checkpoint",
        ))
    })?;
    let latest = store.latest()?;
    // Every survivor must continue from the same checkpoint: a file system that shows the
    // hosts different `latest` files (stale metadata caches) would part them. Whether the
    // world failed again before an iteration is agreed too (a survivor may have completed the
    // iteration another did not).
    let gathered =
        survivors.all_gather_u64(&[latest.unwrap_or(u64::MAX), u64::from(failed_again)])?;
    let failed_again = gathered.chunks(2).any(|g| g[1] == 1);
    let seen: Vec<u64> = gathered.chunks(2).map(|g| g[0]).collect();
    if seen.iter().any(|&s| s != seen[0]) {
        let named: Vec<String> = seen
            .iter()
            .map(|&s| match s {
                u64::MAX => "none".to_string(),
                s => s.to_string(),
            })
            .collect();
        return Err(RecoveryError::Checkpoint(CheckpointError::Incompatible(
            format!(
                "the survivors see different latest checkpoints in {} (by rank: {}): the run \
             directory must be on a file system that shows every rank the same files",
                store.location().display(),
                named.join(", ")
            ),
        )));
    }
    let Some(latest) = latest else {
        return Ok((Start::Fresh, failed_again));
    };
    let start = match checkpoints.iter().find(|&&(i, _)| i == latest) {
        Some(&(_, saved_rank)) => Start::ResumeFrom(saved_rank),
        None => {
            tracing::warn!(
                latest,
                "the latest checkpoint in {} is not this job's: the survivors start over",
                store.location().display()
            );
            Start::Fresh
        }
    };
    Ok((start, failed_again))
}
