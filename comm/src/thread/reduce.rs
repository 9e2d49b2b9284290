//! The shared-memory reduction kernel: each rank reduces its own chunk of the buffer across all
//! peers and writes the result into every peer's buffer. No central copy, no allocation.

use crate::buffer::Element;
use crate::signature::ReduceOp;

const TILE: usize = 1024;

/// The half-open range of elements rank `rank` of `size` is responsible for.
pub(crate) fn chunk(len: usize, rank: usize, size: usize) -> (usize, usize) {
    (len * rank / size, len * (rank + 1) / size)
}

/// Reduce elements `[start, end)` of every peer buffer in `ptrs` (rank order) with `op`, and
/// store the result into all of them.
///
/// # Safety
/// Each pointer must address a live buffer of at least `end` elements of `T`, and no other
/// thread may read or write `[start, end)` of any of them during the call.
pub(crate) unsafe fn reduce_chunk<T: Element>(
    ptrs: &[*mut T],
    start: usize,
    end: usize,
    op: ReduceOp,
) {
    let n = ptrs.len();
    let mut acc = [T::default(); TILE];
    let mut lo = start;
    while lo < end {
        let len = TILE.min(end - lo);
        let acc = &mut acc[..len];
        // SAFETY: guaranteed by the caller: disjoint [start, end) ranges per thread.
        unsafe {
            acc.copy_from_slice(std::slice::from_raw_parts(ptrs[0].add(lo), len));
            for p in &ptrs[1..] {
                let src = std::slice::from_raw_parts(p.add(lo), len);
                match op {
                    ReduceOp::Sum | ReduceOp::Mean => {
                        for (a, &b) in acc.iter_mut().zip(src) {
                            *a = a.add(b);
                        }
                    }
                    ReduceOp::Max => {
                        for (a, &b) in acc.iter_mut().zip(src) {
                            // NaN propagates, as in MPI/NCCL max.
                            if b > *a || b.partial_cmp(&b).is_none() {
                                *a = b;
                            }
                        }
                    }
                    ReduceOp::Min => {
                        for (a, &b) in acc.iter_mut().zip(src) {
                            if b < *a || b.partial_cmp(&b).is_none() {
                                *a = b;
                            }
                        }
                    }
                }
            }
            if op == ReduceOp::Mean {
                for a in acc.iter_mut() {
                    *a = a.div_count(n);
                }
            }
            for p in ptrs {
                std::slice::from_raw_parts_mut(p.add(lo), len).copy_from_slice(acc);
            }
        }
        lo += len;
    }
}
