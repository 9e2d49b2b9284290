//! What a finished strategy run reports: per-rank counters and traffic.

use localsgd_comm::{Group, Traffic};

use crate::error::StrategyError;

/// One rank's counters at the end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankReport {
    /// The rank.
    pub rank: usize,
    /// Optimizer steps (iterations) taken, resumed ones included.
    pub iterations: u64,
    /// Optimizer steps skipped for non-finite gradients.
    pub skipped_steps: u64,
    /// What this rank sent during training (all groups; this run's part of a resumed run).
    pub traffic: Traffic,
}

impl RankReport {
    /// Every rank's report, in rank order (one small all-gather; collective).
    pub(crate) fn gather(group: &Group, mine: &RankReport) -> Result<Vec<Self>, StrategyError> {
        let all = group.all_gather_u64(&[
            mine.iterations,
            mine.skipped_steps,
            mine.traffic.collectives,
            mine.traffic.bytes,
            mine.traffic.data_bytes,
            mine.traffic.wire_bytes,
        ])?;
        Ok(all
            .chunks_exact(6)
            .enumerate()
            .map(|(rank, c)| RankReport {
                rank,
                iterations: c[0],
                skipped_steps: c[1],
                traffic: Traffic {
                    collectives: c[2],
                    bytes: c[3],
                    data_bytes: c[4],
                    wire_bytes: c[5],
                },
            })
            .collect())
    }
}

/// What the last [`fit`](burn_train::SupervisedLearningStrategy::fit) of a
/// [`LocalSgdStrategy`](crate::LocalSgdStrategy) did, read with
/// [`LocalSgdStrategy::report`](crate::LocalSgdStrategy::report) after
/// `SupervisedTraining::launch` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrategyReport {
    /// Every rank's counters, in rank order.
    pub ranks: Vec<RankReport>,
}

impl StrategyReport {
    /// Bytes, collectives, float-data bytes and wire bytes sent, all ranks together.
    pub fn traffic(&self) -> Traffic {
        self.ranks.iter().map(|r| r.traffic).sum()
    }
}
