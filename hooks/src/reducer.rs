//! [`GradientReducer`]: flatten a backward pass's gradients, run a hook bucket by bucket, and
//! hand the result back as [`GradientsParams`].

use crate::bucket::{BucketData, GradBucket};
use crate::bucket_plan::{BucketCaps, BucketPlan};
use crate::error::HookError;
use crate::hook::CommHook;
use crate::in_flight::{InFlightGrads, PendingBuffer};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Tensor};
use localsgd_comm::params::{
    FlatBuffer, FlatLayout, ParamSelection, flatten_grads, grads_from_flat,
};
use localsgd_comm::{AsyncGroup, Group, GroupExt};
use std::sync::Arc;

/// Runs a [`CommHook`] over a module's gradients, one bucket at a time.
///
/// The bucket layout covers every *trainable* float parameter (`require_grad`), whether or not it
/// received a gradient this step: a parameter without a local gradient contributes zeros, so
/// ranks never disagree on bucket sizes. The plan is computed once per module layout and cached.
///
/// Two ways to communicate, with the same results to the bit:
///
/// - **Blocking** (the default): the gradients are flattened once (one read of one
///   concatenated tensor); each bucket, a contiguous range of that flat gradient, is averaged
///   in place when the hook's iteration is a plain mean ([`CommHook::take_mean_step`]), or else
///   copied out, run through the hook and copied back; the result is unflattened once.
/// - **Pipelined** ([`pipelined(true)`](Self::pipelined)): when the hook's iteration is a plain
///   mean over one group ([`CommHook::take_mean_step`]: the all-reduce hook, the post-local SGD
///   hook while it averages), [`start`](Self::start) reads each bucket on its own and starts its
///   average on a non-blocking [`AsyncGroup`] right away, so bucket `i` is on the wire while
///   bucket `i + 1` is read, and the caller can step the optimizer on bucket `i` while later
///   buckets are still in flight ([`InFlightGrads::next_part`]). Other hooks (compression) run
///   the blocking way. The async group is created on the first pipelined iteration (a
///   collective over the hook's group, at the same iteration on every rank) and replaced when
///   the hook's group changes (post-local SGD's switch to its subgroup). A plan of one bucket
///   has nothing to overlap: its mean runs blocking, in place on the flat gradient (one copy
///   fewer than the hook path).
///
/// A plain mean over a group of one rank is the identity: the gradients go to the optimizer
/// untouched, with no copy and no collective (unless a trainable parameter has no gradient:
/// then the flat path gives it zeros, as on more ranks).
///
/// The ordering rule that keeps this race-free: the gradient-sync phase starts every bucket's
/// collective, in bucket order, on every rank; the optimizer phase of the same iteration
/// completes all of them. Nothing is left pending across iterations; [`close`](Self::close)
/// reports a collective that was (a dropped [`InFlightGrads`]).
#[derive(Debug, Default)]
pub struct GradientReducer {
    caps: BucketCaps,
    plan: Option<BucketPlan>,
    pipelined: bool,
    side: Option<AsyncGroup>,
}

impl Clone for GradientReducer {
    /// The same caps, plan and setting; the clone creates its own async group when it first
    /// needs one (collectively, like the original).
    fn clone(&self) -> Self {
        Self {
            caps: self.caps,
            plan: self.plan.clone(),
            pipelined: self.pipelined,
            side: None,
        }
    }
}

/// The trainable float parameters of a module, in traversal order, and whether each has a
/// gradient in `grads` (one visit of the module serves the plan and the one-rank shortcut).
struct Trainable<'a> {
    grads: Option<&'a GradientsParams>,
    ids: Vec<ParamId>,
    wide: bool,
    all_have_grads: bool,
}

impl<'a> Trainable<'a> {
    fn of<M: Module>(module: &M, grads: Option<&'a GradientsParams>) -> Self {
        let mut trainable = Self {
            grads,
            ids: Vec::new(),
            wide: false,
            all_have_grads: true,
        };
        module.visit(&mut trainable);
        trainable
    }
}

impl ModuleVisitor for Trainable<'_> {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        let value = p.val();
        if value.is_require_grad() {
            self.ids.push(p.id);
            self.wide |= value.dtype() == DType::F64;
            if let Some(grads) = self.grads {
                self.all_have_grads &= grads.get::<D>(p.id).is_some();
            }
        }
    }
}

impl GradientReducer {
    /// A reducer with these bucket caps.
    pub fn new(caps: BucketCaps) -> Self {
        Self {
            caps,
            ..Self::default()
        }
    }

    /// Pipeline the buckets (non-blocking averaging, bucket by bucket) where the hook allows
    /// it; see the type's docs. Every rank must use the same setting.
    pub fn pipelined(mut self, on: bool) -> Self {
        self.pipelined = on;
        self
    }

    /// Whether buckets are pipelined where the hook allows it.
    pub fn is_pipelined(&self) -> bool {
        self.pipelined
    }

    /// The bucket caps.
    pub fn caps(&self) -> BucketCaps {
        self.caps
    }

    /// The bucket plan for `module` (computed, or taken from the cache when the module's
    /// trainable layout is unchanged).
    pub fn plan<M: Module>(&mut self, module: &M) -> &BucketPlan {
        let (_, _, plan) = self.ensure_plan(module, Trainable::of(module, None));
        plan
    }

    fn ensure_plan<M: Module>(
        &mut self,
        module: &M,
        trainable: Trainable<'_>,
    ) -> (ParamSelection, FlatLayout, &BucketPlan) {
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
        (selection, layout, self.plan.insert(plan))
    }

    /// Communicate `grads` (the gradients of `module` from one backward pass) with `hook`,
    /// bucket by bucket, and return the result for the optimizer.
    ///
    /// Every trainable parameter gets a gradient in the result (the communicated one), except when
    /// the hook [skips communication](CommHook::skips_communication): then `grads` comes back
    /// untouched. A module without trainable parameters has no buckets: `grads` comes back
    /// untouched and the hook is not called. Pipelined or not, this returns when every bucket is
    /// reduced; use [`start`](Self::start) to step an optimizer while buckets are in flight.
    pub fn reduce<M: Module>(
        &mut self,
        module: &M,
        grads: GradientsParams,
        hook: &mut dyn CommHook,
    ) -> Result<GradientsParams, HookError> {
        self.start(module, grads, hook)?.wait_all(module)
    }

    /// Start communicating `grads` with `hook` and return them in flight: with pipelining and a
    /// hook that allows it, every bucket's average has been started (non-blocking) when this
    /// returns; otherwise the hook has run on every bucket and the result is ready. Either way
    /// the result equals [`reduce`](Self::reduce)'s.
    pub fn start<M: Module>(
        &mut self,
        module: &M,
        grads: GradientsParams,
        hook: &mut dyn CommHook,
    ) -> Result<InFlightGrads, HookError> {
        if hook.skips_communication() {
            return Ok(InFlightGrads::ready(grads));
        }
        let trainable = Trainable::of(module, Some(&grads));
        if trainable.ids.is_empty() {
            return Ok(InFlightGrads::ready(grads));
        }
        let Some(group) = hook.take_mean_step()? else {
            let (selection, _, plan) = self.ensure_plan(module, trainable);
            return run_blocking(module, grads, hook, &selection, plan).map(InFlightGrads::ready);
        };
        // The mean over one rank is the identity, bit for bit (also in the f64 plan of a model
        // with f32 parameters: f32 -> f64 -> f32 is exact), so the gradients go to the optimizer
        // as they are: no flatten, no write-back, no collective, and no further visit of the
        // module. Only when a trainable parameter lacks a gradient does the flat path run, to
        // give it the zeros every rank's bucket has.
        if group.size() == 1 && trainable.all_have_grads {
            return Ok(InFlightGrads::ready(grads));
        }
        let pipelined = self.pipelined;
        let (selection, layout, plan) = self.ensure_plan(module, trainable);
        let buckets = plan.len();
        // Not pipelined, one rank (its mean is the identity: a parameter without a gradient
        // gets zeros) or one bucket (the optimizer needs it whole): the mean runs blocking, in
        // place on the flat gradient, bucket by bucket.
        // With pipelining the helper is created whenever the group has peers, so the traffic
        // does not depend on the bucket layout.
        let overlap = pipelined && group.size() > 1;
        if overlap {
            self.side_for(group.clone())?;
        }
        let plan = self
            .plan
            .as_ref()
            .ok_or_else(|| HookError::InvalidBucket("the bucket plan was not computed".into()))?;
        if !overlap || buckets < 2 {
            return mean_blocking(module, grads, &selection, plan, &group)
                .map(InFlightGrads::ready);
        }
        let wide = plan.element_bytes == 8;
        let bucket_ids: Vec<Vec<ParamId>> = plan
            .buckets
            .iter()
            .map(|spec| {
                spec.params
                    .iter()
                    .filter_map(|p| {
                        layout
                            .entries
                            .binary_search_by_key(&p.index, |e| e.index)
                            .ok()
                            .map(|at| layout.entries[at].id)
                    })
                    .collect()
            })
            .collect();
        let side = self.side.as_mut().ok_or_else(|| {
            HookError::InvalidBucket("the non-blocking group was not created".into())
        })?;
        let mut out = InFlightGrads::buckets();
        for ids in bucket_ids {
            let flat = flatten_grads(module, &grads, &ParamSelection::ids(ids))?;
            // The bucket travels in the plan's precision, as in the blocking path (an f32 bucket
            // of a model with f64 parameters is averaged in f64).
            let pending = match flat.buffer {
                FlatBuffer::F32(v) if wide => {
                    PendingBuffer::F64(side.start_average(v.into_iter().map(f64::from).collect())?)
                }
                FlatBuffer::F32(v) => PendingBuffer::F32(side.start_average(v)?),
                FlatBuffer::F64(v) => PendingBuffer::F64(side.start_average(v)?),
            };
            out.push(flat.layout, pending);
        }
        Ok(out)
    }

    /// The async group over `group`'s ranks, created (collectively) on first use and replaced
    /// when the hook's group changes.
    fn side_for(&mut self, group: Group) -> Result<&mut AsyncGroup, HookError> {
        let reuse = self
            .side
            .as_ref()
            .is_some_and(|side| Arc::ptr_eq(side.group(), &group));
        if !reuse {
            if let Some(old) = self.side.take() {
                old.close()?;
            }
            tracing::debug!(
                ranks = group.size(),
                "pipelined gradient sync: creating the non-blocking group"
            );
            self.side = Some(AsyncGroup::new(group)?);
        }
        self.side.as_mut().ok_or_else(|| {
            HookError::InvalidBucket("the non-blocking group was not created".into())
        })
    }

    /// Stop the pipelining helper, if one was started, and check that nothing was left
    /// pending ([`CommError::LeftPending`](localsgd_comm::CommError::LeftPending) otherwise). A
    /// later pipelined iteration creates a new one.
    pub fn close(&mut self) -> Result<(), HookError> {
        match self.side.take() {
            Some(side) => Ok(side.close()?),
            None => Ok(()),
        }
    }
}

/// A plain mean over `group`, blocking: flatten once, average each bucket's range in place (the
/// collectives the hook would issue, with its rounding), unflatten once.
fn mean_blocking<M: Module>(
    module: &M,
    grads: GradientsParams,
    selection: &ParamSelection,
    plan: &BucketPlan,
    group: &Group,
) -> Result<GradientsParams, HookError> {
    let mut flat = flatten_grads(module, &grads, selection)?;
    for spec in &plan.buckets {
        let range = spec.flat_offset..spec.flat_offset + spec.len;
        match &mut flat.buffer {
            FlatBuffer::F32(v) => group.average_slice(&mut v[range])?,
            FlatBuffer::F64(v) => group.average_slice(&mut v[range])?,
        }
    }
    Ok(grads_from_flat(module, &flat)?)
}

/// The blocking path: flatten once, run the hook on each bucket's copy, unflatten once.
fn run_blocking<M: Module>(
    module: &M,
    grads: GradientsParams,
    hook: &mut dyn CommHook,
    selection: &ParamSelection,
    plan: &BucketPlan,
) -> Result<GradientsParams, HookError> {
    let mut flat = flatten_grads(module, &grads, selection)?;
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
