//! Error feedback: what a lossy message left out is added to the next round's input.

use super::error::CodecError;
use super::message::{decode, encode};
use super::spec::CodecSpec;

/// The residual of error feedback: per element, what the messages sent so far left out. Save
/// [`residual`](Self::residual) in a checkpoint and restore it with
/// [`from_residual`](Self::from_residual) for an exact resume.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
}

impl ErrorFeedback {
    /// A zero residual for vectors of `n` elements.
    pub fn new(n: usize) -> Self {
        Self {
            residual: vec![0.0; n],
        }
    }

    /// A residual saved earlier (from [`residual`](Self::residual)).
    pub fn from_residual(residual: Vec<f32>) -> Self {
        Self { residual }
    }

    /// The residual, one element per element of the vector.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// The residual, to update in place (the quantized all-reduce's owner's residual).
    pub(crate) fn residual_mut(&mut self) -> &mut [f32] {
        &mut self.residual
    }

    /// The residual, taken out.
    pub fn into_residual(self) -> Vec<f32> {
        self.residual
    }

    /// Elements of the vector.
    pub fn len(&self) -> usize {
        self.residual.len()
    }

    /// Whether the vector has no elements.
    pub fn is_empty(&self) -> bool {
        self.residual.is_empty()
    }
}

/// [`encode`] with error feedback. With `feedback`, encode `y = x + residual` (f32,
/// elementwise) and set `residual = y - decode(message)`, so top-k's unsent elements keep their
/// whole `y`; without, encode `x`.
///
/// Errors: those of [`encode`] (a non-finite `y` included), or a residual whose length is not
/// `x.len()`; the residual and `out` are then untouched.
pub fn encode_with_feedback(
    spec: &CodecSpec,
    feedback: Option<&mut ErrorFeedback>,
    x: &[f32],
    round: u64,
    rank: usize,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    let Some(fb) = feedback else {
        return encode(spec, x, round, rank, out);
    };
    if fb.residual.len() != x.len() {
        return Err(CodecError::Length {
            what: "residual",
            got: fb.residual.len(),
            expected: x.len(),
        });
    }
    let y: Vec<f32> = x.iter().zip(&fb.residual).map(|(a, r)| a + r).collect();
    encode(spec, &y, round, rank, out)?;
    // The residual becomes the decoded message (our own message always decodes), then y - it.
    decode(spec, out, y.len(), &mut fb.residual)?;
    for (r, v) in fb.residual.iter_mut().zip(&y) {
        *r = v - *r;
    }
    Ok(())
}
