//! A lossy codec for pseudo-gradients: int8, int4, top-k, top-k with int8 or int4 values, and
//! error feedback (semantics §11 in the book).
//!
//! Pure functions over a flat f32 vector, no communication: [`encode`] makes one rank's message,
//! whose length [`message_len`] depends only on the element count and the [`CodecSpec`], so
//! every rank's message has the same length and an all-gather of equal-sized byte buffers carries
//! them; [`mean_of_messages`] decodes the gathered messages in rank order and averages them, the
//! same bits on every rank. [`ErrorFeedback`] carries what a message left out into the next round
//! ([`encode_with_feedback`]).
//!
//! The vector is cut into chunks of `chunk` consecutive elements (the last may be shorter); each
//! chunk has its own scale (`max |x| / qmax`) and, for top-k, its own selection. Bytes per
//! element, for chunk `C` and fraction `F` ([`wire_bytes`]):
//!
//! | codec | bytes per element | one chunk on the wire (little-endian) |
//! |---|---|---|
//! | `int8` | `1 + 4/C` | scale f32, `L` i8 |
//! | `int4` | `1/2 + 4/C` | scale f32, `ceil(L/2)` bytes |
//! | `topk:F` | `6F` | `k` u16 offsets, `k` f32 |
//! | `topk:F+int8` | `3F + 4/C` | scale f32, `k` u16 offsets, `k` i8 |
//! | `topk:F+int4` | `2.5F + 4/C` | scale f32, `k` u16 offsets, `ceil(k/2)` bytes |
//!
//! `scripts/codec_reference.py` is an independent numpy implementation; the tests compare every
//! byte and bit with its output, `comm/tests/data/codec_vectors.json`.
//!
//! ```
//! use localsgd_comm::codec::{
//!     decode, encode, mean_of_messages, message_len, Codec, CodecSpec, Rounding,
//! };
//!
//! let spec = CodecSpec { codec: "int8".parse::<Codec>()?, chunk: 4, rounding: Rounding::Nearest };
//! let (a, b) = ([127.0f32, -63.5, 0.0, 1.0, 254.0], [0.0f32, 127.0, 1.0, 1.0, -254.0]);
//!
//! // Each rank encodes its vector (round 0; rank only matters to stochastic rounding).
//! let (mut msg_a, mut msg_b) = (Vec::new(), Vec::new());
//! encode(&spec, &a, 0, 0, &mut msg_a)?;
//! encode(&spec, &b, 0, 1, &mut msg_b)?;
//! assert_eq!(msg_a.len(), message_len(&spec, 5)); // 2 chunks: (4 + 4) + (4 + 1) bytes
//!
//! // Decoding: chunk [127, -63.5, 0, 1] has scale 127 / 127 = 1, and -63.5 rounds to the even
//! // -64; chunk [254] has scale 2.
//! let mut d = [0.0f32; 5];
//! decode(&spec, &msg_a, 5, &mut d)?;
//! assert_eq!(d, [127.0, -64.0, 0.0, 1.0, 254.0]);
//!
//! // The mean of the two messages, as every rank computes it after an all-gather.
//! let gathered = [msg_a, msg_b].concat();
//! let mut mean = [0.0f32; 5];
//! mean_of_messages(&spec, &gathered, 2, 5, &mut mean)?;
//! assert_eq!(mean, [63.5, 31.5, 0.5, 1.0, 0.0]);
//! # Ok::<(), localsgd_comm::codec::CodecError>(())
//! ```

mod allreduce;
mod error;
mod feedback;
mod message;
mod quantize;
pub mod rng;
mod spec;
mod topk;

pub use allreduce::{
    OWNER_STREAM, QuantizedFeedback, QuantizedMeanError, quantized_mean, quantized_mean_block,
    quantized_mean_wire_bytes, shards,
};
pub use error::CodecError;
pub use feedback::{ErrorFeedback, encode_with_feedback};
pub use message::{decode, encode, mean_of_messages};
pub use spec::{
    Codec, CodecSpec, MAX_TOPK_CHUNK, Quantizer, Rounding, message_len, topk_count, wire_bytes,
};
