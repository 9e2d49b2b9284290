//! Averaging a burn module on an averager's schedule: [`AverageParameters`], for every
//! [`ModelAverager`] (an outer averager takes its outer step instead of a plain average).

use burn::module::Module;
use localsgd_comm::params::ParamSelection;

use crate::average::average_in_group;
use crate::averager::ModelAverager;
use crate::error::AveragerError;
use crate::outer::OuterAverager;

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
        if let Some(outer) = self.as_any_mut().downcast_mut::<OuterAverager>() {
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
        if let Some(outer) = self.as_any_mut().downcast_mut::<OuterAverager>() {
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
