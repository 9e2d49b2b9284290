//! The quantized all-reduce (book: Semantics, "The quantized all-reduce"): a mean of every
//! rank's vector whose bytes per rank do not grow with the world, as torchft's
//! `allreduce_quantized` does it. Each rank encodes its whole vector (with its error feedback);
//! the vector's chunks are dealt into one contiguous shard per rank ([`shards`]), and an
//! all-to-all hands each shard's owner every rank's message of it; the owner decodes them, sums
//! in rank order and divides by the world size, encodes the reduced shard again (with its own
//! error feedback on it, and noise of its own), and an all-gather hands every rank every
//! owner's message, which each decodes: the same bits on every rank.
//!
//! Bytes on the wire per rank: `2 (W − 1) B`, `B` the longest shard's message (about
//! `message_len / W`): about `2 (W − 1) / W` of one message, where the all-gather of whole
//! messages ([`mean_of_messages`](super::mean_of_messages)) moves `W − 1` of them. At 2 ranks the
//! two cost the same and the all-gather quantizes once; from 3 ranks on this one is cheaper
//! ([`quantized_mean_wire_bytes`]).

use std::ops::Range;

use super::error::CodecError;
use super::feedback::{ErrorFeedback, encode_with_feedback};
use super::message::{decode, encode_from};
use super::spec::{CodecSpec, message_len};
use crate::error::CommError;
use crate::group::ProcessGroup;

/// The noise stream of an owner's second quantization: `2^32 + rank`, apart from every
/// rank's first (`rank`), so the two roundings of one element draw independent noise.
pub const OWNER_STREAM: u64 = 1 << 32;

/// Why a quantized mean failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuantizedMeanError {
    /// The codec refused an input or a peer's message.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
}

impl QuantizedMeanError {
    /// Whether a peer is gone ([`CommError::is_peer_lost`]).
    pub fn is_peer_lost(&self) -> bool {
        matches!(self, Self::Comm(c) if c.is_peer_lost())
    }
}

/// The element ranges the ranks own, in rank order: the `K = ceil(n / chunk)` chunks of a vector
/// of `n` elements dealt contiguously, rank `j` taking chunks `j K / W .. (j + 1) K / W`
/// (integer division; an owner of no chunk has an empty range).
pub fn shards(n: usize, chunk: usize, world: usize) -> Vec<Range<usize>> {
    let (chunk, world) = (chunk.max(1), world.max(1));
    let chunks = n.div_ceil(chunk);
    (0..world)
        .map(|j| {
            let start = (j * chunks / world * chunk).min(n);
            let end = ((j + 1) * chunks / world * chunk).min(n);
            start..end
        })
        .collect()
}

/// The block every rank sends each owner in the all-to-all, and each owner sends every rank in
/// the all-gather: the longest shard's message (shorter ones are padded with zeros).
pub fn quantized_mean_block(spec: &CodecSpec, n: usize, world: usize) -> usize {
    shards(n, spec.chunk, world)
        .iter()
        .map(|r| message_len(spec, r.len()))
        .max()
        .unwrap_or(0)
}

/// Bytes one rank sends (and as many it receives) in a quantized mean of `n` elements on
/// `world` ranks: `2 (world − 1)` blocks ([`quantized_mean_block`]).
pub fn quantized_mean_wire_bytes(spec: &CodecSpec, n: usize, world: usize) -> u64 {
    2 * (world.max(1) as u64 - 1) * quantized_mean_block(spec, n, world) as u64
}

/// The two residuals of error feedback in a quantized mean, each the vector's length: what this
/// rank's messages left out, and, on the elements of the shard it owns, what its reduced
/// shard's messages left out (elements it does not own are untouched).
#[derive(Debug)]
pub struct QuantizedFeedback<'a> {
    /// The residual of this rank's own message.
    pub sent: &'a mut ErrorFeedback,
    /// The residual of the reduced shard this rank owns.
    pub owned: &'a mut ErrorFeedback,
}

/// The mean of `x` over `group`'s ranks by the quantized all-reduce (module docs), into `out`;
/// `round` and the ranks key stochastic rounding, as for [`encode`](super::encode). Collective:
/// every rank passes the same spec and length. With `feedback`, the first quantization encodes
/// `x + sent` and the owner's second `mean + owned` (on its shard), each residual becoming what
/// its message left out. One rank: both quantizations still round, as the wire would.
pub fn quantized_mean<G: ProcessGroup + ?Sized>(
    group: &G,
    spec: &CodecSpec,
    x: &[f32],
    feedback: Option<QuantizedFeedback<'_>>,
    round: u64,
    out: &mut [f32],
) -> Result<(), QuantizedMeanError> {
    spec.validate()?;
    let (n, world, rank) = (x.len(), group.size(), group.rank());
    if out.len() != n {
        return Err(CodecError::Length {
            what: "output",
            got: out.len(),
            expected: n,
        }
        .into());
    }
    let (sent, owned) = match feedback {
        Some(f) => (Some(f.sent), Some(f.owned)),
        None => (None, None),
    };
    if let Some(owned) = &owned
        && owned.len() != n
    {
        return Err(CodecError::Length {
            what: "owner's residual",
            got: owned.len(),
            expected: n,
        }
        .into());
    }
    let shards = shards(n, spec.chunk, world);
    let block = quantized_mean_block(spec, n, world);
    // 1. This rank's message of the whole vector, cut at the shards' chunk boundaries.
    let mut msg = Vec::new();
    encode_with_feedback(spec, sent, x, round, rank, &mut msg)?;
    let mut send = vec![0u8; world * block];
    for (j, r) in shards.iter().enumerate() {
        let (a, b) = (message_len(spec, r.start), message_len(spec, r.end));
        send[j * block..j * block + (b - a)].copy_from_slice(&msg[a..b]);
    }
    // 2. Every owner gets every rank's message of its shard.
    let recv = if world > 1 {
        let mut recv = vec![0u8; world * block];
        group.all_to_all_bytes(&send, &mut recv)?;
        recv
    } else {
        send
    };
    // 3. The owner's mean of its shard: decoded, summed in rank order, divided by the world.
    let mine = shards[rank].clone();
    let (len, mlen) = (mine.len(), message_len(spec, mine.len()));
    let mut mean = vec![0.0f32; len];
    let mut decoded = vec![0.0f32; len];
    for r in 0..world {
        let part = &recv[r * block..r * block + mlen];
        decode(spec, part, len, &mut decoded).map_err(|e| CodecError::Rank {
            rank: r,
            source: Box::new(e),
        })?;
        for (m, d) in mean.iter_mut().zip(&decoded) {
            *m += d;
        }
    }
    let w = world as f32;
    for m in &mut mean {
        *m /= w;
    }
    // 4. The reduced shard encoded again, with the owner's residual on it.
    let residual = owned.map(|o| &mut o.residual_mut()[mine.clone()]);
    if let Some(res) = &residual {
        for (m, r) in mean.iter_mut().zip(res.iter()) {
            *m += r;
        }
    }
    let mut reduced = Vec::with_capacity(block);
    let stream = OWNER_STREAM + rank as u64;
    encode_from(spec, &mean, mine.start as u64, round, stream, &mut reduced)?;
    if let Some(res) = residual {
        decode(spec, &reduced, len, res)?;
        for (r, z) in res.iter_mut().zip(&mean) {
            *r = z - *r;
        }
    }
    reduced.resize(block, 0);
    // 5. Every rank gets every owner's message and decodes it.
    let all = if world > 1 {
        let mut all = vec![0u8; world * block];
        group.all_gather_bytes(&reduced, &mut all)?;
        all
    } else {
        reduced
    };
    for (j, r) in shards.iter().enumerate() {
        let part = &all[j * block..j * block + message_len(spec, r.len())];
        decode(spec, part, r.len(), &mut out[r.clone()]).map_err(|e| CodecError::Rank {
            rank: j,
            source: Box::new(e),
        })?;
    }
    Ok(())
}
