//! The planner's integration tests, one binary (a module per file).

mod measure_comm;
mod measure_step;
mod throughput;
