//! glibc's allocator settings for training loops: keep the big buffers a step frees.
//!
//! A training step allocates and frees the same large tensors (activations, gradients, optimizer
//! temporaries) every iteration. glibc's `malloc` serves a block above its mmap threshold with
//! `mmap` and hands it back with `munmap` when freed, and returns free memory at the top of the
//! heap to the system above its trim threshold; its threshold also grows only after such a block
//! is freed. Either way the next step maps the memory again and page-faults every page of it in,
//! zero-filled by the kernel. [`keep_freed_buffers`] raises both thresholds once, so that freed
//! blocks stay in the process and the next step reuses them.
//!
//! The `localsgd` binary calls it at start (unless `LOCALSGD_MALLOC_DEFAULTS=1`); a program
//! using the crates calls it at the start of its `main`. It changes process-wide settings and
//! does nothing on other C libraries (musl, macOS, Windows), where it returns `false`.
//!
//! ```
//! // Once, before the training threads start.
//! let applied = localsgd_pipeline::malloc::keep_freed_buffers();
//! assert_eq!(applied, cfg!(all(target_os = "linux", target_env = "gnu")));
//! ```

/// The largest mmap threshold glibc accepts on 64-bit targets (`DEFAULT_MMAP_THRESHOLD_MAX`:
/// 4 MiB × `sizeof(long)`): blocks up to this size come from the heap and are reused.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Free memory glibc may keep at the top of a heap before returning it to the system.
pub const TRIM_THRESHOLD: usize = 1 << 30;

/// Sets glibc's mmap threshold to [`MMAP_THRESHOLD`] and its trim threshold to
/// [`TRIM_THRESHOLD`] (`mallopt(M_MMAP_THRESHOLD)`, `mallopt(M_TRIM_THRESHOLD)`). Returns whether
/// both settings were applied: `false` on a C library other than glibc.
pub fn keep_freed_buffers() -> bool {
    imp::keep_freed_buffers()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use super::{MMAP_THRESHOLD, TRIM_THRESHOLD};

    pub(super) fn keep_freed_buffers() -> bool {
        // SAFETY: `mallopt` only changes the allocator's parameters; glibc takes its arena lock
        // for it, so it is safe to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) == 1
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub(super) fn keep_freed_buffers() -> bool {
        false
    }
}
