//! Run-time loading of the CUDA driver and of NCCL.
//!
//! Nothing CUDA is linked at build time. The CUDA driver (`libcuda.so.1`) is probed here and then
//! used through cudarc; NCCL is loaded here, by its soname `libnccl.so.2` (what the NCCL runtime
//! packages and the `nvidia-nccl-cu12`/`cu13` Python wheels ship), which cudarc's own loader does
//! not look for. Every symbol is resolved when the library is loaded, so a missing library or a
//! too-old NCCL is one [`CommError`], never a panic in the middle of a collective.

use crate::error::CommError;
use cudarc::nccl::sys::{ncclComm_t, ncclUniqueId};
use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// Environment variable naming the NCCL library file to load (full path), tried first.
pub const NCCL_LIB_ENV: &str = "LOCALSGD_NCCL_LIB";

/// The file names tried for NCCL after [`NCCL_LIB_ENV`], through the dynamic loader's search
/// path (`LD_LIBRARY_PATH`, the ld.so cache, ...).
pub const NCCL_LIB_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];

/// The file names tried for the CUDA driver (the same names cudarc tries).
pub const CUDA_LIB_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

pub(crate) type Stream = *mut c_void;

/// The oldest NCCL this backend loads, as `ncclGetVersion` reports it (2.12.0).
pub(crate) const MIN_NCCL_VERSION: c_int = 21200;

/// `ncclResult_t` values this module names (NCCL's `nccl.h`).
pub(crate) const NCCL_SUCCESS: c_int = 0;
pub(crate) const NCCL_IN_PROGRESS: c_int = 7;

/// `ncclDataType_t` values (stable since NCCL 2.0; bf16 since 2.10).
pub(crate) const NCCL_UINT8: c_int = 1;
pub(crate) const NCCL_UINT64: c_int = 5;
pub(crate) const NCCL_FLOAT16: c_int = 6;
pub(crate) const NCCL_FLOAT32: c_int = 7;
pub(crate) const NCCL_FLOAT64: c_int = 8;
pub(crate) const NCCL_BFLOAT16: c_int = 9;

/// `ncclRedOp_t` values.
pub(crate) const NCCL_SUM: c_int = 0;
pub(crate) const NCCL_MAX: c_int = 2;
pub(crate) const NCCL_MIN: c_int = 3;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> c_int;
type CommDestroy = unsafe extern "C" fn(ncclComm_t) -> c_int;
type CommGetAsyncError = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type GetLastError = unsafe extern "C" fn(ncclComm_t) -> *const c_char;
type CommSplit =
    unsafe extern "C" fn(ncclComm_t, c_int, c_int, *mut ncclComm_t, *mut c_void) -> c_int;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    ncclComm_t,
    Stream,
) -> c_int;
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    ncclComm_t,
    Stream,
) -> c_int;
type AllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, ncclComm_t, Stream) -> c_int;

/// The NCCL entry points this backend uses, resolved once per process.
pub(crate) struct Nccl {
    /// Which file was loaded.
    pub path: String,
    /// `ncclGetVersion` (e.g. 22105 for 2.21.5).
    pub version: c_int,
    pub get_unique_id: GetUniqueId,
    pub comm_init_rank: CommInitRank,
    pub comm_destroy: CommDestroy,
    pub comm_abort: CommDestroy,
    pub comm_get_async_error: CommGetAsyncError,
    pub get_error_string: GetErrorString,
    /// NCCL >= 2.13.
    pub get_last_error: Option<GetLastError>,
    /// NCCL >= 2.18; without it subgroups are built from fresh unique ids.
    pub comm_split: Option<CommSplit>,
    pub all_reduce: AllReduce,
    pub broadcast: Broadcast,
    pub all_gather: AllGather,
    _lib: Library,
}

impl Nccl {
    /// Load NCCL from the first of `candidates` that opens.
    pub fn load_from(candidates: &[String]) -> Result<Nccl, String> {
        let mut tried = Vec::new();
        for name in candidates {
            // SAFETY: loading NCCL runs its (trusted) initialisers.
            match unsafe { Library::new(name.as_str()) } {
                Ok(lib) => return Self::resolve(name, lib),
                Err(e) => tried.push(format!("{name} ({})", load_error(&e))),
            }
        }
        Err(format!(
            "the NCCL library (libnccl.so.2) was not found; tried {}. Install NCCL (the \
             libnccl2 package, or `pip install nvidia-nccl-cu12` and add its lib directory, \
             e.g. $(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))')/lib, \
             to LD_LIBRARY_PATH), or set {NCCL_LIB_ENV} to the library file",
            tried.join("; ")
        ))
    }

    fn resolve(path: &str, lib: Library) -> Result<Nccl, String> {
        fn sym<T: Copy>(lib: &Library, path: &str, name: &str) -> Result<T, String> {
            let cname = format!("{name}\0");
            // SAFETY: `T` is the C signature of `name` as declared in nccl.h.
            unsafe { lib.get::<T>(cname.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| {
                    format!(
                        "{path} has no symbol {name} ({e}): NCCL is too old or not NCCL; \
                         install NCCL >= 2.12"
                    )
                })
        }
        fn opt<T: Copy>(lib: &Library, name: &str) -> Option<T> {
            let cname = format!("{name}\0");
            // SAFETY: as above.
            unsafe { lib.get::<T>(cname.as_bytes()) }.ok().map(|s| *s)
        }
        let get_version: GetVersion = sym(&lib, path, "ncclGetVersion")?;
        let mut version: c_int = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { get_version(&mut version) };
        if rc != NCCL_SUCCESS {
            return Err(format!("ncclGetVersion in {path} failed with code {rc}"));
        }
        if version < MIN_NCCL_VERSION {
            return Err(format!(
                "{path} is NCCL {}; this backend supports NCCL {} or newer: install a newer \
                 libnccl2 or nvidia-nccl-cu12 wheel, or point {NCCL_LIB_ENV} at one",
                version_string(version),
                version_string(MIN_NCCL_VERSION)
            ));
        }
        Ok(Nccl {
            path: path.to_string(),
            version,
            get_unique_id: sym(&lib, path, "ncclGetUniqueId")?,
            comm_init_rank: sym(&lib, path, "ncclCommInitRank")?,
            comm_destroy: sym(&lib, path, "ncclCommDestroy")?,
            comm_abort: sym(&lib, path, "ncclCommAbort")?,
            comm_get_async_error: sym(&lib, path, "ncclCommGetAsyncError")?,
            get_error_string: sym(&lib, path, "ncclGetErrorString")?,
            get_last_error: opt(&lib, "ncclGetLastError"),
            comm_split: opt(&lib, "ncclCommSplit"),
            all_reduce: sym(&lib, path, "ncclAllReduce")?,
            broadcast: sym(&lib, path, "ncclBroadcast")?,
            all_gather: sym(&lib, path, "ncclAllGather")?,
            _lib: lib,
        })
    }

    /// NCCL's version as "major.minor.patch".
    pub fn version_string(&self) -> String {
        version_string(self.version)
    }

    /// NCCL's description of `rc`, plus the last error message of `comm` when NCCL has one.
    pub fn describe(&self, rc: c_int, comm: Option<ncclComm_t>) -> String {
        // SAFETY: ncclGetErrorString returns a static string for every code.
        let mut text = unsafe { cstr((self.get_error_string)(rc)) };
        if let (Some(last), Some(comm)) = (self.get_last_error, comm) {
            // SAFETY: `comm` is a live communicator (or null, which NCCL accepts).
            let detail = unsafe { cstr(last(comm)) };
            if !detail.is_empty() {
                text = format!("{text}: {detail}");
            }
        }
        format!("{text} (ncclResult_t {rc})")
    }
}

// SAFETY: the struct holds a library handle and plain function pointers into it, which NCCL
// allows to be called from any thread.
unsafe impl Send for Nccl {}
// SAFETY: as above.
unsafe impl Sync for Nccl {}

/// NCCL's `NCCL_VERSION_CODE` as "major.minor.patch".
pub(crate) fn version_string(code: c_int) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100)
    }
}

/// # Safety
/// `p` is null or a NUL-terminated string that outlives the call.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// libloading's error with the loader's own reason (`dlerror`), which it keeps as the source.
fn load_error(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(reason) => format!("{e}: {reason}"),
        None => e.to_string(),
    }
}

fn default_candidates() -> Vec<String> {
    let mut names: Vec<String> = std::env::var(NCCL_LIB_ENV)
        .ok()
        .filter(|p| !p.is_empty())
        .into_iter()
        .collect();
    names.extend(NCCL_LIB_NAMES.iter().map(|s| s.to_string()));
    names
}

/// The process-wide NCCL, loaded on first use (a failure is remembered: fix the setup and
/// restart the process).
pub(crate) fn nccl() -> Result<&'static Nccl, CommError> {
    static NCCL: OnceLock<Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(|| Nccl::load_from(&default_candidates()))
        .as_ref()
        .map_err(|message| CommError::Backend {
            backend: "nccl",
            message: message.clone(),
        })
}

/// Check that the CUDA driver library can be opened (before cudarc, which panics without it).
pub(crate) fn probe_cuda_driver() -> Result<(), CommError> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let mut tried = Vec::new();
            for name in CUDA_LIB_NAMES {
                // SAFETY: opening the CUDA driver runs its (trusted) initialisers; the handle is
                // dropped at once (cudarc opens it again, the loader keeps it resident).
                match unsafe { Library::new(*name) } {
                    Ok(_) => return Ok(()),
                    Err(e) => tried.push(format!("{name} ({})", load_error(&e))),
                }
            }
            Err(format!(
                "the CUDA driver library was not found (tried {}): this machine has no NVIDIA \
                 driver installed, so no GPU can be used. Install the NVIDIA driver, or use the \
                 thread or MPI backend",
                tried.join("; ")
            ))
        })
        .clone()
        .map_err(|message| CommError::Backend {
            backend: "nccl",
            message,
        })
}

/// Run `f`, turning a panic (cudarc panics when a library or symbol is missing) into an error
/// that names `what`.
pub(crate) fn no_panic<R>(
    what: impl std::fmt::Display,
    f: impl FnOnce() -> Result<R, CommError>,
) -> Result<R, CommError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            Err(CommError::Backend {
                backend: "nccl",
                message: format!(
                    "{what}: the CUDA bindings failed ({detail}); check the NVIDIA driver \
                     installation (nvidia-smi) and LD_LIBRARY_PATH"
                ),
            })
        }
    }
}

/// A CUDA driver error as text ("CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected").
pub(crate) fn cuda_error(e: &cudarc::driver::DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}: {text}")
}

/// Test support: load NCCL from exactly these candidates (does not touch the process-wide
/// library) and return its version, or the error a missing library gives.
pub fn try_load_nccl(candidates: &[&str]) -> Result<String, CommError> {
    let names: Vec<String> = candidates.iter().map(|s| s.to_string()).collect();
    Nccl::load_from(&names)
        .map(|n| n.version_string())
        .map_err(|message| CommError::Backend {
            backend: "nccl",
            message,
        })
}
