//! One rank's message ([`encode`], [`decode`]) and the mean of every rank's messages
//! ([`mean_of_messages`]): the wire layout of semantics §11.

use super::error::CodecError;
use super::quantize::{NoiseKey, dequantize, pack, quantize, read_scale, scale_of, unpack};
use super::rng::noise_key;
use super::spec::{Codec, CodecSpec, Quantizer, Rounding, message_len, topk_count};
use super::topk::select;

/// Encode `x` with `spec` into `out` (cleared first; it then holds exactly
/// [`message_len`]`(spec, x.len())` bytes). `round` (a counter the caller advances) and `rank`
/// only seed stochastic rounding, so different ranks and rounds draw different noise and a resume
/// draws the same.
///
/// Errors, with `out` untouched: an invalid spec, or a NaN or infinite element (the first one
/// named).
pub fn encode(
    spec: &CodecSpec,
    x: &[f32],
    round: u64,
    rank: usize,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    encode_from(spec, x, 0, round, rank as u64, out)
}

/// [`encode`] of a part of a longer vector that starts at element `first` (a multiple of the
/// chunk, so the part's chunks are the vector's): stochastic rounding draws the noise of each
/// element's index in the whole vector, under the noise key of `rank` (a 64-bit stream id; the
/// quantized all-reduce's owners use `2^32 + rank` for their second quantization).
pub(crate) fn encode_from(
    spec: &CodecSpec,
    x: &[f32],
    first: u64,
    round: u64,
    rank: u64,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    spec.validate()?;
    if let Some(index) = x.iter().position(|v| !v.is_finite()) {
        return Err(CodecError::NonFinite {
            index,
            value: x[index],
        });
    }
    let key: NoiseKey = match spec.rounding {
        Rounding::Nearest => None,
        Rounding::Stochastic { seed } => Some(noise_key(seed, round, rank)),
    };
    out.clear();
    out.reserve(message_len(spec, x.len()));
    let mut qs: Vec<i8> = Vec::new();
    let mut picked: Vec<u16> = Vec::new();
    for (c, chunk) in x.chunks(spec.chunk).enumerate() {
        let base = first + (c * spec.chunk) as u64;
        match spec.codec {
            Codec::Int8 | Codec::Int4 => {
                let q = if spec.codec == Codec::Int8 {
                    Quantizer::Int8
                } else {
                    Quantizer::Int4
                };
                let scale = scale_of(chunk.iter().copied(), q);
                out.extend_from_slice(&scale.to_le_bytes());
                qs.clear();
                qs.extend(
                    chunk
                        .iter()
                        .enumerate()
                        .map(|(j, &v)| quantize(v, scale, q, key, base + j as u64)),
                );
                pack(&qs, q, out);
            }
            Codec::TopK {
                fraction,
                quantizer,
            } => {
                select(chunk, topk_count(fraction, chunk.len()), &mut picked);
                let kept = picked.iter().map(|&j| chunk[usize::from(j)]);
                match quantizer {
                    None => {
                        for &j in &picked {
                            out.extend_from_slice(&j.to_le_bytes());
                        }
                        for v in kept {
                            out.extend_from_slice(&v.to_le_bytes());
                        }
                    }
                    Some(q) => {
                        let scale = scale_of(kept, q);
                        out.extend_from_slice(&scale.to_le_bytes());
                        for &j in &picked {
                            out.extend_from_slice(&j.to_le_bytes());
                        }
                        qs.clear();
                        qs.extend(picked.iter().map(|&j| {
                            let v = chunk[usize::from(j)];
                            quantize(v, scale, q, key, base + u64::from(j))
                        }));
                        pack(&qs, q, out);
                    }
                }
            }
        }
    }
    debug_assert_eq!(out.len(), message_len(spec, x.len()));
    Ok(())
}

/// Decode a message of `n` elements encoded with `spec` into `out` (`n` long): quantized values
/// become `q * scale`, and top-k's unsent elements 0.
///
/// A peer's message is untrusted: a wrong length, a non-finite or negative scale, a quantized
/// value outside `[-qmax, qmax]`, a non-zero int4 padding nibble, top-k offsets that are not
/// strictly ascending within the chunk, or a non-finite top-k value is an error, never a panic.
/// On error `out` may be partly written.
///
/// The arithmetic is exactly the spec's, so a valid message can decode to ±inf in one corner:
/// `127 * scale` overflows f32 for an int8 chunk whose `max |x|` is within rounding of
/// `f32::MAX` (pseudo-gradients never come near).
pub fn decode(spec: &CodecSpec, msg: &[u8], n: usize, out: &mut [f32]) -> Result<(), CodecError> {
    spec.validate()?;
    check_len("output", out.len(), n)?;
    check_len("message", msg.len(), message_len(spec, n))?;
    let mut pos = 0;
    let mut offsets: Vec<u16> = Vec::new();
    for chunk_out in out.chunks_mut(spec.chunk) {
        let len = chunk_out.len();
        match spec.codec {
            Codec::Int8 | Codec::Int4 => {
                let q = if spec.codec == Codec::Int8 {
                    Quantizer::Int8
                } else {
                    Quantizer::Int4
                };
                let scale = read_scale(&take4(msg, pos), pos)?;
                pos += 4;
                let bytes = q.packed_len(len);
                unpack(&msg[pos..pos + bytes], len, q, pos, |j, v| {
                    chunk_out[j] = dequantize(v, scale)
                })?;
                pos += bytes;
            }
            Codec::TopK {
                fraction,
                quantizer,
            } => {
                let k = topk_count(fraction, len);
                let scale = match quantizer {
                    None => None,
                    Some(_) => {
                        let scale = read_scale(&take4(msg, pos), pos)?;
                        pos += 4;
                        Some(scale)
                    }
                };
                read_offsets(&msg[pos..pos + 2 * k], len, pos, &mut offsets)?;
                pos += 2 * k;
                chunk_out.fill(0.0);
                match (quantizer, scale) {
                    (Some(q), Some(scale)) => {
                        let bytes = q.packed_len(k);
                        unpack(&msg[pos..pos + bytes], k, q, pos, |j, v| {
                            chunk_out[usize::from(offsets[j])] = dequantize(v, scale)
                        })?;
                        pos += bytes;
                    }
                    _ => {
                        for &j in &offsets {
                            let v = f32::from_le_bytes(take4(msg, pos));
                            if !v.is_finite() {
                                return Err(CodecError::Corrupt {
                                    offset: pos,
                                    reason: format!("top-k value {v} is not finite"),
                                });
                            }
                            chunk_out[usize::from(j)] = v;
                            pos += 4;
                        }
                    }
                }
            }
        }
    }
    debug_assert_eq!(pos, msg.len());
    Ok(())
}

/// The mean of `world` messages of `n` elements each, concatenated in rank order in `gathered`
/// (what an all-gather of the messages returns): decode rank 0's message, then ranks
/// `1..world` in order, summing `acc_i += d_r_i` in f32 from 0.0, then `out_i = acc_i / world`.
/// Every rank that computes this on the same bytes gets bit-identical results.
///
/// Errors name the rank whose message is bad; on error `out` may be partly written.
pub fn mean_of_messages(
    spec: &CodecSpec,
    gathered: &[u8],
    world: usize,
    n: usize,
    out: &mut [f32],
) -> Result<(), CodecError> {
    spec.validate()?;
    if world == 0 {
        return Err(CodecError::ZeroWorld);
    }
    check_len("output", out.len(), n)?;
    let len = message_len(spec, n);
    check_len(
        "gathered messages",
        gathered.len(),
        len.saturating_mul(world),
    )?;
    out.fill(0.0);
    let mut decoded = vec![0.0f32; n];
    for rank in 0..world {
        let msg = &gathered[rank * len..(rank + 1) * len];
        decode(spec, msg, n, &mut decoded).map_err(|e| CodecError::Rank {
            rank,
            source: Box::new(e),
        })?;
        for (acc, d) in out.iter_mut().zip(&decoded) {
            *acc += d;
        }
    }
    let w = world as f32;
    for acc in out.iter_mut() {
        *acc /= w;
    }
    Ok(())
}

fn check_len(what: &'static str, got: usize, expected: usize) -> Result<(), CodecError> {
    if got == expected {
        Ok(())
    } else {
        Err(CodecError::Length {
            what,
            got,
            expected,
        })
    }
}

/// The 4 bytes at `pos` (the caller checked the message length).
fn take4(msg: &[u8], pos: usize) -> [u8; 4] {
    [msg[pos], msg[pos + 1], msg[pos + 2], msg[pos + 3]]
}

/// Read top-k offsets (u16 little-endian) from `bytes` at message byte `pos`: strictly ascending
/// and inside a chunk of `len` elements.
fn read_offsets(
    bytes: &[u8],
    len: usize,
    pos: usize,
    offsets: &mut Vec<u16>,
) -> Result<(), CodecError> {
    offsets.clear();
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let j = u16::from_le_bytes([pair[0], pair[1]]);
        let at = pos + 2 * i;
        if usize::from(j) >= len {
            return Err(CodecError::Corrupt {
                offset: at,
                reason: format!("top-k offset {j} is outside the chunk of {len} elements"),
            });
        }
        if let Some(&prev) = offsets.last()
            && j <= prev
        {
            return Err(CodecError::Corrupt {
                offset: at,
                reason: format!("top-k offset {j} does not follow {prev} in ascending order"),
            });
        }
        offsets.push(j);
    }
    Ok(())
}
