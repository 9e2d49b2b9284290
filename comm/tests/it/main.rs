//! The comm crate's integration tests, one binary (each former `tests/*.rs` is a module), so
//! burn and the crate are linked once instead of once per file.

mod codec;
mod collectives;
mod failures;
mod gather_bytes;
mod grow;
mod mpi;
mod nccl;
mod nccl_stand_in;
mod nonblocking;
mod params_roundtrip;
mod shrink;
mod signature_fuzz;
mod subgroups;
