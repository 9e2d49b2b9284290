//! Burn's CPU backend (Flex) tensors as f32 slices, for the kernels that work on them in
//! place ([`gelu`](crate::gelu), [`fused`](crate::fused)).

use burn::backend::flex::FlexTensor;

/// `t` itself when its elements lie contiguously in its storage (at any offset), else a
/// contiguous copy (which starts at offset 0); with the range of storage elements it covers.
pub(crate) fn contiguous(t: FlexTensor) -> (FlexTensor, std::ops::Range<usize>) {
    let t = match t.layout().contiguous_offsets() {
        Some(_) => t,
        None => t.to_contiguous(),
    };
    let range = match t.layout().contiguous_offsets() {
        Some((start, end)) => start..end,
        None => 0..t.layout().num_elements(),
    };
    (t, range)
}

/// `t`'s f32 elements in row-major order: its storage where they lie there contiguously,
/// else a contiguous copy.
pub(crate) fn values(t: &FlexTensor) -> std::borrow::Cow<'_, [f32]> {
    match t.layout().contiguous_offsets() {
        Some((start, end)) => std::borrow::Cow::Borrowed(&t.storage::<f32>()[start..end]),
        None => std::borrow::Cow::Owned(t.to_contiguous().storage::<f32>().to_vec()),
    }
}
