//! The averager interface every averager implements, so a training loop can hold any of them
//! (also as `Box<dyn ModelAverager>`); the averaging itself is
//! [`AverageParameters`](crate::AverageParameters).

use std::any::Any;

use crate::error::AveragerError;
use crate::overlap::Overlap;
use crate::state::AveragerState;
use localsgd_comm::Group;

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

    /// This averager as [`Any`], for the concrete type behind a `dyn ModelAverager`: an outer
    /// averager is reached through [`outer`](Self::outer) (`dyn ModelAverager`'s
    /// `outer()`/`outer_mut()` in [`outer`](crate::outer)).
    fn as_any(&self) -> &dyn Any;

    /// Mutable [`as_any`](Self::as_any).
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

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
    fn as_any(&self) -> &dyn Any {
        (**self).as_any()
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        (**self).as_any_mut()
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
            let lower = |l: &[crate::state::Level]| {
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
