//! The averagers crate's integration tests, one binary (each former `tests/*.rs` is a module), so
//! burn and the crate are linked once instead of once per file.

mod average_in_group;
mod common;
mod hierarchical_schedule;
mod lossy_compression;
mod optimizer_wrapper;
mod outer_vectors;
mod overlapped_averaging;
mod parameter_agreement;
mod periodic_schedule;
mod saved_state;
mod slowmo_frequencies;
mod streaming_vectors;
