//! The learner crate's integration tests, one binary (each former `tests/*.rs` is a module), so
//! burn and the crate are linked once instead of once per file.

mod common;
mod config_errors;
mod console;
// `mpirun -np 2` of the `mpi_digits` example against thread ranks.
#[cfg(feature = "mpi")]
mod mpi;
// `on_rank_failure = Replace` of the `mpi_digits` example under Open MPI 5 with ULFM.
#[cfg(feature = "mpi")]
mod mpi_ulfm;
mod one_process_per_rank;
mod rank_failure;
mod resume_and_stop;
mod strategy_vs_pipeline;
