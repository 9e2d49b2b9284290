//! Open MPI's choice of algorithm for the non-blocking all-reduce, set through the MPI tool
//! interface (`MPI_T`) at start-up.
//!
//! A [dedicated](crate::ProcessGroup::dedicated) communicator all-reduces in place with
//! `MPI_Iallreduce`. Open MPI 4.1 (component `coll/libnbc`) schedules every in-place call as a
//! binomial reduce to rank 0 followed by a binomial broadcast: the stages run one after the other
//! and, with 2 ranks on each of 2 hosts, cross the host links 3 times per call (1.5 `n` per link,
//! 2 `n` one way), where a blocking `MPI_Allreduce` crosses them once each way (1.0 `n`).
//! Rabenseifner's algorithm (reduce-scatter by recursive halving, then all-gather) carries 1.0
//! `n` per link, and on the benchmarks' wide MLP over shaped links it is the faster of the two
//! (`bench/results/2026-12-04-wide-4-ranks/`).
//!
//! So, unless the user chose an algorithm (`--mca coll_libnbc_iallreduce_algorithm N` or
//! `OMPI_MCA_coll_libnbc_iallreduce_algorithm=N`, any value but 0), start-up sets
//! `coll_libnbc_iallreduce_algorithm` to 3 (Rabenseifner) on every rank. It applies to every
//! `MPI_Iallreduce` of the process, the user's own included. Libnbc itself falls back to a ring
//! where Rabenseifner does not apply (fewer elements than the largest power of two ≤ ranks).
//! Other MPI libraries have no such variable and are left as they are.

use mpi::ffi;
use std::ffi::{CStr, c_int, c_void};

/// The Open MPI control variable that picks libnbc's `MPI_Iallreduce` algorithm.
pub const IALLREDUCE_ALGORITHM_VAR: &str = "coll_libnbc_iallreduce_algorithm";

/// [`IALLREDUCE_ALGORITHM_VAR`] as the C string `MPI_T_cvar_get_index` takes.
const IALLREDUCE_ALGORITHM_CVAR: &CStr = c"coll_libnbc_iallreduce_algorithm";

/// Its value for Rabenseifner's algorithm (0 lets libnbc choose, 1 ring, 2 binomial,
/// 4 recursive doubling).
pub const RABENSEIFNER: c_int = 3;

/// What [`MpiWorld::init`](super::MpiWorld::init) did about Open MPI's `MPI_Iallreduce`
/// algorithm (`coll_libnbc_iallreduce_algorithm`); see
/// [`MpiWorld::iallreduce_algorithm`](super::MpiWorld::iallreduce_algorithm).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IallreduceAlgorithm {
    /// Set to [`RABENSEIFNER`] (it was 0: libnbc's own choice).
    Set,
    /// The user chose this value; left as it is.
    Kept(c_int),
    /// Not set, and why (not Open MPI, or the tool interface refused).
    Untouched(String),
}

/// Set [`IALLREDUCE_ALGORITHM_VAR`] to [`RABENSEIFNER`] unless the user chose a value. Call once,
/// after `MPI_Init` and before any non-blocking all-reduce, on every rank alike.
pub(crate) fn prefer_rabenseifner_iallreduce() -> IallreduceAlgorithm {
    let mut provided: c_int = 0;
    // SAFETY: valid out-pointer; MPI_T may be initialised any number of times, each matched by
    // the MPI_T_finalize below.
    let rc = unsafe { ffi::MPI_T_init_thread(ffi::MPI_THREAD_MULTIPLE as c_int, &mut provided) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return IallreduceAlgorithm::Untouched(format!("MPI_T_init_thread returned {rc}"));
    }
    let outcome = set_unless_chosen();
    // SAFETY: matches the successful MPI_T_init_thread above; the variable keeps its value.
    unsafe { ffi::MPI_T_finalize() };
    outcome
}

fn set_unless_chosen() -> IallreduceAlgorithm {
    let untouched = |what: &str, rc: c_int| {
        IallreduceAlgorithm::Untouched(format!(
            "{what} for {IALLREDUCE_ALGORITHM_VAR} returned {rc}"
        ))
    };
    let mut index: c_int = 0;
    // SAFETY: NUL-terminated name, valid out-pointer.
    let rc = unsafe { ffi::MPI_T_cvar_get_index(IALLREDUCE_ALGORITHM_CVAR.as_ptr(), &mut index) };
    if rc != ffi::MPI_SUCCESS as c_int {
        // MPICH and others: no such variable.
        return untouched("MPI_T_cvar_get_index", rc);
    }
    // SAFETY: a null handle is overwritten on success; the variable is bound to no object.
    let mut handle: ffi::MPI_T_cvar_handle = unsafe { std::mem::zeroed() };
    let mut count: c_int = 0;
    // SAFETY: `index` came from MPI_T_cvar_get_index; valid out-pointers.
    let rc = unsafe {
        ffi::MPI_T_cvar_handle_alloc(index, std::ptr::null_mut(), &mut handle, &mut count)
    };
    if rc != ffi::MPI_SUCCESS as c_int {
        return untouched("MPI_T_cvar_handle_alloc", rc);
    }
    let outcome = if count != 1 {
        IallreduceAlgorithm::Untouched(format!(
            "{IALLREDUCE_ALGORITHM_VAR} holds {count} values, not one integer"
        ))
    } else {
        let mut current: c_int = 0;
        // SAFETY: `handle` is live and its variable holds one value (`count` 1), an `int` in
        // Open MPI (`ompi_info --param coll libnbc --level 9`: type int).
        let rc = unsafe { ffi::MPI_T_cvar_read(handle, &mut current as *mut c_int as *mut c_void) };
        if rc != ffi::MPI_SUCCESS as c_int {
            untouched("MPI_T_cvar_read", rc)
        } else if current != 0 {
            IallreduceAlgorithm::Kept(current)
        } else {
            let want = RABENSEIFNER;
            // SAFETY: as above; the variable is an `int`.
            let rc =
                unsafe { ffi::MPI_T_cvar_write(handle, &want as *const c_int as *const c_void) };
            if rc == ffi::MPI_SUCCESS as c_int {
                IallreduceAlgorithm::Set
            } else {
                untouched("MPI_T_cvar_write", rc)
            }
        }
    };
    // SAFETY: `handle` was allocated above and is freed once.
    unsafe { ffi::MPI_T_cvar_handle_free(&mut handle) };
    outcome
}

/// Whether Open MPI was told that this process's ranks share cores, as Open MPI itself decides
/// to yield the core while it waits: its MCA parameter `mpi_yield_when_idle` set (`--mca
/// mpi_yield_when_idle 1` reaches every rank as `OMPI_MCA_mpi_yield_when_idle`), or the
/// launcher's `OMPI_MCA_mpi_oversubscribe` (what `mpirun` sets on every rank of a node given
/// more ranks than slots, by default its cores; Open MPI then yields whatever
/// `mpi_yield_when_idle` says), either to anything but `0`, `false` or `no`.
///
/// Where it holds, the pipelined gradient sync keeps its helper sleeping between polls even
/// while the compute thread waits (with 4 ranks on 2 cores a polling helper slowed the wide
/// MLP's DDP at 1 Gbit/s by 8-24%, two consecutive A/B runs), and `pipeline-buckets = "auto"`
/// does not pipeline at all
/// ([`ProcessGroup::ranks_share_cores`](crate::ProcessGroup::ranks_share_cores)).
pub(crate) fn ranks_share_cores() -> bool {
    let var = |name| std::env::var(name).ok();
    shares_cores(
        var("OMPI_MCA_mpi_yield_when_idle").as_deref(),
        var("OMPI_MCA_mpi_oversubscribe").as_deref(),
    )
}

/// [`ranks_share_cores`] from the two variables' values (`None`: unset).
fn shares_cores(yield_when_idle: Option<&str>, oversubscribe: Option<&str>) -> bool {
    yield_when_idle.is_some_and(is_set) || oversubscribe.is_some_and(is_set)
}

/// An Open MPI boolean parameter's value read as set (`1`, `true`, `yes`, ...; not `0`,
/// `false`, `no` or empty).
fn is_set(value: &str) -> bool {
    !matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "" | "0" | "false" | "no" | "off" | "disabled"
    )
}

#[cfg(test)]
mod tests {
    use super::{IALLREDUCE_ALGORITHM_CVAR, IALLREDUCE_ALGORITHM_VAR, is_set, shares_cores};

    #[test]
    fn the_c_name_is_the_documented_name() {
        assert_eq!(
            IALLREDUCE_ALGORITHM_CVAR.to_str(),
            Ok(IALLREDUCE_ALGORITHM_VAR)
        );
    }

    #[test]
    fn open_mpi_booleans_read_as_open_mpi_reads_them() {
        for v in ["1", "true", "TRUE", "yes", " 1 ", "enabled"] {
            assert!(is_set(v), "{v:?}");
        }
        for v in ["", "0", "false", "no", "off", "disabled"] {
            assert!(!is_set(v), "{v:?}");
        }
    }

    #[test]
    fn either_yielding_or_oversubscription_means_shared_cores() {
        // `mpirun` sets `mpi_oversubscribe` to 0 on every node it does not oversubscribe.
        assert!(!shares_cores(None, None));
        assert!(!shares_cores(None, Some("0")));
        assert!(!shares_cores(Some("0"), Some("0")));
        assert!(shares_cores(Some("1"), None));
        assert!(shares_cores(Some("1"), Some("0")));
        assert!(shares_cores(None, Some("1")));
        // Open MPI yields on an oversubscribed node even when told not to.
        assert!(shares_cores(Some("0"), Some("1")));
    }
}
