//! Growing an MPI world back after ranks failed ([`ProcessGroup::grow`]): the members start
//! replacement processes with `MPI_Comm_spawn` (this program, with this process's arguments),
//! merge them into their communicator (`MPI_Intercomm_merge`) and order the result by world
//! rank (`MPI_Comm_split`); a process started that way finds its parents in
//! [`MpiWorld::init`](super::MpiWorld::init) and takes the other side of the same steps.
//!
//! Open MPI places the new processes like any others: the job must have free slots (`mpirun
//! --oversubscribe`, or more slots than ranks), as the failed ranks' slots are not given back.
//! A process connected to another job this way must free every communicator that reaches
//! across before `MPI_Finalize`, or the finalize can wait on processes that already left
//! ([`MpiWorld::exit_after_failure`](super::MpiWorld::exit_after_failure) does that).
//!
//! [`ProcessGroup::grow`]: crate::ProcessGroup::grow

use super::ffi::{self as mffi, Comm, check};
use crate::error::CommError;
use mpi::ffi;
use std::ffi::{CString, c_char, c_int, c_void};

/// The first word of the message that tells started processes their members failed to start
/// them all (an impossible member count).
const GIVE_UP: u64 = u64::MAX;

/// A grown communicator and its members' world ranks (ascending: its rank order).
pub(crate) struct Grown {
    pub comm: Comm,
    pub world_ranks: Vec<usize>,
}

/// The members' side (collective over `comm`, whose ranks are the world ranks `members`):
/// start one process per world rank of `ranks` and return the communicator of everyone.
/// Every member returns an error alike when the spawn failed on any of them (no slot, no
/// executable): the members' communicator is then unchanged.
pub(crate) fn spawn_replacements(
    comm: Comm,
    rank: usize,
    members: &[usize],
    ranks: &[usize],
) -> Result<Grown, CommError> {
    let size = members.len();
    let (command, args) = this_program()?;
    let mut argv: Vec<*mut c_char> = args.iter().map(|a| a.as_ptr() as *mut c_char).collect();
    argv.push(std::ptr::null_mut());
    let count = ranks.len() as c_int;
    let mut errcodes: Vec<c_int> = vec![0; ranks.len()];
    // SAFETY: a null handle is overwritten by MPI_Comm_spawn.
    let mut inter: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    // SAFETY: `command` and `argv` (null-terminated) outlive the call; `errcodes` holds
    // `count` entries; `comm` is valid and every member calls this with the same root.
    let rc = unsafe {
        ffi::MPI_Comm_spawn(
            command.as_ptr(),
            argv.as_mut_ptr(),
            count,
            ffi::RSMPI_INFO_NULL,
            0,
            comm.0,
            &mut inter,
            errcodes.as_mut_ptr(),
        )
    };
    // SAFETY: reading an rsmpi-exported constant.
    let connected = rc == ffi::MPI_SUCCESS as c_int && inter != unsafe { ffi::RSMPI_COMM_NULL };
    // Only the root sees the error codes: whether every process started.
    let started = errcodes.iter().all(|&c| c == 0);
    let failed = |why: String| CommError::Backend {
        backend: "mpi",
        message: format!(
            "MPI_Comm_spawn of {} for world ranks {ranks:?} failed ({why}): the job needs free \
             slots for replacements (start it with `mpirun --oversubscribe`, or with more slots \
             than ranks)",
            command.to_string_lossy()
        ),
    };
    let flags = [u64::from(connected), u64::from(started)];
    let everyone = match mffi::all_gather_u64(comm, &flags, size) {
        Ok(e) => e,
        Err(e) => {
            if connected {
                mffi::free_comm(Comm(inter));
            }
            return Err(e);
        }
    };
    if everyone.chunks(2).any(|f| f[0] == 0) {
        // Open MPI gives every member the spawn's one result, so no member is connected to
        // new processes here that would wait for a merge.
        if connected {
            mffi::free_comm(Comm(inter));
        }
        return Err(failed(if rc == ffi::MPI_SUCCESS as c_int {
            "a member got no connection to the new processes".to_string()
        } else {
            mffi::error_string(rc)
        }));
    }
    let all_started = everyone.chunks(2).all(|f| f[1] == 1);
    // From here on an error is the new processes' (one that died while starting makes these
    // calls fail as a failed peer would): it is a failed spawn, which the members survive as
    // such, not a failure of their own group.
    let lost = |e: CommError| failed(format!("a new process failed while joining: {e}"));
    let inter = Comm(inter);
    let merged = merge(inter, false);
    mffi::free_comm(inter);
    let merged = merged.map_err(lost)?;
    if !all_started {
        // Some processes started, some did not: tell the ones that did to give up.
        let told = broadcast_words(merged, (rank == 0).then(|| vec![GIVE_UP]));
        mffi::free_comm(merged);
        return Err(match told {
            Ok(_) => failed("not every process started".into()),
            Err(e) => lost(e),
        });
    }
    // The new processes learn who is who from the members' rank 0.
    let mut words: Vec<u64> = Vec::with_capacity(2 + size + ranks.len());
    words.push(size as u64);
    words.extend(members.iter().map(|&r| r as u64));
    words.push(ranks.len() as u64);
    words.extend(ranks.iter().map(|&r| r as u64));
    let sent = broadcast_words(merged, (rank == 0).then_some(words));
    let grown = sent.and_then(|_| split_by_world_rank(merged, members[rank]));
    mffi::free_comm(merged);
    let comm = grown.map_err(lost)?;
    let mut world_ranks: Vec<usize> = members.iter().chain(ranks).copied().collect();
    world_ranks.sort_unstable();
    Ok(Grown { comm, world_ranks })
}

/// The new process's side: `None` when this process was not started by
/// [`spawn_replacements`]; otherwise the grown communicator and this process's world rank.
pub(crate) fn join_parents() -> Result<Option<(Grown, usize)>, CommError> {
    // SAFETY: a null handle is overwritten by MPI_Comm_get_parent.
    let mut parent: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; MPI is initialised.
    let rc = unsafe { ffi::MPI_Comm_get_parent(&mut parent) };
    check(rc, || "MPI_Comm_get_parent".into())?;
    // SAFETY: reading an rsmpi-exported constant.
    if parent == unsafe { ffi::RSMPI_COMM_NULL } {
        return Ok(None);
    }
    let parent = Comm(parent);
    mffi::errors_return(parent)?;
    let merged = merge(parent, true);
    mffi::free_comm(parent);
    let merged = merged?;
    let joined = (|| {
        let words = broadcast_words(merged, None)?;
        let position = mffi::comm_rank(merged)?;
        if words.first() == Some(&GIVE_UP) {
            return Err(CommError::Backend {
                backend: "mpi",
                message: "the members that started this process could not start every \
                          replacement, and continue without them"
                    .into(),
            });
        }
        let (members, ranks) = layout(&words).ok_or_else(|| CommError::Backend {
            backend: "mpi",
            message: format!("the members that started this process sent {words:?}"),
        })?;
        let me = position
            .checked_sub(members.len())
            .and_then(|i| ranks.get(i))
            .copied()
            .ok_or_else(|| CommError::Backend {
                backend: "mpi",
                message: format!(
                    "this process is rank {position} of the merged group, beyond the {} members \
                     and {} new processes",
                    members.len(),
                    ranks.len()
                ),
            })?;
        let comm = split_by_world_rank(merged, me)?;
        let mut world_ranks: Vec<usize> = members.into_iter().chain(ranks).collect();
        world_ranks.sort_unstable();
        Ok((Grown { comm, world_ranks }, me))
    })();
    mffi::free_comm(merged);
    joined.map(Some)
}

/// The members' message: `[n, n member world ranks, m, m new world ranks]`, read as the
/// members and the new ranks (`None` for a message of another shape).
fn layout(words: &[u64]) -> Option<(Vec<usize>, Vec<usize>)> {
    let (&n, rest) = words.split_first()?;
    let members = rest.get(..usize::try_from(n).ok()?)?;
    let (&m, rest) = rest.get(members.len()..)?.split_first()?;
    let ranks = rest.get(..usize::try_from(m).ok()?)?;
    let list = |w: &[u64]| w.iter().map(|&r| r as usize).collect();
    Some((list(members), list(ranks)))
}

/// This program and its arguments, as `MPI_Comm_spawn` takes them.
fn this_program() -> Result<(CString, Vec<CString>), CommError> {
    use std::os::unix::ffi::OsStrExt;
    let bad = |what: String| CommError::Backend {
        backend: "mpi",
        message: format!("cannot start a replacement process: {what}"),
    };
    let exe = std::env::current_exe().map_err(|e| bad(format!("this program's path: {e}")))?;
    let command = CString::new(exe.as_os_str().as_bytes())
        .map_err(|_| bad(format!("its path {} holds a NUL byte", exe.display())))?;
    let args = std::env::args_os()
        .skip(1)
        .map(|a| {
            CString::new(a.as_bytes()).map_err(|_| bad(format!("argument {a:?} holds a NUL byte")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((command, args))
}

/// `MPI_Intercomm_merge`: the members low, the new processes high.
fn merge(inter: Comm, high: bool) -> Result<Comm, CommError> {
    // SAFETY: a null handle is overwritten on success.
    let mut merged: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    // SAFETY: valid intercommunicator.
    let rc = unsafe { ffi::MPI_Intercomm_merge(inter.0, c_int::from(high), &mut merged) };
    check(rc, || "MPI_Intercomm_merge".into())?;
    let merged = Comm(merged);
    mffi::errors_return(merged)?;
    Ok(merged)
}

/// Rank 0's words to everyone (`Some` on rank 0): the length, then the words.
fn broadcast_words(comm: Comm, words: Option<Vec<u64>>) -> Result<Vec<u64>, CommError> {
    let mut len = [words.as_ref().map_or(0, |w| w.len() as u64)];
    bcast(comm, &mut len)?;
    let mut words = words.unwrap_or_else(|| vec![0; len[0] as usize]);
    bcast(comm, &mut words)?;
    Ok(words)
}

fn bcast(comm: Comm, buf: &mut [u64]) -> Result<(), CommError> {
    // SAFETY: `buf` holds `buf.len()` words on every rank (the length was sent first).
    let rc = unsafe {
        ffi::MPI_Bcast(
            buf.as_mut_ptr() as *mut c_void,
            buf.len() as c_int,
            ffi::RSMPI_UINT64_T,
            0,
            comm.0,
        )
    };
    check(rc, || "MPI_Bcast".into())
}

/// Everyone of `comm` in one communicator ordered by world rank.
fn split_by_world_rank(comm: Comm, world_rank: usize) -> Result<Comm, CommError> {
    // SAFETY: a null handle is overwritten on success.
    let mut out: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    // SAFETY: valid communicator; every process calls it with color 0.
    let rc = unsafe { ffi::MPI_Comm_split(comm.0, 0, world_rank as c_int, &mut out) };
    check(rc, || "MPI_Comm_split".into())?;
    let out = Comm(out);
    mffi::errors_return(out)?;
    Ok(out)
}
