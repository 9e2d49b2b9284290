//! The trainer crate's integration tests, one binary (each former `tests/*.rs` is a module), so
//! burn and the crate are linked once instead of once per file.

mod book_config;
mod book_samples;
mod checkpoint_fuzz;
mod checkpoint_kill;
mod cli;
mod compressed_averages;
mod config_fuzz;
mod data_dataset;
mod data_digits;
mod data_idx;
mod data_sampler;
mod data_synthetic;
mod data_text;
mod evaluation;
mod export;
mod fault_soak;
mod init_weights;
mod lr_schedule;
mod model_gpt;
mod model_mlp;
mod mpi_train;
mod mpi_ulfm;
mod nccl_train;
mod one_process_per_rank;
mod outer_pipeline;
mod pipeline_phases;
mod pipeline_start;
mod plot;
mod pytorch_reference;
mod race;
mod rank_failure;
mod rank_replacement;
mod resume;
mod resume_settings;
mod unused_settings;
