//! The averager interface shared by the periodic and hierarchical averagers, so a training loop
//! can hold either (also as `Box<dyn ModelAverager>`).

use crate::average::average_in_group;
use crate::error::AveragerError;
use crate::outer::OuterAverager;
use crate::overlap::Overlap;
use crate::state::AveragerState;
use burn::module::Module;
use localsgd_comm::Group;
use localsgd_comm::params::ParamSelection;

/// A model-averaging schedule with a step counter.
///
/// Object safe: hold any averager as `Box<dyn ModelAverager>`. The averaging itself is the
/// generic [`AverageParameters::average_parameters`], available on every averager (including
/// `dyn ModelAverager`) through a blanket implementation.
pub trait ModelAverager: Send + std::fmt::Debug {
    /// Training iterations counted so far; the next [`average_parameters`] call handles this
    /// step.
    ///
    /// [`average_parameters`]: AverageParameters::average_parameters
    fn step(&self) -> u64;

    /// The group the current step averages in, or `None` when this step does not average.
    /// Pure: no communication, no state change.
    fn scheduled_group(&self) -> Option<Group>;

    /// Count one training iteration (`step += 1`) without averaging.
    fn advance(&mut self);

    /// The state to save in a checkpoint: the step counter and the configuration.
    fn state(&self) -> AveragerState;

    /// Restore a saved state. Fails with [`AveragerError::StateMismatch`] (naming both
    /// configurations) if it was saved from a differently configured averager, leaving this one
    /// unchanged.
    fn load_state(&mut self, state: &AveragerState) -> Result<(), AveragerError>;

    /// The overlap state, for an averager built with overlapped averaging (see
    /// [`overlap`](crate::overlap)); `None` (the default) averages blocking.
    fn overlap(&self) -> Option<&Overlap> {
        None
    }

    /// Mutable access to the overlap state (checkpoints wait for and restore pending averages
    /// through it).
    fn overlap_mut(&mut self) -> Option<&mut Overlap> {
        None
    }

    /// The outer-optimizer averager, for one (see [`outer`](crate::outer)); `None` (the
    /// default) for plain averaging.
    fn outer(&self) -> Option<&OuterAverager> {
        None
    }

    /// Mutable access to the outer-optimizer averager (taking `θ`, setting SlowMo's inner
    /// learning rate, restoring its state).
    fn outer_mut(&mut self) -> Option<&mut OuterAverager> {
        None
    }
}

/// Averaging a burn module on the averager's schedule. Implemented for every [`ModelAverager`].
pub trait AverageParameters: ModelAverager {
    /// Call exactly once per training iteration, after the optimizer step: if the current step is
    /// scheduled, average `selection`'s parameters of `module` within the scheduled group (see
    /// [`average_in_group`]); then count the step, averaged or not.
    ///
    /// Pass the parameters that had a gradient this step, e.g.
    /// [`ParamSelection::with_grads`]`(&model, &grads)` computed before the optimizer consumes
    /// the gradients. An empty selection communicates nothing but still counts the step.
    ///
    /// On error the step is not counted.
    fn average_parameters<M: Module>(
        &mut self,
        module: M,
        selection: &ParamSelection,
    ) -> Result<M, AveragerError> {
        if let Some(outer) = self.outer_mut() {
            return outer.average_module(module, selection);
        }
        let step = self.step();
        let group = self.scheduled_group();
        let module = match self.overlap_mut() {
            // Overlapped: first apply the average due now, then start this step's.
            Some(overlap) => {
                let module = overlap.complete_due(module, step)?;
                if let Some(group) = group {
                    overlap.start(&module, selection, &group, step)?;
                }
                module
            }
            None => match group {
                Some(group) => average_in_group(module, selection, &group)?,
                None => module,
            },
        };
        self.advance();
        Ok(module)
    }

    /// Apply an overlapped average still in flight now, before its completion step (call once
    /// at the end of training, on every rank, so the final model includes it). A no-op for
    /// blocking averagers and when nothing is pending. For an outer averager it is
    /// [`OuterAverager::finish`]: a Streaming DiLoCo pseudo-gradient in flight completes its
    /// collective and stays unapplied.
    fn complete_pending<M: Module>(&mut self, module: M) -> Result<M, AveragerError> {
        if let Some(outer) = self.outer_mut() {
            // Streaming DiLoCo: a pseudo-gradient in flight completes its collective but is
            // not applied (its perform step lies beyond the run).
            outer.finish()?;
            return Ok(module);
        }
        match self.overlap_mut() {
            Some(overlap) => overlap.complete_now(module),
            None => Ok(module),
        }
    }
}

impl<A: ModelAverager + ?Sized> AverageParameters for A {}

impl<A: ModelAverager + ?Sized> ModelAverager for Box<A> {
    fn step(&self) -> u64 {
        (**self).step()
    }
    fn scheduled_group(&self) -> Option<Group> {
        (**self).scheduled_group()
    }
    fn advance(&mut self) {
        (**self).advance()
    }
    fn state(&self) -> AveragerState {
        (**self).state()
    }
    fn load_state(&mut self, state: &AveragerState) -> Result<(), AveragerError> {
        (**self).load_state(state)
    }
    fn overlap(&self) -> Option<&Overlap> {
        (**self).overlap()
    }
    fn overlap_mut(&mut self) -> Option<&mut Overlap> {
        (**self).overlap_mut()
    }
    fn outer(&self) -> Option<&OuterAverager> {
        (**self).outer()
    }
    fn outer_mut(&mut self) -> Option<&mut OuterAverager> {
        (**self).outer_mut()
    }
}

/// Shared by both averagers: accept `state` if its configuration equals `current`, up to the
/// size of a hierarchical schedule's last level: that level is always the whole group, so a
/// state saved on another number of ranks (the survivors of a rank failure, a resume on fewer
/// or more workers) has the same schedule.
pub(crate) fn check_state_config(
    current: &crate::state::AveragerConfig,
    state: &AveragerState,
) -> Result<(), AveragerError> {
    use crate::state::AveragerConfig::Hierarchical;
    let same = match (&state.config, current) {
        (
            Hierarchical {
                levels: saved,
                warmup_steps: saved_warmup,
            },
            Hierarchical {
                levels,
                warmup_steps,
            },
        ) => {
            let lower = |l: &[crate::Level]| {
                l.iter()
                    .enumerate()
                    .map(|(i, x)| (x.period, (i + 1 < l.len()).then_some(x.group_size)))
                    .collect::<Vec<_>>()
            };
            saved_warmup == warmup_steps && lower(saved) == lower(levels)
        }
        (saved, current) => saved == current,
    };
    if same {
        Ok(())
    } else {
        Err(AveragerError::StateMismatch {
            saved: state.config.to_string(),
            current: current.to_string(),
        })
    }
}
