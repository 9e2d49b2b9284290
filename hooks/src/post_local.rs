//! [`PostLocalSgdHook`]: global gradient averaging for a warmup, then local (subgroup) averaging.

use crate::bucket::GradBucket;
use crate::error::HookError;
use crate::hook::{CommHook, HookState, PostLocalSgdState};
use localsgd_comm::Group;

/// PyTorch's `post_localSGD_hook` with its `PostLocalSGDState`.
///
/// For the first `start_local_sgd_iter` iterations every bucket is averaged over the process
/// group (and the last bucket of each iteration increments `iter`); afterwards buckets are
/// averaged over the subgroup (by default the ranks on this host, created once on first use), or
/// left alone when `post_local_gradient_allreduce` is false. Pair it with a model averager whose
/// `warmup_steps == start_local_sgd_iter`.
#[derive(Debug, Clone)]
pub struct PostLocalSgdHook {
    process_group: Group,
    subgroup: Option<Group>,
    state: PostLocalSgdState,
}

impl PostLocalSgdHook {
    /// A hook averaging over `process_group` for `start_local_sgd_iter` iterations, then over
    /// `subgroup` (`None`: the intra-node group of `process_group`, created collectively on the
    /// first local iteration).
    pub fn new(
        process_group: Group,
        subgroup: Option<Group>,
        start_local_sgd_iter: u64,
        post_local_gradient_allreduce: bool,
    ) -> Self {
        Self {
            process_group,
            subgroup,
            state: PostLocalSgdState {
                start_local_sgd_iter,
                post_local_gradient_allreduce,
                iter: 0,
            },
        }
    }

    /// Iterations counted so far (saturates at `start_local_sgd_iter`).
    pub fn iter(&self) -> u64 {
        self.state.iter
    }

    /// The warmup length.
    pub fn start_local_sgd_iter(&self) -> u64 {
        self.state.start_local_sgd_iter
    }

    /// Whether buckets are averaged over the subgroup after the warmup.
    pub fn post_local_gradient_allreduce(&self) -> bool {
        self.state.post_local_gradient_allreduce
    }

    /// The post-warmup subgroup, once given or created.
    pub fn subgroup(&self) -> Option<&Group> {
        self.subgroup.as_ref()
    }

    fn in_warmup(&self) -> bool {
        self.state.iter < self.state.start_local_sgd_iter
    }
}

impl PostLocalSgdHook {
    /// Count one warmup iteration (at its last bucket, as the reference does).
    fn count_warmup_iteration(&mut self) {
        self.state.iter += 1;
        if self.state.iter == self.state.start_local_sgd_iter {
            tracing::info!(
                iterations = self.state.iter,
                "post-local SGD: warmup done, local SGD starts with the next iteration"
            );
        }
    }

    /// The subgroup of the local phase (created on first use: the ranks on this host).
    fn local_group(&mut self) -> Result<Group, HookError> {
        Ok(match &self.subgroup {
            Some(g) => g.clone(),
            None => {
                let g = self.process_group.intra_node()?;
                self.subgroup = Some(g.clone());
                g
            }
        })
    }
}

impl CommHook for PostLocalSgdHook {
    fn run(&mut self, bucket: &mut GradBucket) -> Result<(), HookError> {
        if self.in_warmup() {
            if bucket.is_last() {
                self.count_warmup_iteration();
            }
            return bucket.data_mut().average_over(&self.process_group);
        }
        if !self.state.post_local_gradient_allreduce {
            return Ok(());
        }
        let subgroup = self.local_group()?;
        bucket.data_mut().average_over(&subgroup)
    }

    fn take_mean_step(&mut self) -> Result<Option<Group>, HookError> {
        if self.in_warmup() {
            self.count_warmup_iteration();
            return Ok(Some(self.process_group.clone()));
        }
        if !self.state.post_local_gradient_allreduce {
            return Ok(None);
        }
        Ok(Some(self.local_group()?))
    }

    fn state(&self) -> HookState {
        HookState::PostLocalSgd(self.state)
    }

    fn load_state(&mut self, state: &HookState) -> Result<(), HookError> {
        let HookState::PostLocalSgd(saved) = state else {
            return Err(self.state().kind_mismatch(state));
        };
        let here = &self.state;
        if saved.start_local_sgd_iter != here.start_local_sgd_iter {
            return Err(HookError::StateMismatch(format!(
                "the saved post-local SGD state has start_local_sgd_iter = {} but this hook has {}",
                saved.start_local_sgd_iter, here.start_local_sgd_iter
            )));
        }
        if saved.post_local_gradient_allreduce != here.post_local_gradient_allreduce {
            return Err(HookError::StateMismatch(format!(
                "the saved post-local SGD state has post_local_gradient_allreduce = {} but this hook has {}",
                saved.post_local_gradient_allreduce, here.post_local_gradient_allreduce
            )));
        }
        if saved.iter > saved.start_local_sgd_iter {
            return Err(HookError::StateMismatch(format!(
                "the saved iter {} exceeds start_local_sgd_iter {} (iter saturates there)",
                saved.iter, saved.start_local_sgd_iter
            )));
        }
        self.state.iter = saved.iter;
        Ok(())
    }

    fn skips_communication(&self) -> bool {
        !self.in_warmup() && !self.state.post_local_gradient_allreduce
    }
}
