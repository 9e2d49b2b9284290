//! # localsgd-comm
//!
//! Process groups for data-parallel training: in-place all-reduce (sum, mean, max, min),
//! broadcast, barrier, a small `u64` all-gather, a bulk all-gather of byte messages (compressed
//! payloads), and subgroups (contiguous blocks, arbitrary colors, the
//! intra-node group). The embedded backend runs W workers as threads of one process
//! ([`ThreadWorld`]); MPI and NCCL backends implement the same [`ProcessGroup`] trait. On the
//! thread backend, and under MPI with ULFM (Open MPI 5), the survivors of a failed rank can
//! [`shrink`](ProcessGroup::shrink) the group and go on without it (see the [`thread`] module).
//!
//! The [`params`] module is the one place that turns a burn module's parameters (or gradients)
//! into a flat buffer in traversal order and back; the hooks and averagers crates build on it.
//!
//! ```
//! use localsgd_comm::{GroupExt, ProcessGroup, ReduceOp, ThreadWorld};
//!
//! // Four workers; each averages [rank, rank] over the world, then over pairs of ranks.
//! let out = ThreadWorld::new(4)?.run(|world| -> Result<(f32, f32), localsgd_comm::CommError> {
//!     let mut v = vec![world.rank() as f32; 2];
//!     world.average_slice(&mut v)?;            // (0 + 1 + 2 + 3) / 4
//!     let pair = world.new_subgroups(2)?;      // {0,1} and {2,3}
//!     let mut w = vec![world.rank() as f32; 2];
//!     pair.average_slice(&mut w)?;
//!     Ok((v[0], w[0]))
//! })?;
//! assert_eq!(out[0], Ok((1.5, 0.5)));
//! assert_eq!(out[3], Ok((1.5, 2.5)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod buffer;
pub mod codec;
pub mod error;
pub mod group;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod nonblocking;
pub mod params;
pub mod precision;
pub mod signature;
pub mod thread;
pub mod traffic;
// Always compiled (it has no MPI or NCCL code), so its tests run without the features.
#[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
mod watchdog;

#[cfg(feature = "mpi")]
pub use self::mpi::{MpiConfig, MpiGroup, MpiWorld};
#[cfg(feature = "nccl")]
pub use self::nccl::{NcclConfig, NcclGroup, NcclWorld};
pub use buffer::{BufferMut, Element, ElementType};
pub use codec::{Codec, CodecError, CodecSpec, ErrorFeedback};
pub use error::CommError;
pub use group::{
    Group, GroupExt, ProcessGroup, validate_all_to_all, validate_gather_output,
    validate_subgroup_size,
};
pub use nonblocking::{AsyncGroup, Pending};
pub use precision::{Precision, average_compressed, round_to};
pub use signature::{CallSignature, CollectiveKind, ReduceOp};
pub use thread::{ThreadGroup, ThreadWorld, WorkerPanicked};
pub use traffic::Traffic;

/// Largest piece of one all-reduce of the MPI backend, bytes: it runs every all-reduce as
/// pieces of at most this size, one after the other (`mpi` module, feature `mpi`). Public for
/// cost models (`localsgd plan` charges each further piece one small collective).
pub const MPI_PIECE_BYTES: usize = 256 * 1024;

/// The book's chapter on this crate as a doctest: its examples compile and run against burn and
/// this crate alone.
#[cfg(doctest)]
#[doc = include_str!("../../book/src/comm.md")]
pub struct BookComm;
