//! [`AllReduceHook`]: plain data parallelism (the gradient mean over a group).

use crate::bucket::GradBucket;
use crate::error::HookError;
use crate::hook::{CommHook, HookState};
use localsgd_comm::Group;

/// Average every bucket over a group: `bucket /= group.size(); all_reduce_sum(bucket)`. This is
/// PyTorch DDP's default behaviour (`allreduce_hook`).
#[derive(Debug, Clone)]
pub struct AllReduceHook {
    group: Group,
}

impl AllReduceHook {
    /// A hook averaging over `group`.
    pub fn new(group: Group) -> Self {
        Self { group }
    }

    /// The group it averages over.
    pub fn group(&self) -> &Group {
        &self.group
    }
}

impl CommHook for AllReduceHook {
    fn run(&mut self, bucket: &mut GradBucket) -> Result<(), HookError> {
        bucket.data_mut().average_over(&self.group)
    }

    fn state(&self) -> HookState {
        HookState::AllReduce
    }

    fn take_mean_step(&mut self) -> Result<Option<Group>, HookError> {
        Ok(Some(self.group.clone()))
    }

    fn load_state(&mut self, state: &HookState) -> Result<(), HookError> {
        match state {
            HookState::AllReduce => Ok(()),
            other => Err(self.state().kind_mismatch(other)),
        }
    }
}
