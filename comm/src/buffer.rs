//! Element types and type-erased mutable buffers that collectives operate on in place.

use half::{bf16, f16};
use std::fmt;

/// The element type of a collective's buffer. Part of every call's signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// IEEE half precision (used by the fp16 compression hook).
    F16,
    /// bfloat16 (used by the bf16 compression hook).
    BF16,
    /// Unsigned 64-bit integers (all-gather of flags and fingerprints).
    U64,
    /// Bytes ([`ProcessGroup::all_gather_bytes`](crate::ProcessGroup::all_gather_bytes):
    /// compressed payloads, opaque to the backend).
    U8,
}

impl ElementType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            ElementType::F32 => 4,
            ElementType::F64 | ElementType::U64 => 8,
            ElementType::F16 | ElementType::BF16 => 2,
            ElementType::U8 => 1,
        }
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
            ElementType::F16 => "f16",
            ElementType::BF16 => "bf16",
            ElementType::U64 => "u64",
            ElementType::U8 => "u8",
        })
    }
}

/// A mutable, type-erased view of a caller's buffer. Collectives work on it in place.
#[derive(Debug)]
pub enum BufferMut<'a> {
    /// `f32` elements.
    F32(&'a mut [f32]),
    /// `f64` elements.
    F64(&'a mut [f64]),
    /// `f16` elements.
    F16(&'a mut [f16]),
    /// `bf16` elements.
    BF16(&'a mut [bf16]),
}

/// Match a [`BufferMut`] and run `$body` with `$slice` bound to its typed slice: one arm per
/// element type, so that a backend whose collectives are generic over the element type writes
/// the dispatch once (`with_typed_slice!(buf, b => self.all_reduce_typed(b, op))`).
macro_rules! with_typed_slice {
    ($buf:expr, $slice:ident => $body:expr) => {
        match $buf {
            $crate::buffer::BufferMut::F32($slice) => $body,
            $crate::buffer::BufferMut::F64($slice) => $body,
            $crate::buffer::BufferMut::F16($slice) => $body,
            $crate::buffer::BufferMut::BF16($slice) => $body,
        }
    };
}
pub(crate) use with_typed_slice;

impl BufferMut<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            BufferMut::F32(b) => b.len(),
            BufferMut::F64(b) => b.len(),
            BufferMut::F16(b) => b.len(),
            BufferMut::BF16(b) => b.len(),
        }
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type.
    pub fn element_type(&self) -> ElementType {
        match self {
            BufferMut::F32(_) => ElementType::F32,
            BufferMut::F64(_) => ElementType::F64,
            BufferMut::F16(_) => ElementType::F16,
            BufferMut::BF16(_) => ElementType::BF16,
        }
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.element_type().size_bytes()
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// Element types a collective can reduce: `f32`, `f64`, `f16`, `bf16`.
pub trait Element: Copy + Send + Sync + Default + PartialOrd + sealed::Sealed + 'static {
    /// The runtime tag of this type.
    const TYPE: ElementType;
    /// Wrap a slice as a type-erased buffer.
    fn buffer(slice: &mut [Self]) -> BufferMut<'_>;
    /// `self + other`, rounded to this type.
    fn add(self, other: Self) -> Self;
    /// `self / n`, rounded to this type.
    fn div_count(self, n: usize) -> Self;
    /// The element as `f64` (exact for every supported type).
    fn to_f64(self) -> f64;
}

impl Element for f32 {
    const TYPE: ElementType = ElementType::F32;
    fn buffer(slice: &mut [Self]) -> BufferMut<'_> {
        BufferMut::F32(slice)
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn div_count(self, n: usize) -> Self {
        self / n as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Element for f64 {
    const TYPE: ElementType = ElementType::F64;
    fn buffer(slice: &mut [Self]) -> BufferMut<'_> {
        BufferMut::F64(slice)
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn div_count(self, n: usize) -> Self {
        self / n as f64
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl Element for f16 {
    const TYPE: ElementType = ElementType::F16;
    fn buffer(slice: &mut [Self]) -> BufferMut<'_> {
        BufferMut::F16(slice)
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        // The f32 sum of two f16 values is exact; one rounding to f16 gives IEEE half addition.
        f16::from_f32(self.to_f32() + other.to_f32())
    }
    #[inline(always)]
    fn div_count(self, n: usize) -> Self {
        f16::from_f32(self.to_f32() / n as f32)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}

impl Element for bf16 {
    const TYPE: ElementType = ElementType::BF16;
    fn buffer(slice: &mut [Self]) -> BufferMut<'_> {
        BufferMut::BF16(slice)
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        bf16::from_f32(self.to_f32() + other.to_f32())
    }
    #[inline(always)]
    fn div_count(self, n: usize) -> Self {
        bf16::from_f32(self.to_f32() / n as f32)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
}
