//! The codec's settings: [`Quantizer`], [`Codec`] (parsed from and shown as `int8`, `int4`,
//! `topk:F`, `topk:F+int8`, `topk:F+int4`), [`Rounding`], [`CodecSpec`], and the message length
//! they imply.

use super::error::CodecError;
use std::fmt;
use std::str::FromStr;

/// Largest top-k chunk: offsets within a chunk travel as u16.
pub const MAX_TOPK_CHUNK: usize = 1 << 16;

/// A symmetric integer quantizer with one f32 scale per chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantizer {
    /// 8-bit two's complement, values in [-127, 127].
    Int8,
    /// 4-bit two's complement, values in [-7, 7], two per byte (element `2j` in the low nibble,
    /// `2j + 1` in the high one).
    Int4,
}

impl Quantizer {
    /// The largest magnitude of a quantized value: 127 or 7.
    pub fn qmax(self) -> i8 {
        match self {
            Quantizer::Int8 => 127,
            Quantizer::Int4 => 7,
        }
    }

    /// Bytes that `count` quantized values take: `count` or `ceil(count / 2)`.
    pub fn packed_len(self, count: usize) -> usize {
        match self {
            Quantizer::Int8 => count,
            Quantizer::Int4 => count.div_ceil(2),
        }
    }
}

impl fmt::Display for Quantizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Quantizer::Int8 => "int8",
            Quantizer::Int4 => "int4",
        })
    }
}

/// A lossy codec for a flat f32 vector. Shown and parsed as `int8`, `int4`, `topk:F`,
/// `topk:F+int8` or `topk:F+int4`; serialized as that string too.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Codec {
    /// Every element as int8 with a per-chunk scale.
    Int8,
    /// Every element as int4 with a per-chunk scale.
    Int4,
    /// The `ceil(fraction * L)` largest-magnitude elements of every chunk, with their u16
    /// offsets; their values as f32, or quantized with a per-chunk scale.
    TopK {
        /// The share of every chunk that is sent, in (0, 1].
        fraction: f64,
        /// How the kept values travel: `None` as f32.
        quantizer: Option<Quantizer>,
    },
}

impl Codec {
    /// The quantizer of the values, if any (`None` for top-k with f32 values).
    pub fn quantizer(self) -> Option<Quantizer> {
        match self {
            Codec::Int8 => Some(Quantizer::Int8),
            Codec::Int4 => Some(Quantizer::Int4),
            Codec::TopK { quantizer, .. } => quantizer,
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::Int8 => f.write_str("int8"),
            Codec::Int4 => f.write_str("int4"),
            // f64's Display is the shortest text that parses back to the same value.
            Codec::TopK {
                fraction,
                quantizer: None,
            } => write!(f, "topk:{fraction}"),
            Codec::TopK {
                fraction,
                quantizer: Some(q),
            } => write!(f, "topk:{fraction}+{q}"),
        }
    }
}

impl FromStr for Codec {
    type Err = CodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "int8" => return Ok(Codec::Int8),
            "int4" => return Ok(Codec::Int4),
            _ => {}
        }
        let Some(rest) = s.strip_prefix("topk:") else {
            return Err(CodecError::UnknownCodec(s.to_string()));
        };
        let (text, quantizer) = match rest.split_once('+') {
            None => (rest, None),
            Some((text, "int8")) => (text, Some(Quantizer::Int8)),
            Some((text, "int4")) => (text, Some(Quantizer::Int4)),
            Some((_, other)) => return Err(CodecError::UnknownQuantizer(other.to_string())),
        };
        let fraction: f64 = text
            .parse()
            .map_err(|_| CodecError::FractionNotANumber(text.to_string()))?;
        check_fraction(fraction)?;
        Ok(Codec::TopK {
            fraction,
            quantizer,
        })
    }
}

impl From<Codec> for String {
    fn from(codec: Codec) -> String {
        codec.to_string()
    }
}

impl TryFrom<String> for Codec {
    type Error = CodecError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

fn check_fraction(fraction: f64) -> Result<(), CodecError> {
    if fraction.is_finite() && fraction > 0.0 && fraction <= 1.0 {
        Ok(())
    } else {
        Err(CodecError::FractionOutOfRange(fraction))
    }
}

/// How values are rounded to integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rounding {
    /// To nearest, ties to even.
    Nearest,
    /// `floor(v + u)` with `u` uniform in [0, 1) drawn from `seed`, the round and the rank
    /// (unbiased: the expected decoded value is the input).
    Stochastic {
        /// The run's seed.
        seed: u64,
    },
}

/// A codec with its chunk length and rounding: everything that fixes the bytes of a message.
/// Every rank of a group must use the same spec.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CodecSpec {
    /// The codec.
    pub codec: Codec,
    /// Consecutive elements that share a scale (and, for top-k, are selected from together); the
    /// last chunk may be shorter. At least 1; at most 65536 for top-k.
    pub chunk: usize,
    /// How quantized values are rounded (unused by top-k with f32 values).
    pub rounding: Rounding,
}

impl CodecSpec {
    /// Check the chunk (>= 1, and <= 65536 for top-k) and the top-k fraction (finite, in (0, 1]).
    pub fn validate(&self) -> Result<(), CodecError> {
        if self.chunk == 0 {
            return Err(CodecError::ZeroChunk);
        }
        if let Codec::TopK { fraction, .. } = self.codec {
            if self.chunk > MAX_TOPK_CHUNK {
                return Err(CodecError::ChunkTooLarge { chunk: self.chunk });
            }
            check_fraction(fraction)?;
        }
        Ok(())
    }
}

/// Elements top-k keeps of a chunk of `len` elements: `min(len, max(1, ceil(fraction * len)))`,
/// computed in f64.
pub fn topk_count(fraction: f64, len: usize) -> usize {
    let k = (fraction * len as f64).ceil();
    // `as` saturates (and maps NaN to 0); validate() keeps the fraction in (0, 1].
    (k as usize).max(1).min(len)
}

/// Bytes of one chunk of `len` elements (`len >= 1`).
pub(crate) fn chunk_len(codec: Codec, len: usize) -> usize {
    match codec {
        Codec::Int8 => 4 + len,
        Codec::Int4 => 4 + len.div_ceil(2),
        Codec::TopK {
            fraction,
            quantizer,
        } => {
            let k = topk_count(fraction, len);
            match quantizer {
                None => 6 * k,
                Some(q) => 4 + 2 * k + q.packed_len(k),
            }
        }
    }
}

/// Bytes of the message that encodes `n` elements with `spec`. It depends only on `(spec, n)`, so
/// every rank's message has the same length.
///
/// # Panics
///
/// If `spec.chunk` is 0 (`CodecSpec::validate` rejects it).
pub fn message_len(spec: &CodecSpec, n: usize) -> usize {
    assert!(spec.chunk > 0, "{}", CodecError::ZeroChunk);
    let full = n / spec.chunk;
    let tail = n % spec.chunk;
    let mut len = full * chunk_len(spec.codec, spec.chunk);
    if tail > 0 {
        len += chunk_len(spec.codec, tail);
    }
    len
}

/// Bytes one rank sends for `n` elements with `spec` (the same as [`message_len`]), for traffic
/// accounting and planning.
///
/// | codec | bytes per element (chunk `C`, fraction `F`) |
/// |---|---|
/// | `int8` | `1 + 4/C` |
/// | `int4` | `1/2 + 4/C` |
/// | `topk:F` | `6F` (u16 index and f32 value) |
/// | `topk:F+int8` | `3F + 4/C` |
/// | `topk:F+int4` | `2.5F + 4/C` |
///
/// (plus rounding: `ceil` of the kept count and of the int4 bytes, per chunk).
///
/// # Panics
///
/// If `spec.chunk` is 0.
pub fn wire_bytes(spec: &CodecSpec, n: usize) -> usize {
    message_len(spec, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_parse_display_round_trip() {
        for s in [
            "int8",
            "int4",
            "topk:0.01",
            "topk:0.25+int8",
            "topk:1+int4",
            "topk:0.3333333333333333",
            "topk:0.0000001",
        ] {
            let codec: Codec = s.parse().unwrap();
            assert_eq!(codec.to_string(), s);
            assert_eq!(codec.to_string().parse::<Codec>().unwrap(), codec);
        }
        assert_eq!(
            "topk:0.1+int8".parse::<Codec>().unwrap(),
            Codec::TopK {
                fraction: 0.1,
                quantizer: Some(Quantizer::Int8)
            }
        );
        // Other spellings of the fraction parse, and show in the canonical form.
        assert_eq!(
            "topk:1e-2".parse::<Codec>().unwrap().to_string(),
            "topk:0.01"
        );
        assert_eq!("topk:1.0".parse::<Codec>().unwrap().to_string(), "topk:1");
    }

    #[test]
    fn codec_display_round_trips_any_fraction() {
        let mut x = 0.7f64;
        for _ in 0..2000 {
            x = (x * 3.9 * (1.0 - x)).clamp(1e-300, 1.0); // logistic map: varied fractions
            for quantizer in [None, Some(Quantizer::Int8), Some(Quantizer::Int4)] {
                let codec = Codec::TopK {
                    fraction: x,
                    quantizer,
                };
                assert_eq!(codec.to_string().parse::<Codec>().unwrap(), codec);
            }
        }
    }

    #[test]
    fn codec_parse_errors_name_the_value_and_what_is_valid() {
        let cases = [
            (
                "int16",
                "unknown codec \"int16\" (valid: int8, int4, topk:F, topk:F+int8, topk:F+int4 with 0 < F <= 1)",
            ),
            (
                "",
                "unknown codec \"\" (valid: int8, int4, topk:F, topk:F+int8, topk:F+int4 with 0 < F <= 1)",
            ),
            (
                "topk:1.5",
                "topk fraction 1.5 is outside (0, 1] (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)",
            ),
            (
                "topk:0+int8",
                "topk fraction 0 is outside (0, 1] (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)",
            ),
            (
                "topk:-0.1",
                "topk fraction -0.1 is outside (0, 1] (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)",
            ),
            (
                "topk:NaN",
                "topk fraction NaN is outside (0, 1] (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)",
            ),
            (
                "topk:inf",
                "topk fraction inf is outside (0, 1] (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)",
            ),
            (
                "topk:abc",
                "topk fraction \"abc\" is not a number (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)",
            ),
            (
                "topk:",
                "topk fraction \"\" is not a number (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)",
            ),
            (
                "topk:0.1+int2",
                "unknown topk quantizer \"int2\" (valid: topk:F, topk:F+int8, topk:F+int4)",
            ),
            (
                "topk:0.1+int8+int4",
                "unknown topk quantizer \"int8+int4\" (valid: topk:F, topk:F+int8, topk:F+int4)",
            ),
        ];
        for (s, message) in cases {
            let err = s.parse::<Codec>().unwrap_err();
            assert_eq!(err.to_string(), message, "{s:?}");
        }
    }

    #[test]
    fn codec_serde_is_the_string() {
        let codec: Codec = "topk:0.05+int4".parse().unwrap();
        let json = serde_json::to_string(&codec).unwrap();
        assert_eq!(json, "\"topk:0.05+int4\"");
        assert_eq!(serde_json::from_str::<Codec>(&json).unwrap(), codec);
        let err = serde_json::from_str::<Codec>("\"topk:2\"").unwrap_err();
        assert!(
            err.to_string()
                .contains("topk fraction 2 is outside (0, 1]"),
            "{err}"
        );
        let spec = CodecSpec {
            codec,
            chunk: 64,
            rounding: Rounding::Stochastic { seed: 7 },
        };
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<CodecSpec>(&json).unwrap(), spec);
    }

    #[test]
    fn validate_errors() {
        let spec = |codec: &str, chunk| CodecSpec {
            codec: codec.parse().unwrap(),
            chunk,
            rounding: Rounding::Nearest,
        };
        assert_eq!(spec("int8", 1).validate(), Ok(()));
        assert_eq!(spec("int8", 1 << 20).validate(), Ok(()));
        assert_eq!(spec("topk:0.5", 65536).validate(), Ok(()));
        let err = spec("int4", 0).validate().unwrap_err();
        assert_eq!(err, CodecError::ZeroChunk);
        assert_eq!(
            err.to_string(),
            "codec chunk 0 is invalid (valid: chunk >= 1)"
        );
        let err = spec("topk:0.5+int8", 65537).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "codec chunk 65537 is too large for topk, whose indices are u16 (valid: 1 <= chunk <= 65536)"
        );
        // A fraction set in code rather than parsed is checked too.
        let bad = CodecSpec {
            codec: Codec::TopK {
                fraction: f64::NAN,
                quantizer: None,
            },
            chunk: 8,
            rounding: Rounding::Nearest,
        };
        assert!(matches!(
            bad.validate(),
            Err(CodecError::FractionOutOfRange(f)) if f.is_nan()
        ));
    }

    #[test]
    fn topk_count_rule() {
        assert_eq!(topk_count(0.25, 8), 2);
        assert_eq!(topk_count(0.25, 9), 3);
        assert_eq!(topk_count(0.01, 5), 1);
        assert_eq!(topk_count(1.0, 7), 7);
        assert_eq!(topk_count(0.1, 30), 3);
        // The product is rounded in f64 before the ceil: 0.07 * 100 is 7.000000000000001.
        assert_eq!(topk_count(0.07, 100), 8);
    }

    #[test]
    fn message_len_by_hand() {
        let spec = |codec: &str, chunk| CodecSpec {
            codec: codec.parse().unwrap(),
            chunk,
            rounding: Rounding::Nearest,
        };
        assert_eq!(message_len(&spec("int8", 4), 10), (4 + 4) * 2 + 4 + 2);
        assert_eq!(message_len(&spec("int4", 4), 10), (4 + 2) * 2 + 4 + 1);
        assert_eq!(message_len(&spec("int4", 5), 5), 4 + 3);
        assert_eq!(message_len(&spec("topk:0.25", 8), 16), 2 * 6 * 2);
        assert_eq!(
            message_len(&spec("topk:0.25+int8", 8), 9),
            (4 + 4 + 2) + (4 + 2 + 1)
        );
        assert_eq!(message_len(&spec("topk:0.5+int4", 6), 6), 4 + 6 + 2);
        assert_eq!(message_len(&spec("int8", 4), 0), 0);
        assert_eq!(
            wire_bytes(&spec("int8", 4), 10),
            message_len(&spec("int8", 4), 10)
        );
    }
}
