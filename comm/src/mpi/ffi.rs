//! Thin, checked wrappers over the raw MPI calls the MPI group needs (rsmpi's safe layer has no
//! in-place all-reduce, so the collectives go through `mpi::ffi` directly).

use crate::error::CommError;
use mpi::ffi;
use std::ffi::{c_char, c_int, c_void};

/// The largest element count one MPI call takes (`int` counts); longer buffers are cut into
/// pieces of at most this many elements.
pub(crate) const MAX_COUNT: usize = i32::MAX as usize;

/// A communicator handle that may be shared between threads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Comm(pub ffi::MPI_Comm);

// SAFETY: an MPI communicator handle is an opaque process-wide reference. MPI is initialised with
// MPI_THREAD_MULTIPLE, or, when the library provides less, every call on it is serialised by the
// runtime's lock (see `Runtime::serialize`).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// A reduction operation handle (predefined or user-defined), shareable between threads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op(pub ffi::MPI_Op);

// SAFETY: operation handles are immutable process-wide objects once created.
unsafe impl Send for Op {}
// SAFETY: as above.
unsafe impl Sync for Op {}

/// Turn an MPI return code into a [`CommError::Backend`] naming what failed; with ULFM on
/// ([`super::ulfm::active`]), a failed or revoked peer into [`CommError::Revoked`] (the group
/// names the ranks: `MpiGroup::peer_failure`).
pub(crate) fn check(rc: c_int, what: impl FnOnce() -> String) -> Result<(), CommError> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else if super::ulfm::active() && super::ulfm::is_failure(rc) {
        Err(CommError::Revoked {
            call: what(),
            group: Vec::new(),
        })
    } else {
        Err(CommError::Backend {
            backend: "mpi",
            message: format!("{} failed: {}", what(), error_string(rc)),
        })
    }
}

/// MPI's description of an error code.
pub(crate) fn error_string(rc: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters, as MPI_Error_string requires.
    let ok = unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr() as *mut c_char, &mut len) };
    if ok != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error code {rc}");
    }
    buf.truncate(len.max(0) as usize);
    format!("{} (MPI error code {rc})", String::from_utf8_lossy(&buf))
}

/// `MPI_IN_PLACE` is a macro whose value differs between implementations and that rsmpi does not
/// export. Known values: Open MPI `(void *) 1`; MPICH and its derivatives (Intel MPI, MVAPICH,
/// Cray MPICH) and MS-MPI `(void *) -1`. `None` for an unknown library: callers then fall back to
/// a separate send buffer (one copy).
pub(crate) fn in_place_sentinel(library_version: &str) -> Option<usize> {
    let v = library_version.to_ascii_lowercase();
    if v.contains("open mpi") {
        Some(1)
    } else if ["mpich", "intel(r) mpi", "mvapich", "microsoft mpi"]
        .iter()
        .any(|name| v.contains(name))
    {
        Some(usize::MAX)
    } else {
        None
    }
}

/// The world communicator.
pub(crate) fn comm_world() -> Comm {
    // SAFETY: reading an rsmpi-exported constant.
    Comm(unsafe { ffi::RSMPI_COMM_WORLD })
}

/// Make every call on `comm` return error codes instead of aborting the job, so failures become
/// [`CommError`]s.
pub(crate) fn errors_return(comm: Comm) -> Result<(), CommError> {
    // SAFETY: `comm` is a valid communicator; the handler is predefined.
    let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm.0, ffi::RSMPI_ERRORS_RETURN) };
    check(rc, || "MPI_Comm_set_errhandler".into())
}

/// Rank of this process in `comm`.
pub(crate) fn comm_rank(comm: Comm) -> Result<usize, CommError> {
    let mut rank: c_int = 0;
    // SAFETY: valid communicator, valid out-pointer.
    check(unsafe { ffi::MPI_Comm_rank(comm.0, &mut rank) }, || {
        "MPI_Comm_rank".into()
    })?;
    Ok(rank as usize)
}

/// Number of processes in `comm`.
pub(crate) fn comm_size(comm: Comm) -> Result<usize, CommError> {
    let mut size: c_int = 0;
    // SAFETY: valid communicator, valid out-pointer.
    check(unsafe { ffi::MPI_Comm_size(comm.0, &mut size) }, || {
        "MPI_Comm_size".into()
    })?;
    Ok(size as usize)
}

/// `MPI_Allgather` of `local.len()` u64 per rank into a vector of `local.len() * size` words.
pub(crate) fn all_gather_u64(
    comm: Comm,
    local: &[u64],
    size: usize,
) -> Result<Vec<u64>, CommError> {
    let n = local.len();
    let count = c_int::try_from(n).map_err(|_| {
        CommError::InvalidConfig(format!(
            "all_gather_u64 takes at most {MAX_COUNT} words per rank (got {n})"
        ))
    })?;
    let mut out = vec![0u64; n * size];
    // SAFETY: `local` holds `n` words and `out` holds `n` words per rank of `comm`.
    let rc = unsafe {
        ffi::MPI_Allgather(
            local.as_ptr() as *const c_void,
            count,
            ffi::RSMPI_UINT64_T,
            out.as_mut_ptr() as *mut c_void,
            count,
            ffi::RSMPI_UINT64_T,
            comm.0,
        )
    };
    check(rc, || "MPI_Allgather".into())?;
    Ok(out)
}

/// A committed datatype of `count` bytes whose extent is `stride` bytes: as an all-gather's
/// receive type (count 1), it puts rank r's piece at `r * stride` from the receive address, so
/// that piece k of every rank's message lands in its place in the gathered buffer. As an
/// all-to-all's send and receive type (count 1), it takes piece k of every block of the send
/// buffer and puts each rank's in its block of the receive buffer. Freed when dropped.
pub(crate) struct StridedBytes(pub ffi::MPI_Datatype);

impl StridedBytes {
    pub(crate) fn new(count: c_int, stride: usize) -> Result<Self, CommError> {
        // A slice's length fits isize (MPI_Aint), so `stride` converts exactly.
        let extent = stride as ffi::MPI_Aint;
        // SAFETY: zeroed handles are overwritten by MPI on success.
        let mut piece: ffi::MPI_Datatype = unsafe { std::mem::zeroed() };
        // SAFETY: predefined element type, valid out-pointer.
        let rc = unsafe { ffi::MPI_Type_contiguous(count, ffi::RSMPI_UINT8_T, &mut piece) };
        check(rc, || format!("MPI_Type_contiguous of {count} bytes"))?;
        // SAFETY: as above.
        let mut strided: ffi::MPI_Datatype = unsafe { std::mem::zeroed() };
        // SAFETY: `piece` is a valid datatype; lower bound 0, extent `stride`.
        let rc = unsafe { ffi::MPI_Type_create_resized(piece, 0, extent, &mut strided) };
        // SAFETY: `piece` was created above; a datatype built from it is not affected.
        unsafe { ffi::MPI_Type_free(&mut piece) };
        check(rc, || format!("MPI_Type_create_resized to {stride} bytes"))?;
        let mut ty = Self(strided);
        // SAFETY: a valid, uncommitted datatype.
        let rc = unsafe { ffi::MPI_Type_commit(&mut ty.0) };
        check(rc, || "MPI_Type_commit".into())?;
        Ok(ty)
    }
}

impl Drop for StridedBytes {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once; MPI keeps it alive for pending operations.
        unsafe { ffi::MPI_Type_free(&mut self.0) };
    }
}

/// Tag of [`connect_all`]'s messages (completed before `MpiWorld::init` returns, so they meet
/// no other message).
const CONNECT_TAG: c_int = 0x4c53;

/// Make this rank's connections to the other ranks of `comm` now: in round `i`
/// (1 ≤ i < size), `per_peer` empty messages to rank `rank + i` and as many from rank
/// `rank - i` (modulo `size`), so every pair exchanges `per_peer` messages each way and MPI
/// opens whatever connection it uses between them.
pub(crate) fn connect_all(
    comm: Comm,
    rank: usize,
    size: usize,
    per_peer: usize,
) -> Result<(), CommError> {
    let to_int = |v: usize| {
        c_int::try_from(v)
            .map_err(|_| CommError::InvalidConfig(format!("rank {v} does not fit MPI's int ranks")))
    };
    for i in 1..size {
        let next = to_int((rank + i) % size)?;
        let prev = to_int((rank + size - i) % size)?;
        // SAFETY: a zeroed request handle is overwritten by MPI_Irecv/MPI_Isend.
        let mut requests: Vec<ffi::MPI_Request> = (0..2 * per_peer)
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        let mut empty = [0u8; 1];
        for pair in requests.chunks_exact_mut(2) {
            // SAFETY: zero-element messages, so MPI never reads or writes `empty` (requests an
            // error leaves behind touch no memory); it outlives the requests waited below.
            let rc = unsafe {
                ffi::MPI_Irecv(
                    empty.as_mut_ptr() as *mut c_void,
                    0,
                    ffi::RSMPI_UINT8_T,
                    prev,
                    CONNECT_TAG,
                    comm.0,
                    &mut pair[0],
                )
            };
            check(rc, || {
                format!("MPI_Irecv from rank {prev} (connection set-up)")
            })?;
            // SAFETY: as above.
            let rc = unsafe {
                ffi::MPI_Isend(
                    empty.as_ptr() as *const c_void,
                    0,
                    ffi::RSMPI_UINT8_T,
                    next,
                    CONNECT_TAG,
                    comm.0,
                    &mut pair[1],
                )
            };
            check(rc, || {
                format!("MPI_Isend to rank {next} (connection set-up)")
            })?;
        }
        // SAFETY: `requests` holds `2 * per_peer` active requests; statuses ignored.
        let rc = unsafe {
            ffi::MPI_Waitall(
                requests.len() as c_int,
                requests.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        check(rc, || {
            format!("MPI_Waitall with ranks {prev} and {next} (connection set-up)")
        })?;
    }
    Ok(())
}

/// The host name MPI reports for this process (`MPI_Get_processor_name`).
pub(crate) fn processor_name() -> Result<String, CommError> {
    // SAFETY: reading an rsmpi-exported constant.
    let max = unsafe { ffi::RSMPI_MAX_PROCESSOR_NAME }.max(1) as usize;
    let mut buf = vec![0u8; max + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_PROCESSOR_NAME characters.
    let rc = unsafe { ffi::MPI_Get_processor_name(buf.as_mut_ptr() as *mut c_char, &mut len) };
    check(rc, || "MPI_Get_processor_name".into())?;
    buf.truncate(len.max(0) as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Free a communicator this process created (warns on failure: nothing else can be done).
pub(crate) fn free_comm(comm: Comm) {
    let mut raw = comm.0;
    // SAFETY: the caller created `comm` and frees it exactly once.
    let rc = unsafe { ffi::MPI_Comm_free(&mut raw) };
    if rc != ffi::MPI_SUCCESS as c_int {
        tracing::warn!("MPI_Comm_free failed: {}", error_string(rc));
    }
}

/// Abort every process of the job with `code`. Does not return.
pub(crate) fn abort_world(code: c_int) -> ! {
    // SAFETY: MPI_Abort may be called from any thread once MPI is initialised.
    unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code) };
    // MPI_Abort should not return; make sure the process ends anyway.
    std::process::exit(code)
}
