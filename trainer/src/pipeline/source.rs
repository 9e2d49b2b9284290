//! Where batches come from: any local iterator of batches. Sources never communicate.

/// Position of a source in its data, saved in checkpoints so a resumed run continues with the
/// same batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct DataPosition {
    /// Current epoch (0-based).
    pub epoch: u64,
    /// Index of the next batch within the epoch.
    pub next_batch: u64,
}

/// A rank-local supply of batches for the current epoch. Implementations must not communicate:
/// the pipeline's `AgreeHasData` phase is the only place ranks agree on whether data is left.
pub trait BatchSource<B> {
    /// The next batch of this rank's shard, or `None` when the shard is exhausted for this epoch.
    fn next_batch(&mut self) -> Option<B>;

    /// Where the source stands (for checkpoints); `None` if it cannot say.
    fn position(&self) -> Option<DataPosition> {
        None
    }
}

/// Any iterator of batches is a source (its position is not tracked).
pub struct IterSource<I>(pub I);

impl<B, I: Iterator<Item = B>> BatchSource<B> for IterSource<I> {
    fn next_batch(&mut self) -> Option<B> {
        self.0.next()
    }
}
