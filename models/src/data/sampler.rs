//! Per-rank sharding and batching with the semantics of PyTorch's
//! `DistributedSampler(drop_last=False)` followed by `DataLoader(batch_size=B, drop_last=False)`.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use super::DataError;
use localsgd_pipeline::pipeline::DataPosition;

/// Which dataset rows one rank visits in an epoch, and in which batches.
///
/// Semantics (PyTorch `DistributedSampler`, `drop_last=False`): the epoch order is `0..n`, or a
/// permutation of it when shuffling; it is padded to `total_size = ceil(n / world) * world` by
/// wrapping around from its start (repeatedly if the padding exceeds `n`); rank `r` takes
/// positions `r, r + world, r + 2*world, ...`. Every rank therefore gets exactly
/// `ceil(n / world)` indices, and the ranks together cover every row at least once.
/// Batches are consecutive runs of `batch_size` of those indices, the last one possibly smaller.
///
/// Shuffling differs from PyTorch only in the random generator: PyTorch uses
/// `torch.randperm` seeded with `seed + epoch`, which cannot be reproduced outside torch; here the
/// permutation is a Fisher–Yates shuffle driven by ChaCha8 keyed by `seed` on stream `epoch`.
/// It is identical on all ranks for the same `(seed, epoch)`, and differs between epochs.
///
/// After the number of ranks changed inside an epoch, the rest of that epoch is dealt from a
/// start row on ([`redeal`](Self::redeal)): the epoch order's rows `start..n` take the place of
/// `0..n` above (padded by wrapping around from row `start`, then strided over the ranks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSampler {
    n: usize,
    world: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
}

impl ShardSampler {
    /// A sampler over `n` rows for `rank` of `world` ranks, without shuffling.
    ///
    /// Errors with [`DataError::InvalidSampler`] unless `world >= 1` and `rank < world`.
    pub fn new(n: usize, world: usize, rank: usize) -> Result<Self, DataError> {
        if world == 0 || rank >= world {
            return Err(DataError::InvalidSampler { world, rank });
        }
        Ok(Self {
            n,
            world,
            rank,
            shuffle: false,
            seed: 0,
        })
    }

    /// The same sampler, shuffling every epoch with a permutation determined by `(seed, epoch)`.
    pub fn with_shuffle(mut self, seed: u64) -> Self {
        self.shuffle = true;
        self.seed = seed;
        self
    }

    /// Number of dataset rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// This sampler's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether epochs are shuffled.
    pub fn shuffle(&self) -> bool {
        self.shuffle
    }

    /// The shuffle seed (meaningless when not shuffling).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Indices per rank and epoch: `ceil(n / world)` (PyTorch's `num_samples`).
    pub fn num_samples(&self) -> usize {
        self.n.div_ceil(self.world)
    }

    /// Batches per rank and epoch: `ceil(num_samples / batch_size)`.
    ///
    /// Errors with [`DataError::ZeroBatchSize`] if `batch_size` is 0.
    pub fn num_batches(&self, batch_size: usize) -> Result<usize, DataError> {
        if batch_size == 0 {
            return Err(DataError::ZeroBatchSize);
        }
        Ok(self.num_samples().div_ceil(batch_size))
    }

    /// This rank's row indices for `epoch`, in visiting order (`num_samples()` of them).
    pub fn epoch_indices(&self, epoch: u64) -> Vec<usize> {
        self.epoch_indices_from(epoch, 0)
    }

    /// This rank's share of the rows of `epoch`'s order from row `start` on (an epoch dealt
    /// again after the number of ranks changed): `ceil((n - start) / world)` indices, none
    /// when `start >= n`.
    pub fn epoch_indices_from(&self, epoch: u64, start: usize) -> Vec<usize> {
        if start >= self.n {
            return Vec::new();
        }
        let order = self.epoch_order(epoch);
        let rest = &order[start..];
        let m = rest.len();
        let total_size = m.div_ceil(self.world) * self.world;
        // Padding by wrapping around from the start (PyTorch's `indices += indices[:pad]`,
        // repeated when pad > n) puts rest[i % m] at every position i.
        (self.rank..total_size)
            .step_by(self.world)
            .map(|i| rest[i % m])
            .collect()
    }

    /// This rank's indices for `epoch` cut into consecutive batches of `batch_size`, the last one
    /// smaller when `batch_size` does not divide `num_samples()`.
    ///
    /// Errors with [`DataError::ZeroBatchSize`] if `batch_size` is 0.
    pub fn batches(&self, epoch: u64, batch_size: usize) -> Result<Vec<Vec<usize>>, DataError> {
        self.batches_from(epoch, 0, batch_size)
    }

    /// [`batches`](Self::batches) of [`epoch_indices_from`](Self::epoch_indices_from).
    pub fn batches_from(
        &self,
        epoch: u64,
        start: usize,
        batch_size: usize,
    ) -> Result<Vec<Vec<usize>>, DataError> {
        if batch_size == 0 {
            return Err(DataError::ZeroBatchSize);
        }
        Ok(self
            .epoch_indices_from(epoch, start)
            .chunks(batch_size)
            .map(<[usize]>::to_vec)
            .collect())
    }

    /// Where this sampler's world continues an epoch that `saved_world` ranks, every one at
    /// `position` with batches of `batch_size`, left: the same position when the world size is
    /// the same, else the epoch's rows not yet dealt become the new start (`position.start`
    /// plus the rows the saved ranks' `next_batch` batches covered, at most the epoch's end)
    /// and the new ranks begin at their first batch. No row of the epoch is skipped and none
    /// is visited twice, except PyTorch's wrap-around padding of the last rows.
    ///
    /// Errors with [`DataError::ZeroBatchSize`] if `batch_size` is 0.
    pub fn redeal(
        &self,
        position: DataPosition,
        saved_world: usize,
        batch_size: usize,
    ) -> Result<DataPosition, DataError> {
        if batch_size == 0 {
            return Err(DataError::ZeroBatchSize);
        }
        if saved_world == self.world {
            return Ok(position);
        }
        let start = usize::try_from(position.start)
            .unwrap_or(usize::MAX)
            .min(self.n);
        let rest = self.n - start;
        // Rank r's j-th index is row `start + r + j * saved_world` (before the wrap-around), so
        // `next_batch` batches on every rank cover the first `per_rank * saved_world` rows.
        let per_rank = usize::try_from(position.next_batch)
            .unwrap_or(usize::MAX)
            .saturating_mul(batch_size)
            .min(rest.div_ceil(saved_world.max(1)));
        let dealt = per_rank.saturating_mul(saved_world).min(rest);
        Ok(DataPosition {
            epoch: position.epoch,
            next_batch: 0,
            start: (start + dealt) as u64,
        })
    }

    /// The whole epoch's order before padding and striding: `0..n`, or its permutation.
    fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.n).collect();
        if self.shuffle {
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
            rng.set_stream(epoch);
            order.shuffle(&mut rng);
        }
        order
    }
}
