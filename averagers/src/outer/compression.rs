//! How averages and pseudo-gradients travel ([`AverageCompression`], the setting
//! `average-compression`): in half precision through an all-reduce, or through a lossy codec
//! (int8, int4, top-k; `localsgd_comm::codec`), either as an all-gather of every rank's
//! message, decoded and summed in rank order, or as the quantized all-reduce
//! ([`LossyExchange`], the setting `average-exchange`).
//!
//! The wire formats' names, across the crates: [`Precision`] (`fp16`, `bf16`) and
//! [`Codec`] / [`CodecSpec`] (a lossy codec, with its chunk and rounding) are what a buffer is
//! encoded in (`localsgd-comm`); what gradients travel as is `GradientCompression` (the
//! setting `compression`: full or a [`Precision`]), what averages and pseudo-gradients travel
//! as is [`AverageCompression`] (a [`Precision`] or a [`CodecSpec`] with error feedback), and
//! `AverageCompressionKind` is the setting's value before a codec's options are applied
//! (`localsgd-pipeline`'s settings).

use localsgd_comm::Precision;
use localsgd_comm::codec::{Codec, CodecError, CodecSpec, Rounding, quantized_mean_wire_bytes};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The chunk a lossy codec quantizes with one scale (and picks its top-k in) unless told
/// otherwise: 4 bytes of scale per 1024 values.
pub const DEFAULT_CHUNK: usize = 1024;

/// The wire format of averages and pseudo-gradients (semantics §8 and §11).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AverageCompression {
    /// Rounded once to half precision, divided by the group size and summed in that precision
    /// (an all-reduce; OpenDiLoCo's fp16).
    Half(Precision),
    /// A lossy codec: every rank encodes its pseudo-gradient (plus, with error feedback, what
    /// it did not send before), the messages are all-gathered, and every rank decodes them and
    /// sums in rank order (`codec::mean_of_messages`), so all get bit-identical means.
    Lossy {
        /// The codec, its chunk and its rounding.
        spec: CodecSpec,
        /// Keep what a message did not carry and add it to the next (the residual is part of
        /// the checkpoint).
        error_feedback: bool,
        /// How the messages become the mean: all-gathered, or the quantized all-reduce.
        exchange: LossyExchange,
    },
}

/// How a lossy codec's messages become the world's mean (the setting `average-exchange`;
/// book: Semantics §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum LossyExchange {
    /// Whichever moves fewer bytes per rank for the vector's length and the world size: the
    /// all-gather on 2 ranks, the all-reduce from 3 on.
    #[default]
    Auto,
    /// Every rank's whole message all-gathered, decoded and averaged by every rank: one
    /// quantization, `W − 1` messages per rank on the wire.
    AllGather,
    /// The quantized all-reduce (`localsgd_comm::codec::quantized_mean`): an all-to-all of
    /// each rank's message cut into shards, the owner's mean of each shard quantized again,
    /// all-gathered: two quantizations, about `2 (W − 1) / W` of a message per rank. Blocking
    /// only (a delayed Streaming DiLoCo exchange is the all-gather).
    AllReduce,
}

impl LossyExchange {
    /// The exchange a mean of `n` values on `world` ranks uses: `AllGather` or `AllReduce` as
    /// set; `Auto` takes the all-reduce when its wire bytes per rank
    /// ([`quantized_mean_wire_bytes`]) are below the all-gather's (`(world − 1)` messages),
    /// else the all-gather (one quantization).
    pub fn resolve(self, spec: &CodecSpec, n: usize, world: usize) -> LossyExchange {
        match self {
            LossyExchange::Auto => {
                let gather =
                    (world.max(1) as u64 - 1) * localsgd_comm::codec::message_len(spec, n) as u64;
                if quantized_mean_wire_bytes(spec, n, world) < gather {
                    LossyExchange::AllReduce
                } else {
                    LossyExchange::AllGather
                }
            }
            chosen => chosen,
        }
    }

    /// The setting's value: `auto`, `all-gather` or `all-reduce`.
    pub fn name(self) -> &'static str {
        match self {
            LossyExchange::Auto => "auto",
            LossyExchange::AllGather => "all-gather",
            LossyExchange::AllReduce => "all-reduce",
        }
    }
}

impl fmt::Display for LossyExchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<Precision> for AverageCompression {
    fn from(p: Precision) -> Self {
        AverageCompression::Half(p)
    }
}

impl AverageCompression {
    /// `codec` with [`DEFAULT_CHUNK`], nearest rounding and error feedback.
    pub fn lossy(codec: Codec) -> Self {
        AverageCompression::Lossy {
            spec: CodecSpec {
                codec,
                chunk: DEFAULT_CHUNK,
                rounding: Rounding::Nearest,
            },
            error_feedback: true,
            exchange: LossyExchange::Auto,
        }
    }

    /// Check the codec's settings (chunk size, top-k fraction).
    pub fn validate(&self) -> Result<(), CodecError> {
        match self {
            AverageCompression::Half(_) => Ok(()),
            AverageCompression::Lossy { spec, .. } => spec.validate(),
        }
    }

    /// Bytes one rank sends for `n` pseudo-gradient values of `element_bytes` each (before the
    /// collective's own overhead): `2n` for half precision, the codec's message length for a
    /// lossy one.
    pub fn wire_bytes(&self, n: usize) -> usize {
        match self {
            AverageCompression::Half(_) => 2 * n,
            AverageCompression::Lossy { spec, .. } => localsgd_comm::codec::wire_bytes(spec, n),
        }
    }
}

impl fmt::Display for AverageCompression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AverageCompression::Half(p) => write!(f, "{p}"),
            AverageCompression::Lossy {
                spec,
                error_feedback,
                exchange,
            } => {
                write!(f, "{} (chunk {}", spec.codec, spec.chunk)?;
                if let Rounding::Stochastic { seed } = spec.rounding {
                    write!(f, ", stochastic rounding seed {seed}")?;
                }
                if !error_feedback {
                    write!(f, ", no error feedback")?;
                }
                if *exchange != LossyExchange::Auto {
                    write!(f, ", {exchange}")?;
                }
                write!(f, ")")
            }
        }
    }
}
