//! All-reduce throughput of a backend against this machine's single-thread memcpy bandwidth,
//! measured in the same run (`localsgd bench-comm`), by the definitions of
//! [`throughput`](super::throughput).

use super::throughput::{allreduce_gbps_between, default_iters, memcpy_gbps};
use super::{MAX_GAP, MeasureError, check_gap, invalid};
use localsgd_comm::{CommError, ProcessGroup, ThreadWorld};
use std::time::Duration;

/// What to measure: buffer lengths, repetitions, and a spin before each all-reduce. The
/// all-reduces of a repetition are [`default_iters`], fewer with a gap, so that a repetition
/// spins for about a second at most (at least 10).
///
/// ```
/// use localsgd_planner::measure::CommBench;
/// use std::time::Duration;
///
/// let bench = CommBench::new(vec![1, 1024], 1, Duration::ZERO)?;
/// let rows = bench.threads(&[2])?;
/// assert_eq!(rows.len(), 2);
/// assert_eq!((rows[1].backend, rows[1].workers, rows[1].floats), ("threads", 2, 1024));
/// assert!(rows[1].allreduce_gbps > 0.0 && rows[1].memcpy_gbps > 0.0);
/// assert!(CommBench::new(vec![], 1, Duration::ZERO).is_err());
/// # Ok::<(), localsgd_planner::measure::MeasureError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommBench {
    floats: Vec<usize>,
    reps: usize,
    gap: Duration,
}

/// One measured backend, world size and buffer length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommRow {
    /// The backend's name (`threads`, `mpi`, `nccl`).
    pub backend: &'static str,
    /// Ranks that all-reduced.
    pub workers: usize,
    /// Buffer length in f32 values.
    pub floats: usize,
    /// All-reduce throughput, GB/s: buffer bytes over the time of one in-place sum, the
    /// slowest rank's, best repetition.
    pub allreduce_gbps: f64,
    /// This machine's single-thread memcpy bandwidth at the same length, GB/s.
    pub memcpy_gbps: f64,
}

impl CommRow {
    /// All-reduce throughput over memcpy bandwidth.
    pub fn ratio(&self) -> f64 {
        self.allreduce_gbps / self.memcpy_gbps
    }

    /// Microseconds per all-reduce (the slowest rank's, best repetition); infinite for a zero
    /// throughput. For a one-float buffer between spins, close to `localsgd plan --latency-us`
    /// with a core per rank; with more ranks than cores [`measure_step`](super::measure_step)'s
    /// cycle measures that instead (it sees the wait for descheduled ranks).
    pub fn allreduce_us(&self) -> f64 {
        if self.allreduce_gbps > 0.0 {
            self.floats as f64 * 4.0 / (self.allreduce_gbps * 1e9) * 1e6
        } else {
            f64::INFINITY
        }
    }
}

impl CommBench {
    /// Measure each of `floats` (positive buffer lengths, at least one), the best of `reps`
    /// (at least 1) repetitions, every all-reduce after `gap` of spinning (at most
    /// [`MAX_GAP`]; zero: back to back).
    pub fn new(floats: Vec<usize>, reps: usize, gap: Duration) -> Result<Self, MeasureError> {
        if floats.is_empty() || floats.contains(&0) {
            return Err(invalid(
                "floats",
                format!("{floats:?}"),
                "give one or more positive buffer lengths",
            ));
        }
        if reps == 0 {
            return Err(invalid("reps", 0, "at least 1 repetition"));
        }
        check_gap(gap)?;
        Ok(Self { floats, reps, gap })
    }

    /// The buffer lengths, in f32 values.
    pub fn floats(&self) -> &[usize] {
        &self.floats
    }

    /// Repetitions per measurement (the best one counts).
    pub fn reps(&self) -> usize {
        self.reps
    }

    /// The spin before each all-reduce.
    pub fn gap(&self) -> Duration {
        self.gap
    }

    /// All-reduces per repetition for a buffer of `floats`.
    pub fn iters(&self, floats: usize) -> u64 {
        let iters = default_iters(floats);
        if self.gap.is_zero() {
            return iters;
        }
        let max_us = MAX_GAP.as_micros() as u64;
        let gap_us = (self.gap.as_micros() as u64).max(1);
        iters.min((max_us / gap_us).max(10))
    }

    /// Collective: the all-reduce throughput of `floats` values in `group`, GB/s (the same on
    /// every rank).
    pub fn allreduce_gbps(
        &self,
        group: &dyn ProcessGroup,
        floats: usize,
    ) -> Result<f64, CommError> {
        allreduce_gbps_between(group, floats, self.iters(floats), self.reps, self.gap)
    }

    /// This machine's single-thread memcpy bandwidth at `floats` values, GB/s.
    pub fn memcpy_gbps(&self, floats: usize) -> f64 {
        memcpy_gbps(floats, default_iters(floats), self.reps)
    }

    /// The thread backend: every buffer length, and for each every worker count of `workers`
    /// (positive, at least one) as a world of threads in this process; rows by buffer length,
    /// then worker count.
    pub fn threads(&self, workers: &[usize]) -> Result<Vec<CommRow>, MeasureError> {
        if workers.is_empty() || workers.contains(&0) {
            return Err(invalid(
                "workers",
                format!("{workers:?}"),
                "give one or more positive worker counts",
            ));
        }
        let mut rows = Vec::new();
        for &floats in &self.floats {
            let memcpy = self.memcpy_gbps(floats);
            for &count in workers {
                let world = ThreadWorld::new(count)?;
                let results = world
                    .run(|g| self.allreduce_gbps(g.as_ref(), floats))
                    .map_err(|p| MeasureError::Panicked {
                        rank: p.rank,
                        message: p.message,
                    })?;
                let gbps = results.into_iter().next().ok_or_else(|| {
                    CommError::InvalidConfig(format!("a world of {count} workers returned none"))
                })??;
                rows.push(CommRow {
                    backend: "threads",
                    workers: count,
                    floats,
                    allreduce_gbps: gbps,
                    memcpy_gbps: memcpy,
                });
            }
        }
        Ok(rows)
    }

    /// Collective over `group` (a one-process-per-rank backend's world, each rank calling it):
    /// rank 0 first measures memcpy at every length while the others wait in the first
    /// all-reduce, then every length is all-reduced. The rows on rank 0, `None` on the others.
    pub fn group(&self, group: &dyn ProcessGroup) -> Result<Option<Vec<CommRow>>, CommError> {
        let rank = group.rank();
        let memcpy: Vec<f64> = if rank == 0 {
            self.floats.iter().map(|&f| self.memcpy_gbps(f)).collect()
        } else {
            Vec::new()
        };
        let mut rows = Vec::new();
        for (i, &floats) in self.floats.iter().enumerate() {
            let gbps = self.allreduce_gbps(group, floats)?;
            if let Some(&memcpy_gbps) = memcpy.get(i) {
                rows.push(CommRow {
                    backend: group.backend(),
                    workers: group.size(),
                    floats,
                    allreduce_gbps: gbps,
                    memcpy_gbps,
                });
            }
        }
        Ok((rank == 0).then_some(rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_out_of_range_name_their_flag() {
        let err = |floats: Vec<usize>, reps, gap_us| {
            CommBench::new(floats, reps, Duration::from_micros(gap_us))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(vec![0], 1, 0),
            "invalid --floats [0]: give one or more positive buffer lengths"
        );
        assert_eq!(
            err(vec![16], 0, 0),
            "invalid --reps 0: at least 1 repetition"
        );
        assert!(err(vec![16], 1, 1_000_001).starts_with("invalid --gap-us 1000001"));
        let bench = CommBench::new(vec![16], 1, Duration::ZERO).unwrap();
        assert_eq!(
            bench.threads(&[2, 0]).unwrap_err().to_string(),
            "invalid --workers [2, 0]: give one or more positive worker counts"
        );
    }

    #[test]
    fn a_gap_cuts_the_all_reduces_to_about_a_second() {
        let bench = |gap_us| CommBench::new(vec![1], 1, Duration::from_micros(gap_us)).unwrap();
        assert_eq!(bench(0).iters(1), 2000);
        assert_eq!(bench(500).iters(1), 2000);
        assert_eq!(bench(2000).iters(1), 500);
        assert_eq!(bench(1_000_000).iters(1), 10);
        assert_eq!(bench(2000).iters(1 << 20), 50);
    }

    #[test]
    fn the_microseconds_are_the_bytes_over_the_rate() {
        let row = CommRow {
            backend: "threads",
            workers: 2,
            floats: 1000,
            allreduce_gbps: 2.0,
            memcpy_gbps: 8.0,
        };
        assert!((row.allreduce_us() - 2.0).abs() < 1e-12);
        assert_eq!(row.ratio(), 0.25);
        let zero = CommRow {
            allreduce_gbps: 0.0,
            ..row
        };
        assert_eq!(zero.allreduce_us(), f64::INFINITY);
    }
}
