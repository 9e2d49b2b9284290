//! The step counter every averager keeps, written once: a [`Schedule`] says which group, if
//! any, a step averages in; [`Scheduled`] counts the steps, saves and restores the count with
//! the schedule's configuration, and is the [`ModelAverager`] (the way burn's optimizer
//! adaptor wraps a simple optimizer and keeps its bookkeeping).

use std::any::Any;

use crate::averager::{ModelAverager, check_state_config};
use crate::error::AveragerError;
use crate::overlap::Overlap;
use crate::state::{AveragerConfig, AveragerState};
use localsgd_comm::Group;

/// When an averager averages: the group of each step, and the configuration a checkpoint
/// records. Pure: no communication, no counter of its own.
pub trait Schedule: Send + std::fmt::Debug + 'static {
    /// The group step `step` averages in, or `None` when that step does not average.
    fn group_at(&self, step: u64) -> Option<Group>;

    /// The configuration a checkpoint records, and a restore checks.
    fn config(&self) -> AveragerConfig;

    /// The overlap state, for a schedule built with overlapped averaging; `None` (the default)
    /// averages blocking.
    fn overlap(&self) -> Option<&Overlap> {
        None
    }

    /// Mutable access to the overlap state.
    fn overlap_mut(&mut self) -> Option<&mut Overlap> {
        None
    }
}

/// A [`Schedule`] with its step counter: the [`ModelAverager`] of every schedule
/// ([`PeriodicModelAverager`](crate::PeriodicModelAverager) and
/// [`HierarchicalModelAverager`](crate::HierarchicalModelAverager) are two of them).
#[derive(Debug)]
pub struct Scheduled<S> {
    schedule: S,
    step: u64,
}

impl<S> Scheduled<S> {
    /// `schedule` with its step counter at 0.
    pub fn from_schedule(schedule: S) -> Self {
        Self { schedule, step: 0 }
    }

    /// The schedule.
    pub fn schedule(&self) -> &S {
        &self.schedule
    }

    /// Mutable access to the schedule (its settings, before training starts).
    pub(crate) fn schedule_mut(&mut self) -> &mut S {
        &mut self.schedule
    }
}

impl<S: Schedule> ModelAverager for Scheduled<S> {
    fn step(&self) -> u64 {
        self.step
    }

    fn scheduled_group(&self) -> Option<Group> {
        self.schedule.group_at(self.step)
    }

    fn advance(&mut self) {
        self.step += 1;
    }

    fn state(&self) -> AveragerState {
        AveragerState {
            step: self.step,
            config: self.schedule.config(),
        }
    }

    fn load_state(&mut self, state: &AveragerState) -> Result<(), AveragerError> {
        check_state_config(&self.schedule.config(), state)?;
        self.step = state.step;
        Ok(())
    }

    fn overlap(&self) -> Option<&Overlap> {
        self.schedule.overlap()
    }

    fn overlap_mut(&mut self) -> Option<&mut Overlap> {
        self.schedule.overlap_mut()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
