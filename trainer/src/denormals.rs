//! Flushing subnormal floats to zero on the compute threads (setting `flush-denormals`, like
//! PyTorch's `torch.set_flush_denormal(True)`).
//!
//! Why: as training goes on, more and more gradient and weight-update values become subnormal
//! (smaller than `f32::MIN_POSITIVE`, about 1.2e-38), and x86 CPUs compute with subnormals many
//! times slower than with normal numbers: on the benchmarks' Fashion-MNIST MLP, burn's own step
//! (`localsgd bench-step`) takes about twice as long over thousands of iterations as over the
//! first hundreds, and flushing keeps it at the early speed (book: Performance, "A finding:
//! burn's step slows down in long runs").
//!
//! What it changes: every arithmetic result that would be subnormal becomes 0 (flush to zero)
//! and every subnormal input is read as 0 (denormals are zero). Results then differ from an
//! IEEE run in the last bits wherever subnormals occurred, which is why it is off by default: the
//! default run matches PyTorch's default (which does not flush either) bit for bit.
//!
//! It is a per-thread CPU control bit (x86_64: MXCSR FTZ and DAZ; aarch64: FPCR FZ), so it must
//! be set on every thread that computes: [`flush_on_compute_threads`] sets it on the calling
//! thread and on every thread of rayon's global pool (burn's CPU kernels run on one or the
//! other).

/// Flushing subnormals is not available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "flush-denormals is not supported on this CPU architecture ({arch}); supported: x86_64, aarch64"
)]
pub struct UnsupportedArch {
    /// `std::env::consts::ARCH` of this build.
    pub arch: &'static str,
}

/// Whether this build can flush subnormals (x86_64 and aarch64 can).
pub fn supported() -> Result<(), UnsupportedArch> {
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        Ok(())
    } else {
        Err(UnsupportedArch {
            arch: std::env::consts::ARCH,
        })
    }
}

/// Set flush-to-zero and denormals-are-zero on the calling thread.
pub fn flush_on_this_thread() -> Result<(), UnsupportedArch> {
    imp::flush()
}

/// [`flush_on_this_thread`] on the calling thread and on every thread of rayon's global pool
/// (building the pool with its defaults if nobody built it yet).
pub fn flush_on_compute_threads() -> Result<(), UnsupportedArch> {
    flush_on_this_thread()?;
    rayon::broadcast(|_| flush_on_this_thread())
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::UnsupportedArch;

    /// MXCSR bit 15: flush to zero (subnormal results become 0).
    const FTZ: u32 = 1 << 15;
    /// MXCSR bit 6: denormals are zero (subnormal inputs are read as 0).
    const DAZ: u32 = 1 << 6;

    pub(super) fn flush() -> Result<(), UnsupportedArch> {
        let mut csr: u32 = 0;
        // SAFETY: `stmxcsr` stores this thread's SSE control/status register into `csr` and
        // `ldmxcsr` loads it back with two mode bits set; both touch only that 4-byte local and
        // the register (every x86_64 CPU has SSE). FTZ/DAZ change how subnormals are rounded,
        // never memory safety.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr as *mut u32, options(nostack, preserves_flags));
            csr |= FTZ | DAZ;
            std::arch::asm!("ldmxcsr [{}]", in(reg) &csr as *const u32, options(nostack, readonly, preserves_flags));
        }
        Ok(())
    }
}

#[cfg(target_arch = "aarch64")]
mod imp {
    use super::UnsupportedArch;

    /// FPCR bit 24: flush subnormal inputs and results to zero.
    const FZ: u64 = 1 << 24;

    pub(super) fn flush() -> Result<(), UnsupportedArch> {
        // SAFETY: reads and writes this thread's floating-point control register; FZ changes
        // only how subnormals are treated.
        unsafe {
            let mut fpcr: u64;
            std::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack, preserves_flags));
            fpcr |= FZ;
            std::arch::asm!("msr fpcr, {}", in(reg) fpcr, options(nomem, nostack, preserves_flags));
        }
        Ok(())
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod imp {
    use super::UnsupportedArch;

    pub(super) fn flush() -> Result<(), UnsupportedArch> {
        Err(UnsupportedArch {
            arch: std::env::consts::ARCH,
        })
    }
}

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::*;
    use std::hint::black_box;

    /// Half the smallest normal f32: a subnormal under IEEE 754 (2^-127), zero when flushed.
    fn half_min_positive() -> f32 {
        black_box(f32::MIN_POSITIVE) / black_box(2.0f32)
    }

    #[test]
    fn a_subnormal_result_becomes_zero_on_the_flushed_thread_only() {
        // Fresh threads: the control bit is per thread, and the test harness's threads must
        // keep IEEE behaviour for the other tests.
        let before = std::thread::spawn(half_min_positive).join().unwrap();
        assert_eq!(before, 2f32.powi(-127));
        assert!(before.is_subnormal());
        let after = std::thread::spawn(|| {
            flush_on_this_thread().unwrap();
            half_min_positive()
        })
        .join()
        .unwrap();
        assert_eq!(after, 0.0);
        let other = std::thread::spawn(half_min_positive).join().unwrap();
        assert!(other.is_subnormal(), "another thread is not affected");
    }

    #[test]
    fn compute_threads_include_the_rayon_pool() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            // Inside `install`, `rayon::broadcast` reaches this pool's threads.
            flush_on_compute_threads().unwrap();
            let seen = rayon::broadcast(|_| half_min_positive());
            assert_eq!(seen, vec![0.0, 0.0]);
        });
    }
}
