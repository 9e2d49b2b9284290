//! [`GradientReducer`]: flatten a backward pass's gradients, run a hook bucket by bucket, and
//! hand the result back as [`GradientsParams`].

use crate::bucket::{BucketData, GradBucket};
use crate::error::HookError;
use crate::hook::CommHook;
use crate::plan::{BucketCaps, BucketPlan, BucketSpec};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Tensor};
use localsgd_comm::params::{
    FlatBuffer, FlatLayout, ParamSelection, flatten_grads, grads_from_flat,
};

/// Runs a [`CommHook`] over a module's gradients, one bucket at a time.
///
/// The bucket layout covers every *trainable* float parameter (`require_grad`), in reverse
/// traversal order, whether or not it received a gradient this step: a parameter without a local
/// gradient contributes zeros, so ranks never disagree on bucket sizes. The plan is computed once
/// per module layout and cached.
///
/// The gradients are flattened once (one read of one concatenated tensor), each bucket is copied
/// out, communicated and copied back, and the result is unflattened once. A criterion bench
/// (`benches/bucket_overlap.rs`) found this faster on a 2-core machine than flattening bucket
/// `i + 1` on another thread while bucket `i` is all-reduced.
#[derive(Debug, Clone, Default)]
pub struct GradientReducer {
    caps: BucketCaps,
    plan: Option<BucketPlan>,
}

/// The trainable float parameters of a module, in traversal order.
struct Trainable {
    ids: Vec<ParamId>,
    wide: bool,
}

impl ModuleVisitor for Trainable {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        let value = p.val();
        if value.is_require_grad() {
            self.ids.push(p.id);
            self.wide |= value.dtype() == DType::F64;
        }
    }
}

impl GradientReducer {
    /// A reducer with these bucket caps.
    pub fn new(caps: BucketCaps) -> Self {
        Self { caps, plan: None }
    }

    /// The bucket caps.
    pub fn caps(&self) -> BucketCaps {
        self.caps
    }

    /// The bucket plan for `module` (computed, or taken from the cache when the module's
    /// trainable layout is unchanged).
    pub fn plan<M: Module>(&mut self, module: &M) -> &BucketPlan {
        let (_, plan) = self.ensure_plan(module);
        plan
    }

    fn ensure_plan<M: Module>(&mut self, module: &M) -> (ParamSelection, &BucketPlan) {
        let mut trainable = Trainable {
            ids: Vec::new(),
            wide: false,
        };
        module.visit(&mut trainable);
        let selection = ParamSelection::ids(trainable.ids);
        let layout = FlatLayout::of(module, &selection);
        let params: Vec<(usize, usize)> = layout.entries.iter().map(|e| (e.index, e.len)).collect();
        let element_bytes = if trainable.wide { 8 } else { 4 };
        let stale = self
            .plan
            .as_ref()
            .is_none_or(|p| p.params != params || p.element_bytes != element_bytes);
        if stale {
            tracing::debug!(
                params = params.len(),
                "planning gradient buckets for a new module layout"
            );
        }
        let plan = match self.plan.take() {
            Some(plan) if !stale => plan,
            _ => BucketPlan::new(params, element_bytes, self.caps),
        };
        (selection, self.plan.insert(plan))
    }

    /// Communicate `grads` (the gradients of `module` from one backward pass) with `hook`,
    /// bucket by bucket, and return the result for the optimizer.
    ///
    /// Every trainable parameter gets a gradient in the result (the communicated one), except when
    /// the hook [skips communication](CommHook::skips_communication): then `grads` comes back
    /// untouched. A module without trainable parameters has no buckets: `grads` comes back
    /// untouched and the hook is not called.
    pub fn reduce<M: Module>(
        &mut self,
        module: &M,
        grads: GradientsParams,
        hook: &mut dyn CommHook,
    ) -> Result<GradientsParams, HookError> {
        if hook.skips_communication() {
            return Ok(grads);
        }
        let (selection, plan) = self.ensure_plan(module);
        if plan.is_empty() {
            return Ok(grads);
        }
        let mut flat = flatten_grads(module, &grads, &selection)?;
        let count = plan.buckets.len();
        for (i, spec) in plan.buckets.iter().enumerate() {
            let data = match &flat.buffer {
                FlatBuffer::F32(v) => BucketData::F32(gather(v, spec)),
                FlatBuffer::F64(v) => BucketData::F64(gather(v, spec)),
            };
            let mut bucket = GradBucket::with_params(i, i + 1 == count, data, spec.bucket_params());
            let element_type = bucket.element_type();
            hook.run(&mut bucket)?;
            let returned = (bucket.len(), bucket.element_type());
            match (&mut flat.buffer, bucket.into_data()) {
                (FlatBuffer::F32(v), BucketData::F32(b)) if b.len() == spec.len => {
                    scatter(v, spec, &b)
                }
                (FlatBuffer::F64(v), BucketData::F64(b)) if b.len() == spec.len => {
                    scatter(v, spec, &b)
                }
                _ => {
                    return Err(HookError::InvalidBucket(format!(
                        "hook {hook:?} returned bucket {i} with {} {} elements; it was given {} {} elements",
                        returned.0, returned.1, spec.len, element_type
                    )));
                }
            }
        }
        Ok(grads_from_flat(module, &flat)?)
    }
}

/// Copy a bucket's parameters out of the traversal-order flat buffer, in bucket order.
fn gather<T: Copy>(flat: &[T], spec: &BucketSpec) -> Vec<T> {
    let mut out = Vec::with_capacity(spec.len);
    for p in &spec.params {
        out.extend_from_slice(&flat[p.flat_offset..p.flat_offset + p.len]);
    }
    out
}

/// Copy a communicated bucket back into the flat buffer.
fn scatter<T: Copy>(flat: &mut [T], spec: &BucketSpec, bucket: &[T]) {
    for p in &spec.params {
        flat[p.flat_offset..p.flat_offset + p.len]
            .copy_from_slice(&bucket[p.bucket_offset..p.bucket_offset + p.len]);
    }
}
