//! [`GradientReducer`]: flatten a backward pass's gradients, run a hook bucket by bucket, and
//! hand the result back as [`GradientsParams`].

use crate::bucket::{BucketData, GradBucket};
use crate::error::HookError;
use crate::hook::CommHook;
use crate::plan::{BucketCaps, BucketPlan};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Tensor};
use localsgd_comm::params::{
    FlatBuffer, FlatLayout, ParamSelection, flatten_grads, grads_from_flat,
};

/// Runs a [`CommHook`] over a module's gradients, one bucket at a time.
///
/// The bucket layout covers every *trainable* float parameter (`require_grad`), whether or not it
/// received a gradient this step: a parameter without a local gradient contributes zeros, so
/// ranks never disagree on bucket sizes. The plan is computed once per module layout and cached.
///
/// The gradients are flattened once (one read of one concatenated tensor); each bucket, a
/// contiguous range of that flat gradient, is copied out, run through the hook and copied back;
/// the result is unflattened once. Overlapping the flattening of bucket `i + 1` with the
/// communication of bucket `i` on a helper thread was measured in `benches/bucket_overlap.rs`
/// and did not pay on the 2-core dev machine (mean ~1.01x of this path's time over six runs),
/// so the simple path is kept.
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
        let plan = match self.plan.take() {
            Some(plan) if !stale => plan,
            _ => {
                tracing::debug!(
                    params = params.len(),
                    "planning gradient buckets for a new module layout"
                );
                BucketPlan::new(params, element_bytes, self.caps)
            }
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
            let range = spec.flat_offset..spec.flat_offset + spec.len;
            let data = match &flat.buffer {
                FlatBuffer::F32(v) => BucketData::F32(v[range.clone()].to_vec()),
                FlatBuffer::F64(v) => BucketData::F64(v[range.clone()].to_vec()),
            };
            let mut bucket = GradBucket::with_params(i, i + 1 == count, data, spec.bucket_params());
            let given = bucket.element_type();
            hook.run(&mut bucket)?;
            let returned = (bucket.len(), bucket.element_type());
            match (&mut flat.buffer, bucket.into_data()) {
                (FlatBuffer::F32(v), BucketData::F32(b)) if b.len() == spec.len => {
                    v[range].copy_from_slice(&b)
                }
                (FlatBuffer::F64(v), BucketData::F64(b)) if b.len() == spec.len => {
                    v[range].copy_from_slice(&b)
                }
                _ => {
                    return Err(HookError::InvalidBucket(format!(
                        "hook {hook:?} returned bucket {i} with {} {} elements; it was given {} {} elements",
                        returned.0, returned.1, spec.len, given
                    )));
                }
            }
        }
        Ok(grads_from_flat(module, &flat)?)
    }
}
