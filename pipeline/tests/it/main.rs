//! The pipeline crate's integration tests, one binary (`pipeline_it`) with a module per topic,
//! so burn and the crates are linked once.

mod checkpoint_resume;
mod checkpoint_retention;
mod compressed_averages;
mod fused;
mod fused_optim;
mod lr_schedule;
mod outer_pipeline;
mod pipeline_phases;
mod pipeline_start;
mod race;
mod recovery;
mod run_epoch;
