//! [`GradBucket`]: one slice of the flat gradient that a hook communicates at a time.

use crate::error::HookError;
use half::{bf16, f16};
use localsgd_comm::{BufferMut, ElementType, Group, GroupExt};

/// The values of a bucket. Gradients arrive as `F32` (or `F64` for `f64` models); the
/// compression wrappers temporarily turn them into `F16` / `BF16` for their inner hook.
#[derive(Debug, Clone, PartialEq)]
pub enum BucketData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 64-bit floats.
    F64(Vec<f64>),
    /// IEEE half precision.
    F16(Vec<f16>),
    /// bfloat16.
    BF16(Vec<bf16>),
}

impl BucketData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            BucketData::F32(v) => v.len(),
            BucketData::F64(v) => v.len(),
            BucketData::F16(v) => v.len(),
            BucketData::BF16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        match self {
            BucketData::F32(_) => ElementType::F32,
            BucketData::F64(_) => ElementType::F64,
            BucketData::F16(_) => ElementType::F16,
            BucketData::BF16(_) => ElementType::BF16,
        }
    }

    /// A type-erased mutable view for collectives.
    pub fn as_buffer_mut(&mut self) -> BufferMut<'_> {
        match self {
            BucketData::F32(v) => BufferMut::F32(v),
            BucketData::F64(v) => BufferMut::F64(v),
            BucketData::F16(v) => BufferMut::F16(v),
            BucketData::BF16(v) => BufferMut::BF16(v),
        }
    }

    /// The values as `f64` (exact for every element type).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            BucketData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            BucketData::F64(v) => v.clone(),
            BucketData::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            BucketData::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
        }
    }

    /// The same values converted to `target`, each rounded to nearest-even once.
    ///
    /// Errors on a target that is not a float type (`U64`).
    pub fn cast(&self, target: ElementType) -> Result<BucketData, HookError> {
        if self.element_type() == target {
            return Ok(self.clone());
        }
        // Narrowing from f32 goes straight to the target (no double rounding); every other
        // source is exact in f64, and half's f64 conversions round once.
        Ok(match (self, target) {
            (BucketData::F32(v), ElementType::F16) => {
                BucketData::F16(v.iter().map(|&x| f16::from_f32(x)).collect())
            }
            (BucketData::F32(v), ElementType::BF16) => {
                BucketData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect())
            }
            (_, ElementType::F32) => {
                BucketData::F32(self.to_f64_vec().into_iter().map(|x| x as f32).collect())
            }
            (_, ElementType::F64) => BucketData::F64(self.to_f64_vec()),
            (_, ElementType::F16) => {
                BucketData::F16(self.to_f64_vec().into_iter().map(f16::from_f64).collect())
            }
            (_, ElementType::BF16) => {
                BucketData::BF16(self.to_f64_vec().into_iter().map(bf16::from_f64).collect())
            }
            (_, ElementType::U64 | ElementType::U8) => {
                return Err(HookError::InvalidBucket(format!(
                    "cannot cast {} gradients to {target} (valid: f32, f64, f16, bf16)",
                    self.element_type()
                )));
            }
        })
    }

    /// Divide by `group.size()`, then all-reduce-sum over `group`: the mean of the book's semantics §1, with its
    /// rounding, in this buffer's precision.
    pub fn average_over(&mut self, group: &Group) -> Result<(), HookError> {
        match self {
            BucketData::F32(v) => group.average_slice(v)?,
            BucketData::F64(v) => group.average_slice(v)?,
            BucketData::F16(v) => group.average_slice(v)?,
            BucketData::BF16(v) => group.average_slice(v)?,
        }
        Ok(())
    }
}

/// Where one parameter's gradient sits inside a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketParam {
    /// Position of the parameter among all float parameters of the module, in traversal order
    /// (the same on every rank).
    pub index: usize,
    /// Offset of its first element in the bucket.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

/// One bucket of gradients, handed to a [`CommHook`](crate::CommHook).
///
/// Buckets hold whole parameters and are formed in reverse traversal order (the last layer's
/// gradients are ready first): bucket 0 holds the last parameters of the module. Inside a bucket
/// the parameters' values follow traversal order, so a bucket is one contiguous range of the flat
/// gradient.
#[derive(Debug, Clone, PartialEq)]
pub struct GradBucket {
    index: usize,
    is_last: bool,
    data: BucketData,
    params: Vec<BucketParam>,
}

impl GradBucket {
    /// A bucket with no parameter bookkeeping (for calling a hook directly).
    pub fn new(index: usize, is_last: bool, data: BucketData) -> Self {
        Self {
            index,
            is_last,
            data,
            params: Vec::new(),
        }
    }

    /// A bucket holding the gradients of `params`, laid out as they describe.
    pub fn with_params(
        index: usize,
        is_last: bool,
        data: BucketData,
        params: Vec<BucketParam>,
    ) -> Self {
        Self {
            index,
            is_last,
            data,
            params,
        }
    }

    /// Position of this bucket in the backward pass (0 first).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether this is the last bucket of the backward pass (hooks count iterations with it).
    pub fn is_last(&self) -> bool {
        self.is_last
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the bucket has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Element type of the values right now.
    pub fn element_type(&self) -> ElementType {
        self.data.element_type()
    }

    /// The values.
    pub fn data(&self) -> &BucketData {
        &self.data
    }

    /// The values, mutably.
    pub fn data_mut(&mut self) -> &mut BucketData {
        &mut self.data
    }

    /// Replace the values (e.g. with a half-precision copy); returns the old ones.
    pub fn replace_data(&mut self, data: BucketData) -> BucketData {
        std::mem::replace(&mut self.data, data)
    }

    /// Take the values out.
    pub fn into_data(self) -> BucketData {
        self.data
    }

    /// A type-erased mutable view of the values for collectives.
    pub fn buffer_mut(&mut self) -> BufferMut<'_> {
        self.data.as_buffer_mut()
    }

    /// The parameters in this bucket, in bucket order (empty for buckets made with
    /// [`new`](GradBucket::new)).
    pub fn params(&self) -> &[BucketParam] {
        &self.params
    }
}
