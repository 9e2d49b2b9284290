//! A pipeline's own state without the model and the optimizer, for an entry point that saves
//! those its own way: the burn-train strategy keeps burn-train's records of them and this file
//! beside, per rank and epoch.

use super::{CheckpointError, PendingMeta, dtype_name, from_le_bytes, le_bytes, split_halves};
use crate::pipeline::{Pipeline, PipelineError, RestoredState};
use burn::module::Module;
use localsgd_averagers::{AveragerState, OuterState, PendingAverage};
use localsgd_hooks::HookState;
use serde::{Deserialize, Serialize};
use std::path::Path;

const MAGIC: &[u8; 8] = b"LSGDPIPE";
const FORMAT: u32 = 1;

/// Everything [`Pipeline::restore`] takes but the optimizer: counters, the averager's and the
/// hook's state, an overlapped average in flight and the outer optimizer's `θ` and momentum.
/// [`to_bytes`](Self::to_bytes) writes it as one self-checking file (a CRC-32 at its end).
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineState {
    /// Iterations completed.
    pub iterations_done: u64,
    /// Optimizer steps skipped for non-finite gradients.
    pub skipped_steps: u64,
    /// The averager's state (its step counter), if the run averages.
    pub averager: Option<AveragerState>,
    /// The hook's state (the post-local SGD `iter`), if the run syncs gradients.
    pub hook: Option<HookState>,
    /// An overlapped average started and not yet applied (its collective completed).
    pub pending_average: Option<PendingAverage>,
    /// The outer averager's `θ`, outer momentum and outer-step count; a Streaming DiLoCo
    /// pseudo-gradient on its way included.
    pub outer: Option<OuterState>,
}

#[derive(Serialize, Deserialize)]
struct Meta {
    iterations_done: u64,
    skipped_steps: u64,
    averager: Option<AveragerState>,
    hook: Option<HookState>,
    pending: Option<PendingMeta>,
}

impl PipelineState {
    /// `pipeline`'s state now, between iterations. Every rank calls it at the same iteration:
    /// an overlapped average or a Streaming DiLoCo fragment still in flight is waited for (its
    /// collective completes; it stays pending and is applied at its step).
    pub fn capture<M: Module>(pipeline: &mut Pipeline<M>) -> Result<Self, PipelineError> {
        let pending_average = pipeline.pending_average()?;
        let outer = pipeline.outer_state()?;
        Ok(Self {
            iterations_done: pipeline.iteration(),
            skipped_steps: pipeline.skipped_steps(),
            averager: pipeline.averager().map(|a| a.state()),
            hook: pipeline.hook().map(|h| h.state()),
            pending_average,
            outer,
        })
    }

    /// What [`Pipeline::restore`] takes, the optimizer left as it is (restored by its owner).
    pub fn into_restored(self) -> RestoredState {
        RestoredState {
            iterations_done: self.iterations_done,
            skipped_steps: self.skipped_steps,
            optimizer: None,
            averager: self.averager,
            hook: self.hook,
            pending_average: self.pending_average,
            outer: self.outer,
        }
    }

    /// The state as bytes: a header, the metadata as JSON, the pending average's two vectors,
    /// the outer state, and a CRC-32 of everything before it.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let pending_meta = self.pending_average.as_ref().map(|p| PendingMeta {
            started_at: p.started_at,
            group: p.group.clone(),
            indices: p.indices.clone(),
            len: p.snapshot.len(),
            dtype: dtype_name(&p.snapshot).to_string(),
        });
        let meta = serde_json::to_vec(&Meta {
            iterations_done: self.iterations_done,
            skipped_steps: self.skipped_steps,
            averager: self.averager.clone(),
            hook: self.hook.clone(),
            pending: pending_meta,
        })
        .map_err(|e| CheckpointError::Data(e.to_string()))?;
        let mut pending = Vec::new();
        if let Some(p) = &self.pending_average {
            pending.extend(le_bytes(&p.snapshot));
            pending.extend(le_bytes(&p.average));
        }
        let outer = self
            .outer
            .as_ref()
            .map(OuterState::to_bytes)
            .unwrap_or_default();
        let mut out = Vec::with_capacity(40 + meta.len() + pending.len() + outer.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        for part in [&meta, &pending, &outer] {
            out.extend_from_slice(&(part.len() as u64).to_le_bytes());
            out.extend_from_slice(part);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    /// Read what [`to_bytes`](Self::to_bytes) wrote (`path` names the file in errors): a
    /// damaged or foreign file is [`CheckpointError::Corrupt`], never a different state.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, CheckpointError> {
        let corrupt = |reason: &str| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        let Some(body_len) = bytes.len().checked_sub(4).filter(|&n| n >= 12) else {
            return Err(corrupt("too short for a pipeline state"));
        };
        if &bytes[..8] != MAGIC {
            return Err(corrupt("missing header"));
        }
        let format = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if format != FORMAT {
            return Err(corrupt(&format!("format {format}, expected {FORMAT}")));
        }
        let (body, crc) = bytes.split_at(body_len);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err(corrupt("checksum mismatch"));
        }
        let mut at = 12;
        let mut parts = Vec::with_capacity(3);
        for name in ["metadata", "pending average", "outer state"] {
            let len = body
                .get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| corrupt(&format!("truncated before its {name}")))?;
            let end = usize::try_from(len)
                .ok()
                .and_then(|l| (at + 8).checked_add(l))
                .filter(|&e| e <= body.len())
                .ok_or_else(|| corrupt(&format!("truncated {name}")))?;
            parts.push(&body[at + 8..end]);
            at = end;
        }
        let meta: Meta = serde_json::from_slice(parts[0]).map_err(|e| corrupt(&e.to_string()))?;
        let pending_average = match meta.pending {
            None => None,
            Some(m) => {
                let both = from_le_bytes(&m.dtype, parts[1])
                    .filter(|b| b.len() == 2 * m.len)
                    .ok_or_else(|| corrupt("pending average of the wrong size or type"))?;
                let (snapshot, average) = split_halves(both);
                Some(PendingAverage {
                    started_at: m.started_at,
                    group: m.group,
                    indices: m.indices,
                    snapshot,
                    average,
                })
            }
        };
        let outer = match parts[2] {
            [] => None,
            bytes => Some(OuterState::from_bytes(bytes).map_err(|e| corrupt(&e.to_string()))?),
        };
        Ok(Self {
            iterations_done: meta.iterations_done,
            skipped_steps: meta.skipped_steps,
            averager: meta.averager,
            hook: meta.hook,
            pending_average,
            outer,
        })
    }
}
