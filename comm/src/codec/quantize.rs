//! Per-chunk symmetric quantization: the scale, the rounding of one value, and the int8/int4
//! byte layout (two's complement; int4 packs element `2j` in the low nibble of byte `j`).

use super::error::CodecError;
use super::rng::uniform;
use super::spec::Quantizer;

/// The noise of one rank in one round: `None` rounds to nearest, `Some(key)` stochastically.
pub(crate) type NoiseKey = Option<u64>;

/// `absmax / qmax` in f32, with `absmax` the largest `|x|` of `values`.
pub(crate) fn scale_of(values: impl Iterator<Item = f32>, q: Quantizer) -> f32 {
    let absmax = values.fold(0.0f32, |m, x| m.max(x.abs()));
    absmax / f32::from(q.qmax())
}

/// One value quantized: 0 where the scale is 0; else `v = x / scale`, rounded to nearest-even
/// (`key` None) or `floor(v + u)` with `u` the draw of element `index`, clamped to
/// `[-qmax, qmax]`.
#[inline]
pub(crate) fn quantize(x: f32, scale: f32, q: Quantizer, key: NoiseKey, index: u64) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    let v = x / scale;
    let r = match key {
        None => v.round_ties_even(),
        Some(key) => (v + uniform(key, index)).floor(),
    };
    let qmax = f32::from(q.qmax());
    r.clamp(-qmax, qmax) as i8
}

/// A quantized value back: `q * scale` in f32.
#[inline]
pub(crate) fn dequantize(q: i8, scale: f32) -> f32 {
    f32::from(q) * scale
}

/// Append `values` to `out` in `q`'s byte layout.
pub(crate) fn pack(values: &[i8], q: Quantizer, out: &mut Vec<u8>) {
    match q {
        Quantizer::Int8 => out.extend(values.iter().map(|&v| v as u8)),
        Quantizer::Int4 => out.extend(values.chunks(2).map(|pair| {
            let lo = pair[0] as u8 & 0x0F;
            let hi = pair.get(1).map_or(0, |&v| v as u8 & 0x0F);
            lo | (hi << 4)
        })),
    }
}

/// Read a chunk's scale at `offset`: finite and not negative, or the message is corrupt.
pub(crate) fn read_scale(bytes: &[u8; 4], offset: usize) -> Result<f32, CodecError> {
    let scale = f32::from_le_bytes(*bytes);
    if scale.is_finite() && !scale.is_sign_negative() {
        Ok(scale)
    } else {
        Err(CodecError::Corrupt {
            offset,
            reason: format!("scale {scale} is not a finite non-negative number"),
        })
    }
}

/// Unpack `count` values of `q` from `bytes` (exactly `q.packed_len(count)` long, starting at
/// message byte `offset`), calling `put(j, value)` for each. A value outside `[-qmax, qmax]` or
/// a non-zero padding nibble is corrupt.
pub(crate) fn unpack(
    bytes: &[u8],
    count: usize,
    q: Quantizer,
    offset: usize,
    mut put: impl FnMut(usize, i8),
) -> Result<(), CodecError> {
    let qmax = q.qmax();
    let bad = |j: usize, v: i8| CodecError::Corrupt {
        offset: offset + q.packed_len(j + 1) - 1,
        reason: format!("{q} value {v} is outside [-{qmax}, {qmax}]"),
    };
    match q {
        Quantizer::Int8 => {
            for (j, &b) in bytes.iter().enumerate() {
                let v = b as i8;
                if v < -qmax {
                    return Err(bad(j, v));
                }
                put(j, v);
            }
        }
        Quantizer::Int4 => {
            for (j, &b) in bytes.iter().enumerate() {
                let lo = ((b << 4) as i8) >> 4;
                let hi = (b as i8) >> 4;
                if lo < -qmax {
                    return Err(bad(2 * j, lo));
                }
                put(2 * j, lo);
                if 2 * j + 1 < count {
                    if hi < -qmax {
                        return Err(bad(2 * j + 1, hi));
                    }
                    put(2 * j + 1, hi);
                } else if hi != 0 {
                    return Err(CodecError::Corrupt {
                        offset: offset + j,
                        reason: format!("padding nibble {hi} is not 0"),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rounds_ties_to_even_and_clamps() {
        let q = Quantizer::Int8;
        let got: Vec<i8> = [0.5f32, 1.5, 2.5, -0.5, -2.5, 126.5, 127.0, -127.0]
            .iter()
            .map(|&x| quantize(x, 1.0, q, None, 0))
            .collect();
        assert_eq!(got, [0, 2, 2, 0, -2, 126, 127, -127]);
        // A value just past qmax after the division is clamped.
        assert_eq!(quantize(200.0, 1.0, q, None, 0), 127);
        assert_eq!(quantize(-9.0, 1.0, Quantizer::Int4, None, 0), -7);
        assert_eq!(quantize(3.0, 0.0, q, None, 0), 0);
    }

    #[test]
    fn stochastic_is_floor_or_ceil() {
        for i in 0..200u64 {
            let v = quantize(2.25, 1.0, Quantizer::Int8, Some(99), i);
            assert!(v == 2 || v == 3);
            // Integers stay put: u < 1.
            assert_eq!(quantize(-3.0, 1.0, Quantizer::Int8, Some(99), i), -3);
        }
    }

    #[test]
    fn int4_packing_round_trips_with_odd_counts() {
        let values: Vec<i8> = vec![-7, 7, 0, -1, 3];
        let mut bytes = Vec::new();
        pack(&values, Quantizer::Int4, &mut bytes);
        assert_eq!(bytes, [0x79, 0xF0, 0x03]);
        let mut back = vec![0i8; 5];
        unpack(&bytes, 5, Quantizer::Int4, 0, |j, v| back[j] = v).unwrap();
        assert_eq!(back, values);
        // A non-zero padding nibble and -8 are corrupt.
        let err = unpack(&[0x79, 0xF0, 0x13], 5, Quantizer::Int4, 10, |_, _| {}).unwrap_err();
        assert_eq!(
            err.to_string(),
            "corrupt message: padding nibble 1 is not 0 at byte 12"
        );
        let err = unpack(&[0x08], 2, Quantizer::Int4, 4, |_, _| {}).unwrap_err();
        assert_eq!(
            err.to_string(),
            "corrupt message: int4 value -8 is outside [-7, 7] at byte 4"
        );
        let err = unpack(&[1, 0x80], 2, Quantizer::Int8, 4, |_, _| {}).unwrap_err();
        assert_eq!(
            err.to_string(),
            "corrupt message: int8 value -128 is outside [-127, 127] at byte 5"
        );
    }
}
