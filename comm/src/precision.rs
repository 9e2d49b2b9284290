//! [`Precision`]: a half-precision wire format for float data, shared by the gradient
//! compression hooks and the outer averager's pseudo-gradient compression.

use crate::buffer::ElementType;
use crate::error::CommError;
use crate::group::GroupExt;
use half::{bf16, f16};
use std::fmt;

/// A half-precision wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// IEEE half precision (PyTorch's `fp16_compress_wrapper`).
    Fp16,
    /// bfloat16 (PyTorch's `bf16_compress_wrapper`).
    Bf16,
}

impl Precision {
    /// The element type data is cast to.
    pub fn element_type(self) -> ElementType {
        match self {
            Precision::Fp16 => ElementType::F16,
            Precision::Bf16 => ElementType::BF16,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        })
    }
}

/// A float type whose values can travel in a [`Precision`].
pub trait Compressible: Copy {
    /// This value rounded to nearest-even fp16 (once).
    fn to_f16(self) -> f16;
    /// This value rounded to nearest-even bf16 (once).
    fn to_bf16(self) -> bf16;
    /// A half value back in this type (exact).
    fn from_f64(v: f64) -> Self;
}

impl Compressible for f32 {
    fn to_f16(self) -> f16 {
        f16::from_f32(self)
    }
    fn to_bf16(self) -> bf16 {
        bf16::from_f32(self)
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Compressible for f64 {
    fn to_f16(self) -> f16 {
        f16::from_f64(self)
    }
    fn to_bf16(self) -> bf16 {
        bf16::from_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

/// Round every element of `buf` to `precision` and back, as a trip over the wire would
/// (nearest-even, once; the way back is exact). For a group of one rank, where nothing is sent.
pub fn round_to<T: Compressible>(buf: &mut [T], precision: Precision) {
    for x in buf.iter_mut() {
        *x = match precision {
            Precision::Fp16 => T::from_f64(x.to_f16().to_f64()),
            Precision::Bf16 => T::from_f64(x.to_bf16().to_f64()),
        };
    }
}

/// Average `buf` over `group` with the data on the wire in `precision`: every element rounded
/// to it once, divided by the group size and summed there (the hooks' compressed average,
/// PyTorch's `fp16_compress_hook` arithmetic), and the result written back exactly. Collective;
/// moves half the bytes of a full-precision f32 average.
pub fn average_compressed<G, T>(
    group: &G,
    buf: &mut [T],
    precision: Precision,
) -> Result<(), CommError>
where
    G: GroupExt + ?Sized,
    T: Compressible,
{
    match precision {
        Precision::Fp16 => {
            let mut wire: Vec<f16> = buf.iter().map(|&x| x.to_f16()).collect();
            group.average_slice(&mut wire)?;
            for (x, w) in buf.iter_mut().zip(&wire) {
                *x = T::from_f64(w.to_f64());
            }
        }
        Precision::Bf16 => {
            let mut wire: Vec<bf16> = buf.iter().map(|&x| x.to_bf16()).collect();
            group.average_slice(&mut wire)?;
            for (x, w) in buf.iter_mut().zip(&wire) {
                *x = T::from_f64(w.to_f64());
            }
        }
    }
    Ok(())
}
