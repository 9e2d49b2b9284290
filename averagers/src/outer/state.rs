//! The outer averager's checkpoint state: `θ`, the outer momentum and the outer-step count, as
//! bytes (floats are stored bit for bit, so a resume is exact).

use super::sgd::type_name as dtype;
use crate::error::AveragerError;
use localsgd_comm::params::FlatBuffer;
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"LSGDOUTR";

/// What an [`OuterAverager`](super::OuterAverager) needs beside its step counter to continue
/// exactly: `θ` per parameter (traversal index, element count), its values, the outer momentum
/// and the number of outer steps taken.
///
/// ```
/// use localsgd_averagers::OuterState;
/// use localsgd_averagers::comm::params::FlatBuffer;
///
/// let state = OuterState {
///     outer_steps: 2,
///     entries: vec![(0, 2)],
///     theta: FlatBuffer::F32(vec![0.1, -3.0]),
///     momentum: Some(FlatBuffer::F32(vec![1e-7, 2.5])),
/// };
/// assert_eq!(OuterState::from_bytes(&state.to_bytes())?, state);
/// # Ok::<(), localsgd_averagers::AveragerError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct OuterState {
    /// Outer steps taken.
    pub outer_steps: u64,
    /// (traversal index, element count) of every parameter in `θ`, in traversal order.
    pub entries: Vec<(usize, usize)>,
    /// `θ`, flat in traversal order.
    pub theta: FlatBuffer,
    /// The outer momentum buffer (`None`: torch's "no buffer yet", or momentum 0).
    pub momentum: Option<FlatBuffer>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    outer_steps: u64,
    entries: Vec<(usize, usize)>,
    dtype: String,
    len: usize,
    momentum: bool,
}

impl OuterState {
    /// Check that the buffers agree with the entries and with each other.
    pub fn check(&self) -> Result<(), AveragerError> {
        let total: usize = self.entries.iter().map(|e| e.1).sum();
        if total != self.theta.len() {
            return Err(AveragerError::Outer(format!(
                "the saved θ has {} elements but its parameters have {total}",
                self.theta.len()
            )));
        }
        if let Some(m) = &self.momentum
            && (m.len() != self.theta.len() || dtype(m) != dtype(&self.theta))
        {
            return Err(AveragerError::Outer(format!(
                "the saved outer momentum ({} {} elements) does not match θ ({} {} elements)",
                m.len(),
                dtype(m),
                self.theta.len(),
                dtype(&self.theta)
            )));
        }
        Ok(())
    }

    /// Encode: a magic, a JSON header, then `θ` and the momentum as little-endian bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = Header {
            outer_steps: self.outer_steps,
            entries: self.entries.clone(),
            dtype: dtype(&self.theta).to_string(),
            len: self.theta.len(),
            momentum: self.momentum.is_some(),
        };
        // A struct of integers, strings and bools always serializes.
        let header = serde_json::to_vec(&header).unwrap_or_default();
        let mut out = Vec::with_capacity(16 + header.len() + 16 * self.theta.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        push(&mut out, &self.theta);
        if let Some(m) = &self.momentum {
            push(&mut out, m);
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
        let hlen = u64::from_le_bytes(len) as usize;
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
        let data = &rest[hlen..];
        let vectors = 1 + header.momentum as usize;
        if data.len() != vectors * header.len * width {
            return Err(bad(&format!(
                "{} bytes of data, expected {}",
                data.len(),
                vectors * header.len * width
            )));
        }
        let (theta, momentum) = data.split_at(header.len * width);
        let state = Self {
            outer_steps: header.outer_steps,
            entries: header.entries,
            theta: pull(&header.dtype, theta),
            momentum: header.momentum.then(|| pull(&header.dtype, momentum)),
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
