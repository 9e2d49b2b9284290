//! Cutting the flat gradient into buckets: reverse traversal order, whole parameters, byte caps.

use crate::bucket::BucketParam;

/// Byte caps of gradient buckets. The defaults are PyTorch DDP's: 1 MiB for the first bucket
/// (so communication starts early), 25 MiB for the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketCaps {
    /// Cap of bucket 0, in bytes.
    pub first_bytes: usize,
    /// Cap of every later bucket, in bytes.
    pub rest_bytes: usize,
}

impl Default for BucketCaps {
    fn default() -> Self {
        Self {
            first_bytes: 1 << 20,
            rest_bytes: 25 << 20,
        }
    }
}

/// One parameter of the plan: where its gradient lives in the traversal-order flat buffer and
/// in its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedParam {
    /// Position among all float parameters of the module, in traversal order.
    pub index: usize,
    /// Offset in the flat gradient (trainable parameters in traversal order).
    pub flat_offset: usize,
    /// Offset in its bucket.
    pub bucket_offset: usize,
    /// Number of elements.
    pub len: usize,
}

/// One planned bucket: a run of consecutive parameters, so its gradients are one contiguous
/// range of the traversal-order flat gradient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSpec {
    /// Its parameters, in traversal order (the order of their values in the bucket).
    pub params: Vec<PlannedParam>,
    /// Offset of the bucket's first element in the flat gradient.
    pub flat_offset: usize,
    /// Number of elements.
    pub len: usize,
    /// Size in bytes.
    pub bytes: usize,
}

impl BucketSpec {
    /// The parameters as a [`GradBucket`](crate::GradBucket) describes them.
    pub fn bucket_params(&self) -> Vec<BucketParam> {
        self.params
            .iter()
            .map(|p| BucketParam {
                index: p.index,
                offset: p.bucket_offset,
                len: p.len,
            })
            .collect()
    }
}

/// How a module's trainable parameters are cut into buckets. The same on every rank for the same
/// module type (it depends only on traversal positions and sizes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPlan {
    /// The buckets, in communication order.
    pub buckets: Vec<BucketSpec>,
    /// Bytes per gradient element (4 for `f32` gradients, 8 when any trainable parameter is
    /// `f64`).
    pub element_bytes: usize,
    /// The trainable parameters as `(traversal index, element count)`, in traversal order.
    pub params: Vec<(usize, usize)>,
    /// The caps the plan was made with.
    pub caps: BucketCaps,
}

impl BucketPlan {
    /// Plan buckets for trainable parameters given as `(traversal index, element count)` in
    /// traversal order.
    ///
    /// Parameters are taken in reverse order (bucket 0 holds the last parameters) and never
    /// split. A bucket is closed before a parameter that would push it over its cap, so a bucket
    /// stays within its cap unless it holds a single parameter that alone is larger.
    pub fn new(params: Vec<(usize, usize)>, element_bytes: usize, caps: BucketCaps) -> Self {
        let mut flat_offsets = Vec::with_capacity(params.len());
        let mut total = 0;
        for &(_, len) in &params {
            flat_offsets.push(total);
            total += len;
        }
        // Runs of positions into `params`, collected backwards.
        let mut runs: Vec<Vec<usize>> = Vec::new();
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 0;
        let mut cap = caps.first_bytes;
        for (k, &(_, len)) in params.iter().enumerate().rev() {
            let size = len * element_bytes;
            if !current.is_empty() && bytes + size > cap {
                runs.push(std::mem::take(&mut current));
                bytes = 0;
                cap = caps.rest_bytes;
            }
            current.push(k);
            bytes += size;
        }
        if !current.is_empty() {
            runs.push(current);
        }
        let buckets = runs
            .into_iter()
            .map(|mut run| {
                run.reverse();
                let start = run.first().map_or(0, |&k| flat_offsets[k]);
                let params: Vec<PlannedParam> = run
                    .iter()
                    .map(|&k| PlannedParam {
                        index: params[k].0,
                        flat_offset: flat_offsets[k],
                        bucket_offset: flat_offsets[k] - start,
                        len: params[k].1,
                    })
                    .collect();
                let len: usize = params.iter().map(|p| p.len).sum();
                BucketSpec {
                    params,
                    flat_offset: start,
                    len,
                    bytes: len * element_bytes,
                }
            })
            .collect();
        Self {
            buckets,
            element_bytes,
            params,
            caps,
        }
    }

    /// Number of buckets.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether there are no buckets (no trainable parameter).
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Total number of gradient elements.
    pub fn total_len(&self) -> usize {
        self.params.iter().map(|&(_, len)| len).sum()
    }
}
