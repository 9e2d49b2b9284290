//! The [`CommHook`] trait and the serializable [`HookState`] of every hook.

use crate::bucket::GradBucket;
use crate::error::HookError;
use localsgd_comm::{Group, Precision};
use serde::{Deserialize, Serialize};

/// A gradient communication hook: called once per bucket, in bucket order, on every rank.
///
/// A hook works on the bucket in place and may keep state across calls (the post-local SGD hook
/// counts iterations). Every rank must run the same hook configuration, since hooks issue
/// collectives.
pub trait CommHook: Send + std::fmt::Debug {
    /// Communicate one bucket, in place.
    fn run(&mut self, bucket: &mut GradBucket) -> Result<(), HookError>;

    /// The hook's checkpointable state.
    fn state(&self) -> HookState;

    /// Restore a state saved by [`state`](CommHook::state). Fails, naming the difference, when
    /// the state comes from another kind of hook or another configuration.
    fn load_state(&mut self, state: &HookState) -> Result<(), HookError>;

    /// Whether running the hook on every bucket of this iteration would change neither the
    /// buckets nor the hook's state (pure local SGD after the warmup). The reducer then leaves
    /// the gradients untouched without flattening them.
    fn skips_communication(&self) -> bool {
        false
    }

    /// Offer the coming iteration to a pipelining reducer. A hook whose [`run`](CommHook::run)
    /// on every bucket of this iteration would do exactly [`BucketData::average_over`] one
    /// group, and nothing else to the buckets, advances its state past the iteration as those
    /// runs would (the post-local SGD hook counts it) and returns that group: the reducer then
    /// averages the buckets itself, non-blocking, and does not call `run` for this iteration.
    /// Any other hook returns `None` (the default) and is run bucket by bucket.
    ///
    /// [`BucketData::average_over`]: crate::BucketData::average_over
    fn take_mean_step(&mut self) -> Result<Option<Group>, HookError> {
        Ok(None)
    }
}

impl<H: CommHook + ?Sized> CommHook for Box<H> {
    fn run(&mut self, bucket: &mut GradBucket) -> Result<(), HookError> {
        (**self).run(bucket)
    }
    fn state(&self) -> HookState {
        (**self).state()
    }
    fn load_state(&mut self, state: &HookState) -> Result<(), HookError> {
        (**self).load_state(state)
    }
    fn skips_communication(&self) -> bool {
        (**self).skips_communication()
    }
    fn take_mean_step(&mut self) -> Result<Option<Group>, HookError> {
        (**self).take_mean_step()
    }
}

/// The checkpointable part of a [`PostLocalSgdHook`](crate::PostLocalSgdHook): its configuration and iteration counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostLocalSgdState {
    /// Number of warmup iterations with global gradient averaging.
    pub start_local_sgd_iter: u64,
    /// Whether buckets are averaged over the subgroup after the warmup.
    pub post_local_gradient_allreduce: bool,
    /// Iterations counted so far (saturates at `start_local_sgd_iter`).
    pub iter: u64,
}

/// The checkpointable state of a hook (serde; JSON looks like
/// `{"kind":"post_local_sgd","start_local_sgd_iter":10,"post_local_gradient_allreduce":true,"iter":4}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HookState {
    /// [`AllReduceHook`](crate::AllReduceHook): nothing to save.
    AllReduce,
    /// [`PostLocalSgdHook`](crate::PostLocalSgdHook): its configuration and `iter`.
    PostLocalSgd(PostLocalSgdState),
    /// [`CompressHook`](crate::CompressHook) around another hook.
    Compressed {
        /// The wire precision.
        precision: Precision,
        /// The inner hook's state.
        inner: Box<HookState>,
    },
}

impl HookState {
    /// A short name of the hook kind, for messages.
    pub fn kind(&self) -> String {
        match self {
            HookState::AllReduce => "all_reduce".into(),
            HookState::PostLocalSgd(_) => "post_local_sgd".into(),
            HookState::Compressed { precision, inner } => {
                format!("{precision}_compress({})", inner.kind())
            }
        }
    }

    /// The error for loading `got` into a hook whose state kind is `self`.
    pub(crate) fn kind_mismatch(&self, got: &HookState) -> HookError {
        HookError::StateMismatch(format!(
            "the saved state is from a {} hook but this hook is {}",
            got.kind(),
            self.kind()
        ))
    }
}
