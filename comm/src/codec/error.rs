//! [`CodecError`]: everything the lossy codec rejects, from a bad codec string to a corrupt
//! message from a peer.

/// What every codec error lists as the valid codec strings.
pub(crate) const VALID_CODECS: &str =
    "valid: int8, int4, topk:F, topk:F+int8, topk:F+int4 with 0 < F <= 1";

/// Everything the lossy codec rejects. Messages name the bad value and say what is valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// A codec string that is none of the valid forms.
    #[error("unknown codec {0:?} ({VALID_CODECS})")]
    UnknownCodec(String),
    /// The `F` of `topk:F` is not a number.
    #[error(
        "topk fraction {0:?} is not a number (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)"
    )]
    FractionNotANumber(String),
    /// The top-k fraction is not in (0, 1] (or not finite).
    #[error(
        "topk fraction {0} is outside (0, 1] (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)"
    )]
    FractionOutOfRange(f64),
    /// The quantizer after `topk:F+` is unknown.
    #[error("unknown topk quantizer {0:?} (valid: topk:F, topk:F+int8, topk:F+int4)")]
    UnknownQuantizer(String),
    /// A chunk of 0 elements.
    #[error("codec chunk 0 is invalid (valid: chunk >= 1)")]
    ZeroChunk,
    /// A top-k chunk longer than its u16 indices can address.
    #[error(
        "codec chunk {chunk} is too large for topk, whose indices are u16 (valid: 1 <= chunk <= 65536)"
    )]
    ChunkTooLarge {
        /// The chunk asked for.
        chunk: usize,
    },
    /// An input element is NaN or infinite; nothing was written.
    #[error("element {index} is {value}, which a lossy codec cannot encode (valid: finite values)")]
    NonFinite {
        /// Index of the first non-finite element in the flat vector.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// A buffer whose length does not match the element count or the message length.
    #[error("{what} has length {got}, expected {expected}")]
    Length {
        /// Which buffer ("message", "output", "residual", "gathered messages").
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length it must have.
        expected: usize,
    },
    /// `mean_of_messages` over a world of 0 ranks.
    #[error("world size 0 is invalid for mean_of_messages (valid: world >= 1)")]
    ZeroWorld,
    /// A message that encode cannot have produced (a corrupt or mismatched peer).
    #[error("corrupt message: {reason} at byte {offset}")]
    Corrupt {
        /// Byte offset within the message.
        offset: usize,
        /// What is wrong there.
        reason: String,
    },
    /// An error in one rank's message of a gathered buffer.
    #[error("rank {rank}'s message: {source}")]
    Rank {
        /// The rank whose message is bad.
        rank: usize,
        /// What is wrong with it.
        source: Box<CodecError>,
    },
}
