//! The hand-over to replacements (`OnRankFailure::Replace`): after the survivors grew the world
//! back, the lowest live rank sends each new rank a [`Handover`] header and the failed rank's
//! file of the checkpoint the world continues from, over `broadcast_bytes`.

use super::membership::MembershipChange;
use super::store::CheckpointStore;
use super::{RecoveryError, Start};
use crate::checkpoint::CheckpointError;
use localsgd_comm::{CommError, Group, GroupExt};
use std::time::{Duration, Instant};

/// What a live rank hands a replacement that joined the world, before the rank file it
/// continues from.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Handover {
    /// The saved rank whose file of the latest checkpoint follows (`None`: the world starts
    /// over from the initial weights, there being no checkpoint of this job).
    saved_rank: Option<usize>,
    /// Iterations that checkpoint holds (0 without one).
    iterations: u64,
    /// Iterations the old world had completed when the failure reached it: what the replaced
    /// rank had done up to there has happened.
    pub(super) detected_at: u64,
    /// Seconds from the failure reaching the sender to the hand-over (the replacement's
    /// recovery time starts that much earlier).
    since_detected: f64,
    /// The configured number of workers (the world may be smaller after a failure that was
    /// not replaced).
    pub(super) workers: usize,
    /// The run's membership changes so far, this one last.
    pub(super) membership: Vec<MembershipChange>,
    /// Why the sender could not hand over the state (the replacement then leaves, and the
    /// world goes on without it).
    error: Option<String>,
}

/// A [`Handover`] before the sender picks each replacement's file.
pub(super) struct PreparedHandover<'a> {
    header: Handover,
    /// The sender's saved rank in the latest checkpoint (`None`: no checkpoint).
    own: Option<usize>,
    detected: Instant,
    store: Option<&'a dyn CheckpointStore>,
}

impl<'a> PreparedHandover<'a> {
    /// What the sender hands the replacements: `start` is where the world continues (the
    /// sender's own saved rank of the latest checkpoint, or the start).
    pub(super) fn new(
        start: &Start,
        detected_at: u64,
        detected: Instant,
        workers: usize,
        membership: &[MembershipChange],
        store: Option<&'a dyn CheckpointStore>,
    ) -> Self {
        Self {
            header: Handover {
                saved_rank: None,
                iterations: 0,
                detected_at,
                since_detected: 0.0,
                workers,
                membership: membership.to_vec(),
                error: None,
            },
            own: match start {
                Start::ResumeFrom(own) => Some(*own),
                _ => None,
            },
            detected,
            store,
        }
    }

    /// The message for the replacement of world rank `job_rank`: the header, then the file of
    /// the rank that held `job_rank` in the saving world (or, when it held none, the sender's
    /// own), or the header with `error` set.
    fn message(&self, job_rank: usize) -> Vec<u8> {
        let mut header = Handover {
            since_detected: self.detected.elapsed().as_secs_f64(),
            membership: self.header.membership.clone(),
            error: None,
            ..self.header
        };
        let file = (|| -> Result<Option<(usize, Vec<u8>, u64)>, String> {
            let (Some(own), Some(store)) = (self.own, self.store) else {
                return Ok(None);
            };
            store
                .rank_bytes(job_rank, own)
                .map(Some)
                .map_err(|e| e.to_string())
        })();
        let bytes = match file {
            Ok(Some((saved_rank, bytes, iterations))) => {
                header.saved_rank = Some(saved_rank);
                header.iterations = iterations;
                bytes
            }
            Ok(None) => Vec::new(),
            Err(e) => {
                header.error = Some(e);
                Vec::new()
            }
        };
        // A plain struct of numbers, strings and lists always serializes.
        let json = serde_json::to_vec(&header).unwrap_or_default();
        let mut message = Vec::with_capacity(8 + json.len() + bytes.len());
        message.extend_from_slice(&(json.len() as u64).to_le_bytes());
        message.extend_from_slice(&json);
        message.extend_from_slice(&bytes);
        message
    }
}

/// The live ranks' side of a replacement joining `grown` (collective over it, with
/// [`receive`] on the new ranks): the lowest live rank sends each new rank, in rank order, its
/// [`Handover`] message. It always sends one, with `error` set when it could not read the
/// file, so that no rank waits for a message that never comes.
pub(super) fn send(grown: &Group, handover: PreparedHandover<'_>) -> Result<(), CommError> {
    let (joined, root) = layout(grown)?;
    for &new in &joined {
        let mut message = if grown.rank() == root {
            handover.message(grown.world_ranks()[new])
        } else {
            Vec::new()
        };
        grown.broadcast_bytes(&mut message, root)?;
    }
    Ok(())
}

/// A replacement's side of [`send`]: the header it received, where it starts (the file it
/// received, or the start) and when its recovery started (the failure, less the sender's
/// time to it). A message with `error` set ends it with that error.
pub(super) fn receive(grown: &Group) -> Result<(Handover, Start, Instant), RecoveryError> {
    let (joined, root) = layout(grown)?;
    let mut mine = None;
    for &new in &joined {
        let mut message = Vec::new();
        grown.broadcast_bytes(&mut message, root)?;
        if new == grown.rank() {
            mine = Some(message);
        }
    }
    let bad = |why: &str| {
        RecoveryError::Checkpoint(CheckpointError::Incompatible(format!(
            "the state a live rank handed this replacement is unusable: {why}"
        )))
    };
    let message = mine.ok_or_else(|| bad("no hand-over for this rank"))?;
    let (header, file) = message
        .split_first_chunk::<8>()
        .and_then(|(len, rest)| {
            let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
            (len <= rest.len()).then(|| rest.split_at(len))
        })
        .ok_or_else(|| bad("shorter than its header"))?;
    let handover: Handover = serde_json::from_slice(header).map_err(|e| bad(&e.to_string()))?;
    if let Some(e) = &handover.error {
        return Err(bad(e));
    }
    // The recovery started at the failure (the sender's time to it, not counting the
    // transfer).
    let now = Instant::now();
    let since = Duration::try_from_secs_f64(handover.since_detected)
        .ok()
        .and_then(|d| now.checked_sub(d))
        .unwrap_or(now);
    let start = match handover.saved_rank {
        Some(saved_rank) => Start::Received {
            bytes: file.to_vec(),
            saved_rank,
        },
        None => Start::Fresh,
    };
    Ok((handover, start, since))
}

impl Handover {
    /// Iterations of the checkpoint the replacement received (0 without one).
    pub(super) fn iterations(&self) -> u64 {
        self.iterations
    }
}

/// The new ranks of a grown world (group ranks, ascending) and the live rank that hands them
/// their state (the lowest rank that did not join). Collective.
fn layout(grown: &Group) -> Result<(Vec<usize>, usize), CommError> {
    let flags = grown.all_gather_u64(&[u64::from(grown.joined())])?;
    let joined: Vec<usize> = (0..grown.size()).filter(|&r| flags[r] == 1).collect();
    let root = (0..grown.size()).find(|&r| flags[r] == 0).ok_or_else(|| {
        CommError::InvalidConfig(
            "a grown world without a live rank to hand the replacements their state".into(),
        )
    })?;
    Ok((joined, root))
}
