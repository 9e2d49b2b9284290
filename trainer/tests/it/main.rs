//! The trainer crate's integration tests, one binary (each former `tests/*.rs` is a module), so
//! burn and the crate are linked once instead of once per file.

mod algorithm_settings;
mod book_config;
mod book_samples;
mod checkpoint_fuzz;
mod checkpoint_kill;
mod cli;
mod config_fuzz;
mod evaluation;
mod export;
mod fault_soak;
mod libtorch;
mod mpi_train;
mod mpi_ulfm;
mod nccl_train;
mod one_process_per_rank;
mod plot;
mod pytorch_reference;
mod rank_failure;
mod rank_replacement;
mod resume;
mod resume_settings;
mod unused_settings;
