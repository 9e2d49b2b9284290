//! What a rank reports at the end of a run, and the totals over every rank.

use super::error::RunError;
use super::evaluation::Evaluation;
use localsgd_comm::params::FlatBuffer;
use localsgd_comm::{Group, Traffic};
use localsgd_pipeline::pipeline::PhaseTimes;
use std::time::Duration;

/// What one rank reports at the end of a run.
#[derive(Debug, Clone)]
pub struct WorkerResult {
    /// World rank.
    pub rank: usize,
    /// Iterations completed (including resumed ones).
    pub iterations: u64,
    /// Optimizer steps skipped for non-finite gradients.
    pub skipped_steps: u64,
    /// Test accuracy of the world-averaged model, in [0, 1].
    pub test_accuracy: f64,
    /// Test accuracy of this rank's own model.
    pub local_test_accuracy: f64,
    /// Test loss (mean cross-entropy) of the world-averaged model.
    pub test_loss: f64,
    /// Test loss of this rank's own model.
    pub local_test_loss: f64,
    /// Last all-reduced mean loss, if any was logged.
    pub last_global_loss: Option<f64>,
    /// Communication this rank issued during training (excluding evaluation).
    pub traffic: Traffic,
    /// The part of `traffic` that the start broadcast sent (rank 0's parameters and buffers
    /// before a fresh run's first iteration), in this world.
    pub start_traffic: Traffic,
    /// Wall time per phase.
    pub phase_times: PhaseTimes,
    /// Wall time of the training loop.
    pub wall: Duration,
    /// Samples this rank processed: its micro-batches times `batch-size` (an epoch's last
    /// batch may hold fewer rows).
    pub samples: u64,
    /// This rank's final parameters, flattened in traversal order.
    pub params: FlatBuffer,
    /// (iteration, loss) of every iteration, for the loss curve (rank 0 only).
    pub loss_curve: Vec<(f64, f64)>,
}

/// Communication and work summed over every rank of a run, and each rank's own result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunTotals {
    /// Bytes of collective payload issued, all ranks together.
    pub bytes: u64,
    /// The float-data part of `bytes` (gradients, parameters, losses), all ranks together.
    pub data_bytes: u64,
    /// Bytes sent under each collective's bandwidth-optimal algorithm
    /// ([`Traffic::wire_bytes`]), all ranks together.
    pub wire_bytes: u64,
    /// Collectives issued, all ranks together.
    pub collectives: u64,
    /// The part of `bytes` that the start broadcast sent, all ranks together.
    pub start_bytes: u64,
    /// Training samples processed, all ranks together.
    pub samples: u64,
    /// Each rank's own final model on the test set, in rank order (after local steps the
    /// replicas differ; this is what PyTorch's per-rank numbers compare with).
    pub ranks: Vec<Evaluation>,
}

impl RunTotals {
    /// Sum every rank's result over the group (one small all-gather; collective). The one way
    /// totals are computed, on every backend ([`run_rank`]).
    pub fn gather(group: &Group, mine: &WorkerResult) -> Result<Self, RunError> {
        let all = group.all_gather_u64(&[
            mine.traffic.bytes,
            mine.traffic.data_bytes,
            mine.traffic.collectives,
            mine.samples,
            mine.local_test_accuracy.to_bits(),
            mine.local_test_loss.to_bits(),
            mine.start_traffic.bytes,
            mine.traffic.wire_bytes,
        ])?;
        let mut t = Self::default();
        for c in all.chunks(8) {
            t.bytes += c[0];
            t.data_bytes += c[1];
            t.collectives += c[2];
            t.samples += c[3];
            t.ranks.push(Evaluation {
                accuracy: f64::from_bits(c[4]),
                loss: f64::from_bits(c[5]),
            });
            t.start_bytes += c[6];
            t.wire_bytes += c[7];
        }
        Ok(t)
    }
}
