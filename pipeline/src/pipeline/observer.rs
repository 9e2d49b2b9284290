//! What watches a run between iterations: the third override point, beside the batch source
//! and the forward/backward step.

use super::phase::PhaseTimes;
use super::source::DataPosition;
use localsgd_comm::Traffic;

/// What one completed iteration did.
#[derive(Debug, Clone, PartialEq)]
pub struct IterationReport {
    /// 0-based index of the iteration.
    pub iteration: u64,
    /// This rank's loss on its batch.
    pub loss: f32,
    /// The mean loss over all ranks, on metrics iterations.
    pub global_loss: Option<f64>,
    /// Whether the optimizer step was skipped (non-finite gradients).
    pub skipped_step: bool,
    /// The learning rate of this iteration's optimizer step (the scheduler's, or the constant).
    pub lr: f64,
    /// Wall time per phase in this iteration.
    pub times: PhaseTimes,
    /// Communication issued by this rank in this iteration (all groups).
    pub traffic: Traffic,
    /// The micro-batches this rank's step trained on: `accumulate`, or fewer in a step that
    /// met the end of the data.
    pub micro_batches: usize,
    /// Where the batch source stands after the iteration, when it records its position
    /// ([`BatchSource::position`](super::BatchSource::position)): the epoch a metrics row
    /// belongs to.
    pub data: Option<DataPosition>,
}

/// Why an [`IterationObserver`] stopped the run: any error, boxed.
pub type ObserverError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Watches every iteration of [`Pipeline::run_epoch`](super::Pipeline::run_epoch): metrics
/// files, a progress bar, burn-train's events, evaluations, checkpoint publishing, rehearsed
/// faults. It runs between iterations, outside every phase; whatever it communicates, every
/// rank must issue alike (the burn-train strategy's rank 0 feeds burn-train's event processor
/// and the other ranks do nothing).
pub trait IterationObserver<M> {
    /// Before iteration `iteration` (0-based, as [`IterationReport::iteration`] counts) starts,
    /// including the attempt that finds the epoch's data exhausted (it is then called again
    /// with the same index in the next epoch). An error stops the run on this rank. Does
    /// nothing unless overridden.
    fn before_iteration(&mut self, iteration: u64) -> Result<(), ObserverError> {
        let _ = iteration;
        Ok(())
    }

    /// After an iteration completed, with its report and the model after it. `Ok(false)` ends
    /// the epoch here; every rank must decide alike (agree with a collective first when the
    /// decision may differ, as the strategy does with rank 0's interrupter). An error stops
    /// the run on this rank.
    fn after_iteration(
        &mut self,
        report: &IterationReport,
        model: &M,
    ) -> Result<bool, ObserverError>;
}

/// Observes nothing: [`Pipeline::run_epoch`](super::Pipeline::run_epoch) runs to the end of
/// the epoch or its iteration budget.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl<M> IterationObserver<M> for NoObserver {
    fn after_iteration(&mut self, _: &IterationReport, _: &M) -> Result<bool, ObserverError> {
        Ok(true)
    }
}

/// Any `FnMut(&IterationReport, &M) -> Result<bool, ObserverError>` observes.
impl<M, F> IterationObserver<M> for F
where
    F: FnMut(&IterationReport, &M) -> Result<bool, ObserverError>,
{
    fn after_iteration(
        &mut self,
        report: &IterationReport,
        model: &M,
    ) -> Result<bool, ObserverError> {
        self(report, model)
    }
}

/// Why [`Pipeline::run_epoch`](super::Pipeline::run_epoch) returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochEnd {
    /// Some rank ran out of data: every rank ended the epoch together (move the source to its
    /// next epoch to go on).
    EndOfData,
    /// The pipeline reached the iteration budget it was given.
    Budget,
    /// The observer asked to stop.
    Stopped,
}
