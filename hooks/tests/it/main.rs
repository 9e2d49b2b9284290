//! The hooks crate's integration tests, one binary (each former `tests/*.rs` is a module), so
//! burn and the crate are linked once instead of once per file.

mod bucket_layout;
mod compression;
mod ddp_equivalence;
mod hook_state;
mod pipelined_reduction;
mod post_local_v14;
mod unused_params_agree;
