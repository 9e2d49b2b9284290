//! The PASS/FAIL report of the diagnostic binaries `mpi_check` and `nccl_smoke` (included by
//! each with `#[path]`; not part of the library).

use localsgd_comm::CommError;

/// Collects the checks of one rank: rank 0 prints every pass, every rank prints its failures.
pub(crate) struct Checker {
    /// This rank.
    pub rank: usize,
    /// Failed checks so far.
    pub failures: usize,
    /// Passed checks so far.
    pub passes: usize,
}

impl Checker {
    /// A rank's empty report.
    pub fn new(rank: usize) -> Self {
        Self {
            rank,
            failures: 0,
            passes: 0,
        }
    }

    /// Record one check; `detail` explains a failure.
    pub fn check(&mut self, name: &str, ok: bool, detail: impl FnOnce() -> String) {
        if ok {
            self.passes += 1;
            if self.rank == 0 {
                println!("PASS {name}");
            }
        } else {
            self.failures += 1;
            println!("FAIL rank {}: {name}: {}", self.rank, detail());
        }
    }

    /// The value of `r`, or a failed check named `name` and `None`.
    pub fn ok<T>(&mut self, name: &str, r: Result<T, CommError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.check(name, false, || format!("unexpected error: {e}"));
                None
            }
        }
    }
}
