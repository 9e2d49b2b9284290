//! A rank's shard of the training data, as the pipeline's batch source.

use burn::tensor::{Device, Int, Tensor};
use localsgd_models::data::{DataError, Dataset, ShardSampler};
use localsgd_pipeline::pipeline::{BatchSource, DataPosition, SourceError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// This rank's shard of the training data, epoch by epoch, in batches (PyTorch's
/// `DistributedSampler` + `DataLoader(drop_last=False)` layout).
pub(super) struct ShardLoader {
    data: Arc<Dataset>,
    sampler: ShardSampler,
    batch_size: usize,
    device: Device,
    epoch: u64,
    /// The first row of the epoch's order this world's sharding deals (nonzero only in an
    /// epoch dealt again after the number of ranks changed: [`ShardSampler::redeal`]).
    start: u64,
    batches: Vec<Vec<usize>>,
    next: usize,
    epochs: Option<u64>,
    /// Set by a [`ShardEnd`]: the epoch's data runs out at the next batch.
    end_requested: Arc<AtomicBool>,
}

/// A handle that makes a [`ShardLoader`] run out of data for the rest of its epoch (an uneven
/// shard; a rehearsed `short` fault), usable while the loader is lent to the pipeline.
#[derive(Clone)]
pub(super) struct ShardEnd(Arc<AtomicBool>);

impl ShardEnd {
    /// The loader's next batch of this epoch is its last: none is delivered.
    pub(super) fn end_here(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl ShardLoader {
    /// A loader positioned at `position`, with `epochs` epochs of data (`None`: as many as
    /// the run asks for).
    pub(super) fn new(
        data: Arc<Dataset>,
        sampler: ShardSampler,
        batch_size: usize,
        device: Device,
        position: DataPosition,
        epochs: Option<u64>,
    ) -> Result<Self, DataError> {
        let start = usize::try_from(position.start).unwrap_or(usize::MAX);
        let batches = sampler.batches_from(position.epoch, start, batch_size)?;
        Ok(Self {
            data,
            sampler,
            batch_size,
            device,
            epoch: position.epoch,
            start: position.start,
            batches,
            next: position.next_batch as usize,
            epochs,
            end_requested: Arc::default(),
        })
    }

    /// Move to the start of the next epoch.
    pub(super) fn advance_epoch(&mut self) -> Result<(), DataError> {
        self.epoch += 1;
        self.start = 0;
        self.batches = self.sampler.batches(self.epoch, self.batch_size)?;
        self.next = 0;
        Ok(())
    }

    /// The current epoch.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches per epoch on this rank.
    pub(super) fn batches_per_epoch(&self) -> usize {
        self.batches.len()
    }

    /// A handle that ends this loader's epoch where it stands.
    pub(super) fn shard_end(&self) -> ShardEnd {
        ShardEnd(Arc::clone(&self.end_requested))
    }
}

impl BatchSource<(Tensor<2>, Tensor<1, Int>)> for ShardLoader {
    fn next_batch(&mut self) -> Result<Option<(Tensor<2>, Tensor<1, Int>)>, SourceError> {
        if self.end_requested.swap(false, Ordering::Relaxed) {
            self.next = self.batches.len();
        }
        let Some(indices) = self.batches.get(self.next) else {
            return Ok(None);
        };
        let batch = self.data.batch_tensors(indices, &self.device)?;
        self.next += 1;
        Ok(Some(batch))
    }

    fn position(&self) -> Option<DataPosition> {
        Some(DataPosition {
            epoch: self.epoch,
            next_batch: self.next as u64,
            start: self.start,
        })
    }

    fn next_epoch(&mut self) -> Result<bool, SourceError> {
        if self.epochs.is_some_and(|e| self.epoch + 1 >= e) {
            return Ok(false);
        }
        self.advance_epoch()?;
        Ok(true)
    }
}
