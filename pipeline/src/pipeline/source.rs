//! Where batches come from: any local iterator of batches. Sources never communicate.

/// Position of a source in its data, saved in checkpoints so a resumed run continues with the
/// same batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct DataPosition {
    /// Current epoch (0-based).
    pub epoch: u64,
    /// Index of the next batch within the epoch.
    pub next_batch: u64,
    /// Rows of the epoch's order dealt out before the current sharding began: 0, unless the
    /// world size changed inside this epoch (a resume on another number of ranks, or ranks
    /// that left), after which the source deals the rest of the epoch's order, from this row
    /// on, over the new ranks. Absent in checkpoints written before it existed (read as 0).
    #[serde(default)]
    pub start: u64,
}

/// Why a [`BatchSource`] could not deliver a batch (a data file that cannot be read, a batch
/// that cannot be built): any error, boxed.
pub type SourceError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A rank-local supply of batches for the current epoch. Implementations must not communicate:
/// the pipeline's `AgreeHasData` phase is the only place ranks agree on whether data is left.
pub trait BatchSource<B> {
    /// The next batch of this rank's shard, `Ok(None)` when the shard is exhausted for this
    /// epoch, or the error that kept it from being read. An error stops the iteration with
    /// [`PipelineError::Data`](super::PipelineError::Data) on this rank (its peers' next
    /// collective then fails naming it); it is never taken for the end of the epoch.
    fn next_batch(&mut self) -> Result<Option<B>, SourceError>;

    /// Where the source stands (for checkpoints); `None` if it cannot say.
    fn position(&self) -> Option<DataPosition> {
        None
    }

    /// Move to the start of the next epoch, for a step whose micro-batches run across this
    /// one's end ([`Accumulation::Stream`](super::Accumulation::Stream)); `false` when there is
    /// none (the end of the run's data; the default, for sources without epochs).
    fn next_epoch(&mut self) -> Result<bool, SourceError> {
        Ok(false)
    }
}

/// Any iterator of batches is a source (its position is not tracked).
pub struct IterSource<I>(pub I);

impl<B, I: Iterator<Item = B>> BatchSource<B> for IterSource<I> {
    fn next_batch(&mut self) -> Result<Option<B>, SourceError> {
        Ok(self.0.next())
    }
}
