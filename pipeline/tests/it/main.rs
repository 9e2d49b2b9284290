//! The pipeline crate's integration tests, one binary (`pipeline_it`) with a module per topic,
//! so burn and the crates are linked once.

mod checkpoint_resume;
mod checkpoint_retention;
mod fused;
mod fused_optim;
mod run_epoch;
