//! The integration-tests crate's integration tests, one binary (each former `tests/*.rs` is a module), so
//! burn and the crate are linked once instead of once per file.

mod default_run_accuracy;
mod diloco_accuracy;
mod three_entry_points;
