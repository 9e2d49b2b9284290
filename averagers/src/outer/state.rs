//! The outer averager's checkpoint state: per fragment `θ` and the outer momentum, the
//! outer-step count, and (Streaming DiLoCo) a pseudo-gradient averaged and not yet applied, as
//! bytes (floats are stored bit for bit, so a resume is exact).

use super::sgd::type_name as dtype;
use crate::error::AveragerError;
use localsgd_comm::params::FlatBuffer;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"LSGDOUT2";

/// One fragment's part of an [`OuterState`]: its parameters, `θ` and outer momentum.
#[derive(Debug, Clone, PartialEq)]
pub struct FragmentState {
    /// (traversal index, element count) of every parameter of the fragment, in traversal
    /// order.
    pub entries: Vec<(usize, usize)>,
    /// The fragment's `θ`, flat in traversal order.
    pub theta: FlatBuffer,
    /// Its outer momentum (`None`: torch's "no buffer yet", or momentum 0).
    pub momentum: Option<FlatBuffer>,
    /// What the lossy codec's messages have not carried yet (error feedback, f32); `None`
    /// without a lossy codec, without error feedback, or before its first sync.
    pub residual: Option<Vec<f32>>,
    /// What the reduced shard this rank owns in the quantized all-reduce has not carried yet
    /// (f32, the fragment's length, non-zero only on the owned shard); `None` without that
    /// exchange or before its first sync. A resume on another number of ranks keeps the
    /// residuals of the elements a rank owns in both worlds and starts the others at zero.
    pub owned_residual: Option<Vec<f32>>,
}

/// A pseudo-gradient whose average was started (Streaming DiLoCo's prepare step) and not yet
/// applied: the group's mean, completed for the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingDelta {
    /// The fragment it belongs to.
    pub fragment: usize,
    /// The group's mean of `θ_f − x_f`.
    pub delta: FlatBuffer,
}

/// What an [`OuterAverager`](super::OuterAverager) needs beside its step counter to continue
/// exactly: per fragment (one for DiLoCo and SlowMo, several for Streaming DiLoCo) its
/// parameters, `θ` and outer momentum; the number of outer steps taken; a pending averaged
/// pseudo-gradient.
///
/// ```
/// use localsgd_averagers::OuterState;
/// use localsgd_averagers::outer::{FragmentState, PendingDelta};
/// use localsgd_averagers::comm::params::FlatBuffer;
///
/// let state = OuterState {
///     outer_steps: 2,
///     fragments: vec![
///         FragmentState {
///             entries: vec![(0, 2)],
///             theta: FlatBuffer::F32(vec![0.1, -3.0]),
///             momentum: Some(FlatBuffer::F32(vec![1e-7, 2.5])),
///             residual: Some(vec![0.5, -1e-9]),
///             owned_residual: Some(vec![0.0, 3e-3]),
///         },
///         FragmentState {
///             entries: vec![(1, 1)],
///             theta: FlatBuffer::F32(vec![4.0]),
///             momentum: None,
///             residual: None,
///             owned_residual: None,
///         },
///     ],
///     pending: Some(PendingDelta { fragment: 1, delta: FlatBuffer::F32(vec![0.25]) }),
/// };
/// assert_eq!(OuterState::from_bytes(&state.to_bytes())?, state);
/// # Ok::<(), localsgd_averagers::AveragerError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct OuterState {
    /// Outer steps taken (over all fragments).
    pub outer_steps: u64,
    /// Per fragment, in fragment order.
    pub fragments: Vec<FragmentState>,
    /// A pseudo-gradient averaged and not yet applied.
    pub pending: Option<PendingDelta>,
}

#[derive(Serialize, Deserialize)]
struct FragmentHeader {
    entries: Vec<(usize, usize)>,
    len: usize,
    momentum: bool,
    /// An f32 error-feedback residual follows (absent in states written before it existed).
    #[serde(default)]
    residual: bool,
    /// The owner's residual of the quantized all-reduce follows (f32).
    #[serde(default)]
    owned_residual: bool,
}

#[derive(Serialize, Deserialize)]
struct Header {
    outer_steps: u64,
    dtype: String,
    fragments: Vec<FragmentHeader>,
    /// (fragment, element count) of the pending pseudo-gradient.
    pending: Option<(usize, usize)>,
}

impl OuterState {
    /// Check that the buffers agree with the entries, with each other and in element type.
    pub fn check(&self) -> Result<(), AveragerError> {
        let Some(first) = self.fragments.first() else {
            return Err(AveragerError::Outer(
                "the saved outer state has no fragment".into(),
            ));
        };
        let ty = dtype(&first.theta);
        for (f, frag) in self.fragments.iter().enumerate() {
            let total: usize = frag.entries.iter().map(|e| e.1).sum();
            if total != frag.theta.len() || dtype(&frag.theta) != ty {
                return Err(AveragerError::Outer(format!(
                    "the saved θ of fragment {f} has {} {} elements but its parameters have \
                     {total} (expected {ty})",
                    frag.theta.len(),
                    dtype(&frag.theta)
                )));
            }
            if let Some(m) = &frag.momentum
                && (m.len() != frag.theta.len() || dtype(m) != ty)
            {
                return Err(AveragerError::Outer(format!(
                    "the saved outer momentum of fragment {f} ({} {} elements) does not match \
                     its θ ({} {ty} elements)",
                    m.len(),
                    dtype(m),
                    frag.theta.len(),
                )));
            }
        }
        for (f, frag) in self.fragments.iter().enumerate() {
            for (r, what) in [
                (&frag.residual, "error-feedback residual"),
                (&frag.owned_residual, "owner's error-feedback residual"),
            ] {
                if let Some(r) = r
                    && r.len() != frag.theta.len()
                {
                    return Err(AveragerError::Outer(format!(
                        "the saved {what} of fragment {f} has {} elements, its θ {}",
                        r.len(),
                        frag.theta.len()
                    )));
                }
            }
        }
        if let Some(p) = &self.pending {
            let expected = self.fragments.get(p.fragment).map(|f| f.theta.len());
            if expected != Some(p.delta.len()) || dtype(&p.delta) != ty {
                return Err(AveragerError::Outer(format!(
                    "the saved pending pseudo-gradient ({} {} elements for fragment {}) does not \
                     match that fragment of {} fragments",
                    p.delta.len(),
                    dtype(&p.delta),
                    p.fragment,
                    self.fragments.len()
                )));
            }
        }
        Ok(())
    }

    /// Encode: a magic, a JSON header, then per fragment `θ` (and the momentum), then the
    /// pending pseudo-gradient, as little-endian bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = Header {
            outer_steps: self.outer_steps,
            dtype: self
                .fragments
                .first()
                .map_or("f32", |f| dtype(&f.theta))
                .to_string(),
            fragments: self
                .fragments
                .iter()
                .map(|f| FragmentHeader {
                    entries: f.entries.clone(),
                    len: f.theta.len(),
                    momentum: f.momentum.is_some(),
                    residual: f.residual.is_some(),
                    owned_residual: f.owned_residual.is_some(),
                })
                .collect(),
            pending: self.pending.as_ref().map(|p| (p.fragment, p.delta.len())),
        };
        // A struct of integers, strings and bools always serializes.
        let header = serde_json::to_vec(&header).unwrap_or_default();
        let mut out = Vec::with_capacity(16 + header.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        for f in &self.fragments {
            push(&mut out, &f.theta);
            if let Some(m) = &f.momentum {
                push(&mut out, m);
            }
            for r in [&f.residual, &f.owned_residual].into_iter().flatten() {
                r.iter()
                    .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
            }
        }
        if let Some(p) = &self.pending {
            push(&mut out, &p.delta);
        }
        out
    }

    /// Decode what [`to_bytes`](Self::to_bytes) wrote; a damaged or truncated input is an
    /// error naming what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AveragerError> {
        let bad = |why: &str| AveragerError::Outer(format!("saved outer state: {why}"));
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err(bad("missing header"));
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[8..16]);
        let hlen = usize::try_from(u64::from_le_bytes(len)).unwrap_or(usize::MAX);
        let rest = &bytes[16..];
        if rest.len() < hlen {
            return Err(bad("truncated header"));
        }
        let header: Header =
            serde_json::from_slice(&rest[..hlen]).map_err(|e| bad(&e.to_string()))?;
        let width = match header.dtype.as_str() {
            "f32" => 4,
            "f64" => 8,
            other => return Err(bad(&format!("unknown element type {other}"))),
        };
        let mut data = &rest[hlen..];
        let mut take = |elements: usize, dtype: &str| -> Result<FlatBuffer, AveragerError> {
            let width = if dtype == "f32" { 4 } else { width };
            let n = elements
                .checked_mul(width)
                .filter(|&n| n <= data.len())
                .ok_or_else(|| bad("truncated data"))?;
            let (head, tail) = data.split_at(n);
            data = tail;
            Ok(pull(dtype, head))
        };
        let mut fragments = Vec::with_capacity(header.fragments.len().min(1 << 16));
        for f in &header.fragments {
            let theta = take(f.len, &header.dtype)?;
            let momentum = if f.momentum {
                Some(take(f.len, &header.dtype)?)
            } else {
                None
            };
            let mut residual = |present: bool| match present {
                true => match take(f.len, "f32")? {
                    FlatBuffer::F32(r) => Ok(Some(r)),
                    FlatBuffer::F64(_) => Err(bad("the residual is not f32")),
                },
                false => Ok(None),
            };
            let sent = residual(f.residual)?;
            let owned_residual = residual(f.owned_residual)?;
            fragments.push(FragmentState {
                entries: f.entries.clone(),
                theta,
                momentum,
                residual: sent,
                owned_residual,
            });
        }
        let pending = match header.pending {
            Some((fragment, n)) => Some(PendingDelta {
                fragment,
                delta: take(n, &header.dtype)?,
            }),
            None => None,
        };
        if !data.is_empty() {
            return Err(bad(&format!("{} bytes of data left over", data.len())));
        }
        let state = Self {
            outer_steps: header.outer_steps,
            fragments,
            pending,
        };
        state.check()?;
        Ok(state)
    }
}

fn push(out: &mut Vec<u8>, b: &FlatBuffer) {
    match b {
        FlatBuffer::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        FlatBuffer::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
    }
}

fn pull(dtype: &str, bytes: &[u8]) -> FlatBuffer {
    if dtype == "f64" {
        FlatBuffer::F64(
            bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        )
    } else {
        FlatBuffer::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }
}
