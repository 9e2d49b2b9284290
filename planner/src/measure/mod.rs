//! The measurements that feed the cost model, as library functions that return typed results
//! and print nothing:
//!
//! - [`throughput`]: the one definition of all-reduce throughput and memcpy bandwidth (and the
//!   one spin loop that stands in for compute).
//! - [`CommBench`]: all-reduce throughput of a backend against this machine's memcpy bandwidth,
//!   optionally between spins (`localsgd bench-comm`): for a one-float buffer the latency of a
//!   small collective between iterations, `localsgd plan --latency-us` and
//!   `--piece-latency-us`.
//! - [`measure_step`]: a bare burn training step, forward, loss, backward and optimizer step
//!   with no pipeline, on any model, loss and batches (`localsgd bench-step`): the compute term
//!   of the cost model (`--compute-ms`), and the pipeline's per-byte handling of a gradient
//!   all-reduce (`--copy-gbps`).
//!
//! Inputs out of range are refused with [`MeasureError::Invalid`], named as the flag of the
//! `localsgd` command that gives them.

mod comm;
mod step;
pub mod throughput;

pub use comm::{CommBench, CommRow};
pub use step::{StepError, StepSettings, StepTiming, measure_step};

use localsgd_comm::CommError;
use std::time::Duration;

/// The longest spin before each all-reduce ([`CommBench`]) or step ([`StepSettings`]): one
/// second.
pub const MAX_GAP: Duration = Duration::from_secs(1);

/// What a measurement refuses or where it failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MeasureError {
    /// A setting out of range, named as the `localsgd` flag that gives it.
    #[error("invalid --{flag} {value}: {valid}")]
    Invalid {
        /// The flag, without its dashes (`gap-us`).
        flag: &'static str,
        /// The value given.
        value: String,
        /// What would be valid.
        valid: String,
    },
    /// A thread worker panicked.
    #[error("worker {rank} panicked: {message}")]
    Panicked {
        /// The worker's rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
}

fn invalid(flag: &'static str, value: impl ToString, valid: impl Into<String>) -> MeasureError {
    MeasureError::Invalid {
        flag,
        value: value.to_string(),
        valid: valid.into(),
    }
}

/// A gap of at most [`MAX_GAP`] (given in microseconds by the commands' `--gap-us`).
fn check_gap(gap: Duration) -> Result<(), MeasureError> {
    if gap > MAX_GAP {
        return Err(invalid(
            "gap-us",
            gap.as_micros(),
            format!("give 0 (none) up to {} microseconds", MAX_GAP.as_micros()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_over_a_second_is_refused_in_microseconds() {
        assert_eq!(check_gap(MAX_GAP), Ok(()));
        assert_eq!(
            check_gap(Duration::from_micros(1_000_001))
                .unwrap_err()
                .to_string(),
            "invalid --gap-us 1000001: give 0 (none) up to 1000000 microseconds"
        );
    }
}
