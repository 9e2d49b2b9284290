//! `MpiGroup`: one process's handle on an MPI communicator.

use super::ffi::{self as mffi, Comm, MAX_COUNT, StridedBytes, check};
use super::ops::MpiElement;
use super::ulfm;
use super::{MpiConfig, Runtime};
use crate::buffer::{BufferMut, with_typed_slice};
use crate::error::CommError;
use crate::group::{Group, ProcessGroup, validate_all_to_all, validate_gather_output};
use crate::signature::{CallSignature, ReduceOp};
use crate::traffic::{Traffic, TrafficChain};
use crate::watchdog::What;
use mpi::ffi;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One process's handle on a group of MPI ranks (a communicator).
///
/// Obtained from [`MpiWorld::init`](super::MpiWorld::init) (the world) and from the subgroup
/// methods of [`ProcessGroup`]. Every collective runs under the process's watchdog (a collective
/// that exceeds the group timeout aborts the job), and, when
/// [signature checks](MpiConfig::with_signature_check) are on, after a cross-rank comparison of
/// the call's signature.
pub struct MpiGroup {
    comm: Comm,
    /// Whether this handle created `comm` (and frees it when dropped); false for the world.
    owned: bool,
    rank: usize,
    world_ranks: Arc<[usize]>,
    traffic: TrafficChain,
    config: MpiConfig,
    runtime: Arc<Runtime>,
    /// Serialises collectives issued through this handle by several threads of one rank (MPI
    /// requires the collectives of a communicator to be issued one after the other, in the same
    /// order on every rank; threads that interleave differently on different ranks then get a
    /// mismatch error with signature checks on).
    issue: Mutex<()>,
    /// `Some(interval)` for a [`dedicated`](ProcessGroup::dedicated) communicator: its
    /// all-reduces run in pieces of at most [`PIECE_BYTES`], each an `MPI_Iallreduce`
    /// completed by `MPI_Test` every `interval` with a sleep in between. The sleep keeps the
    /// helper thread that drives it off the core the compute thread needs (OpenMPI's blocking
    /// calls spin); while the compute thread is blocked waiting for the result, the helper polls
    /// without sleeping (a sleep is time the transfer stands still; see `hurry`). The pieces
    /// bound how much of it sits in a TCP connection ahead of the other communicator's small
    /// collectives (OpenMPI sends every communicator between two processes over the same
    /// connection). `None`: blocking calls.
    poll: Option<Duration>,
    /// Whether a dedicated communicator's helper polls without sleeping while a thread of this
    /// process is blocked waiting for its result: on, unless Open MPI was told that ranks share
    /// cores ([`tuning::ranks_share_cores`]), where a polling helper takes the core another
    /// rank's compute needs.
    hurry: bool,
    /// Whether this group was shrunk already (a second shrink of it is refused: the survivors
    /// shrink the group the first one returned).
    shrunk: std::sync::atomic::AtomicBool,
    /// The shrinks this process had been through when the group was created (`Runtime::epoch`).
    epoch: u64,
    /// Whether this is the world group of a replacement a `grow` started.
    joined: bool,
}

/// Polling interval of a dedicated communicator's all-reduce pieces: short against a piece's
/// transfer, long enough that the helper thread costs almost no CPU.
const DEDICATED_POLL: Duration = Duration::from_micros(100);

/// Largest piece of an all-reduce: about 2 ms of a 1 Gbit/s link. Blocking calls and a
/// dedicated communicator's non-blocking ones alike run one piece after the other.
///
/// On a dedicated communicator it bounds how long a world collective issued meanwhile waits
/// behind it (both share one TCP connection between two processes). On every communicator it
/// keeps Open MPI's blocking all-reduce near the link's rate, which one large `MPI_Allreduce`
/// over TCP falls well short of (`bench/results/2026-12-04-blocking-pieces/`).
const PIECE_BYTES: usize = crate::MPI_PIECE_BYTES;

impl fmt::Debug for MpiGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiGroup")
            .field("rank", &self.rank)
            .field("world_ranks", &&self.world_ranks[..])
            .field("signature_check", &self.config.signature_check)
            .finish()
    }
}

impl MpiGroup {
    /// The world group (`MPI_COMM_WORLD`).
    pub(crate) fn world(runtime: Arc<Runtime>, config: MpiConfig) -> Result<Self, CommError> {
        let comm = mffi::comm_world();
        let rank = mffi::comm_rank(comm)?;
        let size = mffi::comm_size(comm)?;
        Ok(Self::top(
            runtime,
            config,
            comm,
            rank,
            (0..size).collect(),
            false,
        ))
    }

    /// A world group of this process: `MPI_COMM_WORLD` (not owned), or a replacement's grown
    /// communicator (`joined`, owned).
    fn top(
        runtime: Arc<Runtime>,
        config: MpiConfig,
        comm: Comm,
        rank: usize,
        world_ranks: Vec<usize>,
        joined: bool,
    ) -> Self {
        Self {
            comm,
            owned: joined,
            rank,
            world_ranks: world_ranks.into(),
            traffic: TrafficChain::root(),
            config,
            runtime,
            issue: Mutex::new(()),
            poll: None,
            hurry: false,
            shrunk: std::sync::atomic::AtomicBool::new(false),
            epoch: 0,
            joined,
        }
    }

    /// The world group of a replacement process (see `spawn`): the communicator the members
    /// that started it grew, in which it holds its world rank.
    pub(crate) fn joined(
        runtime: Arc<Runtime>,
        config: MpiConfig,
        grown: super::spawn::Grown,
    ) -> Result<Self, CommError> {
        let comm = grown.comm;
        let rank = mffi::comm_rank(comm)?;
        // Kept for the barrier before leaving, as after a shrink (the members dup their grown
        // communicator at the same point).
        runtime.keep_duplicate(comm)?;
        runtime
            .comms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((comm, 0));
        Ok(Self::top(
            runtime,
            config,
            comm,
            rank,
            grown.world_ranks,
            true,
        ))
    }

    /// A group over a communicator this rank just created from `self` (called inside one of
    /// `self`'s collectives; frees `comm` when it fails).
    fn child(
        &self,
        comm: Comm,
        world_ranks: Vec<usize>,
        traffic: TrafficChain,
    ) -> Result<Self, CommError> {
        let setup = || -> Result<usize, CommError> {
            mffi::errors_return(comm)?;
            let size = mffi::comm_size(comm)?;
            if size != world_ranks.len() {
                return Err(CommError::Backend {
                    backend: "mpi",
                    message: format!(
                        "new communicator has {size} ranks but its members are {world_ranks:?}"
                    ),
                });
            }
            mffi::comm_rank(comm)
        };
        match setup() {
            Ok(rank) => {
                let epoch = self.runtime.epoch();
                self.runtime
                    .comms
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((comm, epoch));
                Ok(Self {
                    comm,
                    owned: true,
                    rank,
                    world_ranks: world_ranks.into(),
                    traffic,
                    config: self.config.clone(),
                    runtime: self.runtime.clone(),
                    issue: Mutex::new(()),
                    poll: None,
                    hurry: false,
                    shrunk: std::sync::atomic::AtomicBool::new(false),
                    epoch,
                    joined: false,
                })
            }
            Err(e) => {
                mffi::free_comm(comm);
                Err(e)
            }
        }
    }

    /// This rank's world rank.
    fn world_rank(&self) -> usize {
        self.world_ranks[self.rank]
    }

    /// Whether every collective on this group is preceded by a cross-rank signature check.
    pub fn signature_check(&self) -> bool {
        self.config.signature_check
    }

    fn check(&self, rc: c_int, call: &CallSignature, function: &str) -> Result<(), CommError> {
        check(rc, || {
            format!(
                "{function} for {call} on group {:?} (world rank {})",
                &self.world_ranks[..],
                self.world_rank()
            )
        })
    }

    /// Run one collective: serialise (if MPI lacks thread support), watch it, check signatures
    /// (if enabled), run `body`, count the traffic.
    fn collective<R>(
        &self,
        sig: CallSignature,
        body: impl FnOnce() -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        let _issuing = self.issue.lock().unwrap_or_else(|e| e.into_inner());
        let _serial = self.runtime.enter()?;
        let _watch =
            self.runtime
                .watchdog
                .watch(What::Call(sig), &self.world_ranks, self.config.timeout);
        if self.config.signature_check {
            self.check_signature(&sig)?;
        }
        let out = body().map_err(|e| self.peer_failure(e, &sig))?;
        self.traffic.record(&sig, self.size());
        Ok(out)
    }

    /// A failed peer as this group reports it (ULFM): the first failed rank this process knows
    /// of as [`CommError::PeerFailed`], or, when it knows none (another rank saw the failure and
    /// revoked the group), [`CommError::Revoked`]. Other errors pass through.
    fn peer_failure(&self, e: CommError, sig: &CallSignature) -> CommError {
        let (CommError::Revoked { .. }, Ok(ulfm)) = (&e, &self.runtime.ulfm) else {
            return e;
        };
        self.runtime.revoke_failed(self.epoch);
        match ulfm.failed_ranks(self.comm.0).first() {
            Some(&r) => CommError::PeerFailed {
                rank: self.world_ranks.get(r).copied().unwrap_or(r),
                reason: "its process failed (MPI_ERR_PROC_FAILED)".into(),
                call: sig.to_string(),
                group: self.world_ranks.to_vec(),
            },
            None => CommError::Revoked {
                call: sig.to_string(),
                group: self.world_ranks.to_vec(),
            },
        }
    }

    /// `MPI_Test` `request` every `interval` (sleeping in between) until it completes; while a
    /// thread of this process is blocked waiting for a non-blocking collective
    /// ([`Pending::wait`](crate::Pending::wait)), without sleeping (yielding the core between
    /// polls), unless ranks share cores (see the `hurry` field). A peer that never joins is
    /// ended by the watchdog around the collective, as for blocking calls.
    fn wait_polling(
        &self,
        request: &mut ffi::MPI_Request,
        interval: Duration,
        sig: &CallSignature,
    ) -> Result<(), CommError> {
        loop {
            let mut done: c_int = 0;
            // SAFETY: `request` is an active non-blocking collective request; status ignored.
            let rc = unsafe { ffi::MPI_Test(request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            self.check(rc, sig, "MPI_Test")?;
            if done != 0 {
                return Ok(());
            }
            if self.hurry && crate::nonblocking::someone_waits() {
                std::thread::yield_now();
            } else {
                std::thread::sleep(interval);
            }
        }
    }

    /// One 6-word all-reduce (max of the signature and of its complement, i.e. max and min);
    /// on disagreement, an all-gather of every rank's signature to name each rank's call.
    fn check_signature(&self, sig: &CallSignature) -> Result<(), CommError> {
        let w = sig.encode();
        let send = [w[0], w[1], w[2], !w[0], !w[1], !w[2]];
        let mut recv = [0u64; 6];
        // SAFETY: both buffers hold 6 words; the datatype and op are predefined.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                6,
                ffi::RSMPI_UINT64_T,
                ffi::RSMPI_MAX,
                self.comm.0,
            )
        };
        self.check(rc, sig, "MPI_Allreduce (signature check)")?;
        if (0..3).all(|i| recv[i] == !recv[i + 3]) {
            return Ok(());
        }
        let all = mffi::all_gather_u64(self.comm, &w, self.size())?;
        let calls = all
            .chunks_exact(3)
            .enumerate()
            .map(|(r, words)| {
                let words = [words[0], words[1], words[2]];
                let call = CallSignature::decode(words)
                    .map_or_else(|| format!("an unknown call {words:?}"), |s| s.to_string());
                (self.world_ranks[r], call)
            })
            .collect();
        Err(CommError::Mismatch {
            calls,
            group: self.world_ranks.to_vec(),
        })
    }

    fn all_reduce_typed<T: MpiElement>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let sig = CallSignature::all_reduce(op, T::TYPE, buf.len());
        let mpi_op = T::op(&self.runtime.ops, op);
        let in_place = self.runtime.in_place;
        self.collective(sig, || {
            if let (Some(interval), Some(sentinel)) = (self.poll, in_place) {
                for_pieces(buf, piece_len::<T>(), |piece| {
                    // SAFETY: as for the blocking call below; the request handle is written by
                    // MPI_Iallreduce and completed by `wait_polling` before `piece` is released.
                    let mut request: ffi::MPI_Request = unsafe { std::mem::zeroed() };
                    let rc = unsafe {
                        ffi::MPI_Iallreduce(
                            sentinel as *const c_void,
                            piece.as_mut_ptr() as *mut c_void,
                            piece.len() as c_int,
                            T::datatype(),
                            mpi_op.0,
                            self.comm.0,
                            &mut request,
                        )
                    };
                    self.check(rc, &sig, "MPI_Iallreduce")?;
                    self.wait_polling(&mut request, interval, &sig)
                })?;
            } else {
                for_pieces(buf, piece_len::<T>(), |piece| {
                    let count = piece.len() as c_int;
                    let recv = piece.as_mut_ptr() as *mut c_void;
                    let rc = match in_place {
                        // SAFETY: `sentinel` is this library's MPI_IN_PLACE; `piece` is a live buffer
                        // of `count` elements of the datatype.
                        Some(sentinel) => unsafe {
                            ffi::MPI_Allreduce(
                                sentinel as *const c_void,
                                recv,
                                count,
                                T::datatype(),
                                mpi_op.0,
                                self.comm.0,
                            )
                        },
                        None => {
                            // Unknown MPI library (no known MPI_IN_PLACE value): one copy.
                            let send = piece.to_vec();
                            // SAFETY: `send` and `piece` hold `count` elements each.
                            unsafe {
                                ffi::MPI_Allreduce(
                                    send.as_ptr() as *const c_void,
                                    recv,
                                    count,
                                    T::datatype(),
                                    mpi_op.0,
                                    self.comm.0,
                                )
                            }
                        }
                    };
                    self.check(rc, &sig, "MPI_Allreduce")
                })?;
            }
            if op == ReduceOp::Mean {
                let n = self.size();
                for x in buf.iter_mut() {
                    *x = x.div_count(n);
                }
            }
            Ok(())
        })
    }

    fn broadcast_typed<T: MpiElement>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        let size = self.size();
        if root >= size {
            return Err(CommError::InvalidRoot { root, size });
        }
        let sig = CallSignature::broadcast(root, T::TYPE, buf.len());
        self.collective(sig, || {
            for_pieces(buf, MAX_COUNT, |piece| {
                // SAFETY: `piece` is a live buffer of `piece.len()` elements of the datatype;
                // `root` is a rank of the communicator.
                let rc = unsafe {
                    ffi::MPI_Bcast(
                        piece.as_mut_ptr() as *mut c_void,
                        piece.len() as c_int,
                        T::datatype(),
                        root as c_int,
                        self.comm.0,
                    )
                };
                self.check(rc, &sig, "MPI_Bcast")
            })
        })
    }
}

impl MpiGroup {
    /// One piece of an all-gather of `stride` bytes per rank: every rank's `send` (bytes
    /// `offset..offset + send.len()` of its message) lands at `r * stride + offset` in `out`. A
    /// whole message travels as plain bytes; a part of one, through a [`StridedBytes`] receive
    /// type. On a dedicated communicator, `MPI_Iallgather` polled like its all-reduce pieces.
    fn gather_piece(
        &self,
        send: &[u8],
        out: &mut [u8],
        offset: usize,
        stride: usize,
        sig: &CallSignature,
    ) -> Result<(), CommError> {
        // At most MAX_COUNT bytes per piece (the caller cuts them so).
        let count = send.len() as c_int;
        let strided = if send.len() == stride {
            None
        } else {
            Some(StridedBytes::new(count, stride)?)
        };
        let (recv_count, recv_type) = match &strided {
            Some(t) => (1, t.0),
            // SAFETY: reading an rsmpi-exported constant.
            None => (count, unsafe { ffi::RSMPI_UINT8_T }),
        };
        // In bounds: rank r's piece ends at r * stride + offset + count <= size * stride.
        let mut recv = out[offset..].as_mut_ptr() as *mut c_void;
        let mut sendbuf = send.as_ptr() as *const c_void;
        // An empty slice's address is dangling: for bytes it is 1, Open MPI's MPI_IN_PLACE. An
        // empty message still takes part (every rank synchronises), from real addresses.
        let no_send = 0u8;
        let mut no_recv = 0u8;
        if send.is_empty() {
            sendbuf = &no_send as *const u8 as *const c_void;
            recv = &mut no_recv as *mut u8 as *mut c_void;
        }
        // SAFETY (both calls): `send` holds `count` bytes; `out` holds `size * stride` bytes
        // and the receive type places each rank's `count` bytes inside it (see above); the
        // buffers do not overlap (`&` and `&mut`).
        if let Some(interval) = self.poll {
            // SAFETY: see above; the request is completed by `wait_polling` before the
            // buffers are released.
            let mut request: ffi::MPI_Request = unsafe { std::mem::zeroed() };
            let rc = unsafe {
                ffi::MPI_Iallgather(
                    sendbuf,
                    count,
                    ffi::RSMPI_UINT8_T,
                    recv,
                    recv_count,
                    recv_type,
                    self.comm.0,
                    &mut request,
                )
            };
            self.check(rc, sig, "MPI_Iallgather")?;
            self.wait_polling(&mut request, interval, sig)
        } else {
            // SAFETY: see above.
            let rc = unsafe {
                ffi::MPI_Allgather(
                    sendbuf,
                    count,
                    ffi::RSMPI_UINT8_T,
                    recv,
                    recv_count,
                    recv_type,
                    self.comm.0,
                )
            };
            self.check(rc, sig, "MPI_Allgather")
        }
    }

    /// One piece of an all-to-all of `block`-byte blocks: bytes `offset..offset + count` of
    /// every block, block `j` of `send` to rank `j` and rank `r`'s into block `r` of `recv`.
    /// Whole blocks travel as plain bytes; parts of them, through a [`StridedBytes`] type (of
    /// extent `block`) on both sides. On a dedicated communicator, `MPI_Ialltoall` polled like
    /// its all-reduce pieces.
    fn exchange_piece(
        &self,
        send: &[u8],
        recv: &mut [u8],
        offset: usize,
        count: usize,
        block: usize,
        sig: &CallSignature,
    ) -> Result<(), CommError> {
        // At most MAX_COUNT bytes per piece (the caller cuts them so).
        let strided = if count == block {
            None
        } else {
            Some(StridedBytes::new(count as c_int, block)?)
        };
        let (n, datatype) = match &strided {
            Some(t) => (1, t.0),
            // SAFETY: reading an rsmpi-exported constant.
            None => (count as c_int, unsafe { ffi::RSMPI_UINT8_T }),
        };
        // An empty slice's address is dangling: for bytes it is 1, Open MPI's MPI_IN_PLACE. Empty
        // blocks still take part (every rank synchronises), from real addresses.
        let no_send = 0u8;
        let mut no_recv = 0u8;
        let (sendbuf, recvbuf) = if block == 0 {
            (
                &no_send as *const u8 as *const c_void,
                &mut no_recv as *mut u8 as *mut c_void,
            )
        } else {
            // In bounds: block j's piece ends at j * block + offset + count <= size * block.
            (
                send[offset..].as_ptr() as *const c_void,
                recv[offset..].as_mut_ptr() as *mut c_void,
            )
        };
        // SAFETY (both calls): `send` and `recv` hold `size * block` bytes each (validated), and
        // the datatype places each rank's `count` bytes inside them (see above); the buffers do
        // not overlap (`&` and `&mut`).
        if let Some(interval) = self.poll {
            // SAFETY: see above; the request is completed by `wait_polling` before the
            // buffers are released.
            let mut request: ffi::MPI_Request = unsafe { std::mem::zeroed() };
            let rc = unsafe {
                ffi::MPI_Ialltoall(
                    sendbuf,
                    n,
                    datatype,
                    recvbuf,
                    n,
                    datatype,
                    self.comm.0,
                    &mut request,
                )
            };
            self.check(rc, sig, "MPI_Ialltoall")?;
            self.wait_polling(&mut request, interval, sig)
        } else {
            // SAFETY: see above.
            let rc = unsafe {
                ffi::MPI_Alltoall(sendbuf, n, datatype, recvbuf, n, datatype, self.comm.0)
            };
            self.check(rc, sig, "MPI_Alltoall")
        }
    }
}

/// Bytes per rank in one all-gather piece (per block in one all-to-all piece): on a dedicated
/// communicator, [`PIECE_BYTES`] gathered (exchanged) in all (split among the ranks, at least 1
/// each), as its all-reduce pieces; otherwise as much as one call takes ([`MAX_COUNT`]: MPI
/// counts are `int`s).
fn gather_piece_len(dedicated: bool, size: usize) -> usize {
    if dedicated {
        (PIECE_BYTES / size.max(1)).clamp(1, MAX_COUNT)
    } else {
        MAX_COUNT
    }
}

/// Elements of `T` in one all-reduce piece: as many as fit in [`PIECE_BYTES`] (at least one).
fn piece_len<T>() -> usize {
    (PIECE_BYTES / std::mem::size_of::<T>()).clamp(1, MAX_COUNT)
}

/// Call `f` on consecutive pieces of at most `len` elements (once, on the empty slice, for an
/// empty buffer, so every rank still takes part in the collective). `len` is at least 1 and at
/// most [`MAX_COUNT`] (MPI counts are `int`s).
fn for_pieces<T>(
    buf: &mut [T],
    len: usize,
    mut f: impl FnMut(&mut [T]) -> Result<(), CommError>,
) -> Result<(), CommError> {
    if buf.is_empty() {
        return f(buf);
    }
    buf.chunks_mut(len).try_for_each(f)
}

impl Drop for MpiGroup {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // After MPI_Finalize (the MpiWorld was dropped first) the communicator is gone already.
        let Ok(_serial) = self.runtime.enter() else {
            return;
        };
        {
            let mut comms = self.runtime.comms.lock().unwrap_or_else(|e| e.into_inner());
            comms.retain(|(c, _)| c.0 != self.comm.0);
            // After a failure, a peer may still wait in a collective of this communicator.
            if let (true, Ok(ulfm)) = (self.runtime.failed(self.epoch), &self.runtime.ulfm) {
                let _ = ulfm.revoke(self.comm.0);
            }
        }
        mffi::free_comm(self.comm);
    }
}

impl ProcessGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.world_ranks.len()
    }

    fn world_ranks(&self) -> &[usize] {
        &self.world_ranks
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        with_typed_slice!(buf, b => self.all_reduce_typed(b, op))
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), CommError> {
        with_typed_slice!(buf, b => self.broadcast_typed(b, root))
    }

    fn barrier(&self) -> Result<(), CommError> {
        let sig = CallSignature::barrier();
        self.collective(sig, || {
            // SAFETY: valid communicator.
            let rc = unsafe { ffi::MPI_Barrier(self.comm.0) };
            self.check(rc, &sig, "MPI_Barrier")
        })
    }

    fn all_gather_u64(&self, local: &[u64]) -> Result<Vec<u64>, CommError> {
        let sig = CallSignature::all_gather(local.len());
        self.collective(sig, || mffi::all_gather_u64(self.comm, local, self.size()))
    }

    /// `MPI_Allgather` of the bytes (`MPI_UINT8_T`) straight into `out`, in one call up to
    /// `i32::MAX` bytes per rank and in pieces beyond; on a [dedicated](ProcessGroup::dedicated)
    /// communicator, `MPI_Iallgather` pieces polled like its all-reduce's.
    fn all_gather_bytes(&self, local: &[u8], out: &mut [u8]) -> Result<(), CommError> {
        let len = local.len();
        let sig = CallSignature::all_gather_bytes(len);
        let size = self.size();
        validate_gather_output(&sig, size, len, out.len())?;
        let piece = gather_piece_len(self.poll.is_some(), size);
        self.collective(sig, || {
            // At least one call, for an empty message too: every rank takes part.
            let mut offset = 0;
            loop {
                let end = len.min(offset + piece);
                self.gather_piece(&local[offset..end], out, offset, len, &sig)?;
                offset = end;
                if offset >= len {
                    return Ok(());
                }
            }
        })
    }

    /// `MPI_Alltoall` of the blocks (`MPI_UINT8_T`) straight from `send` into `recv`, in one
    /// call up to `i32::MAX` bytes per block and in pieces beyond; on a
    /// [dedicated](ProcessGroup::dedicated) communicator, `MPI_Ialltoall` pieces polled like its
    /// all-reduce's.
    fn all_to_all_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        let size = self.size();
        let block = validate_all_to_all(size, send.len(), recv.len())?;
        let sig = CallSignature::all_to_all_bytes(block);
        let piece = gather_piece_len(self.poll.is_some(), size);
        self.collective(sig, || {
            // At least one call, for empty blocks too: every rank takes part.
            let mut offset = 0;
            loop {
                let end = block.min(offset + piece);
                self.exchange_piece(send, recv, offset, end - offset, block, &sig)?;
                offset = end;
                if offset >= block {
                    return Ok(());
                }
            }
        })
    }

    /// `MPI_Comm_split` after an all-gather of the colors (MPI colors are non-negative `int`s,
    /// ours are `u64`: each color is replaced by its index among the distinct colors).
    fn split(&self, color: u64) -> Result<Group, CommError> {
        let sig = CallSignature::split();
        self.collective(sig, || {
            let colors = mffi::all_gather_u64(self.comm, &[color], self.size())?;
            let mut distinct = colors.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let index = distinct.binary_search(&color).unwrap_or_default();
            let members: Vec<usize> = (0..colors.len())
                .filter(|&r| colors[r] == color)
                .map(|r| self.world_ranks[r])
                .collect();
            // SAFETY: a null handle is overwritten by MPI_Comm_split on success.
            let mut new: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
            // SAFETY: valid communicator; the color index and key are non-negative ints (a
            // group has fewer than 2^31 ranks).
            let rc = unsafe {
                ffi::MPI_Comm_split(self.comm.0, index as c_int, self.rank as c_int, &mut new)
            };
            self.check(rc, &sig, "MPI_Comm_split")?;
            let group: Group = Arc::new(self.child(Comm(new), members, self.traffic.child())?);
            Ok(group)
        })
    }

    /// `MPI_Comm_dup`: same ranks, its own communication context. Needs
    /// `MPI_THREAD_MULTIPLE` (requested at start-up): with serialised calls, a helper thread
    /// blocked in this communicator's collective would hold the lock the world group's next
    /// collective waits for, and ranks would deadlock.
    fn dedicated(&self) -> Result<Group, CommError> {
        if self.runtime.serial.is_some() {
            return Err(CommError::InvalidConfig(
                "non-blocking collectives need MPI_THREAD_MULTIPLE, and this MPI library \
                 provides less (its calls are serialised); use an MPI built with thread \
                 support, or turn overlapping off"
                    .into(),
            ));
        }
        let sig = CallSignature::split();
        self.collective(sig, || {
            // SAFETY: a null handle is overwritten by MPI_Comm_dup on success.
            let mut new: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
            // SAFETY: valid communicator.
            let rc = unsafe { ffi::MPI_Comm_dup(self.comm.0, &mut new) };
            self.check(rc, &sig, "MPI_Comm_dup")?;
            let members = self.world_ranks.to_vec();
            let mut group = self.child(Comm(new), members, TrafficChain::root())?;
            group.poll = Some(DEDICATED_POLL);
            group.hurry = !self.runtime.shares_cores;
            let group: Group = Arc::new(group);
            Ok(group)
        })
    }

    /// ULFM: revoke every communicator of this process (so that no survivor stays blocked on
    /// one a peer left), `MPIX_Comm_shrink` this one, agree over the result, and gather the
    /// survivors' world ranks. The new group counts on this group's traffic counters. Needs an
    /// MPI library with ULFM and `mpirun --with-ft ulfm` ([`MpiWorld::fault_tolerant`]); without
    /// them, [`CommError::Unsupported`] says what is missing.
    ///
    /// [`MpiWorld::fault_tolerant`]: super::MpiWorld::fault_tolerant
    fn shrink(&self) -> Result<Group, CommError> {
        let ulfm = match self.runtime.ulfm {
            Ok(u) => u,
            Err(symbols) => {
                return Err(CommError::Unsupported {
                    operation: "shrink",
                    backend: "mpi",
                    hint: ulfm::unavailable(&self.runtime.library_version, symbols),
                });
            }
        };
        if self.shrunk.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Err(CommError::InvalidConfig(format!(
                "group {:?} was shrunk already: after a further failure, shrink the group the \
                 first shrink returned",
                &self.world_ranks[..]
            )));
        }
        let _serial = self.runtime.enter()?;
        let _watch = self.runtime.watchdog.watch(
            What::Named("shrinking the group to the ranks that did not fail".into()),
            &self.world_ranks,
            self.config.timeout,
        );
        self.runtime.revoke_failed(self.epoch);
        // SAFETY: a null handle is overwritten by MPIX_Comm_shrink on success.
        let mut new: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
        let rc = ulfm.shrink(self.comm.0, &mut new);
        check(rc, || "MPIX_Comm_shrink".into())?;
        let comm = Comm(new);
        let gathered = mffi::errors_return(comm)
            .and_then(|()| mffi::comm_size(comm))
            .and_then(|size| mffi::all_gather_u64(comm, &[self.world_rank() as u64], size));
        // Every survivor leaves the shrink with the members, or none does: each says whether
        // its part worked, and the agreement (a fault-tolerant AND) is every survivor's answer.
        let mut flag: c_int = c_int::from(gathered.is_ok());
        let agreed = check(ulfm.agree(comm.0, &mut flag), || "MPIX_Comm_agree".into());
        let members: Vec<usize> = match (gathered, agreed, flag) {
            (Ok(m), Ok(()), 1) => m.into_iter().map(|r| r as usize).collect(),
            (gathered, agreed, _) => {
                mffi::free_comm(comm);
                return Err(gathered
                    .and(agreed)
                    .err()
                    .unwrap_or_else(|| CommError::Backend {
                        backend: "mpi",
                        message: "a survivor could not learn the shrunk group's members \
                              (MPIX_Comm_agree said no)"
                            .into(),
                    }));
            }
        };
        // The runtime's own handle on the survivors, for the barrier before leaving
        // (`MpiWorld::exit_after_failure`); the group's is freed with the group. Every survivor
        // calls it here.
        if let Err(e) = self.runtime.keep_duplicate(comm) {
            mffi::free_comm(comm);
            return Err(e);
        }
        // The survivors' group starts the next epoch: a late error of this epoch's
        // communicators revokes them, never it.
        self.runtime.next_epoch(self.epoch);
        let group = self.child(comm, members, self.traffic.clone())?;
        Ok(Arc::new(group))
    }

    /// `MPI_Comm_spawn` of this program with this process's arguments, one process per new
    /// rank (each finds its parents in [`MpiWorld::init`](super::MpiWorld::init) and gets a
    /// world group that says [`joined`](ProcessGroup::joined)), merged with the members and
    /// ordered by world rank. The job needs free slots (`mpirun --oversubscribe`: a failed
    /// rank's slot is not given back); a spawn that fails, or a new process that dies while
    /// joining, is a [`CommError::Backend`] error on every member (not a failed peer), whose
    /// group stays usable. The new group counts on this group's traffic counters.
    fn grow(&self, ranks: &[usize]) -> Result<Group, CommError> {
        crate::group::check_same_grow(self, ranks)?;
        crate::group::validate_grow(&self.world_ranks, ranks)?;
        let _serial = self.runtime.enter()?;
        let _watch = self.runtime.watchdog.watch(
            What::Named(format!("starting replacements for world ranks {ranks:?}")),
            &self.world_ranks,
            self.config.timeout,
        );
        let grown =
            super::spawn::spawn_replacements(self.comm, self.rank, &self.world_ranks, ranks)?;
        self.runtime
            .dynamic
            .store(true, std::sync::atomic::Ordering::Release);
        // Every process of the grown communicator calls this here (the replacements in
        // `MpiGroup::joined`).
        if let Err(e) = self.runtime.keep_duplicate(grown.comm) {
            mffi::free_comm(grown.comm);
            return Err(e);
        }
        let group = self.child(grown.comm, grown.world_ranks, self.traffic.clone())?;
        Ok(Arc::new(group))
    }

    fn joined(&self) -> bool {
        self.joined
    }

    fn charge(&self, sig: &CallSignature) {
        self.traffic.record(sig, self.size());
    }

    fn host_id(&self) -> u64 {
        self.runtime.host_id
    }

    /// Open MPI's `mpi_yield_when_idle` or the oversubscription flag `mpirun` sets
    /// (`OMPI_MCA_mpi_oversubscribe`), either set to a true value, as this rank was started.
    fn ranks_share_cores(&self) -> bool {
        self.runtime.shares_cores
    }

    fn traffic(&self) -> Traffic {
        self.traffic.snapshot()
    }

    /// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`: the ranks that share memory with this one,
    /// as the MPI launcher sees nodes.
    fn intra_node(&self) -> Result<Group, CommError> {
        let sig = CallSignature::split();
        self.collective(sig, || {
            // SAFETY: a null handle is overwritten by MPI_Comm_split_type on success.
            let mut new: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
            // SAFETY: valid communicator; predefined split type and info.
            let rc = unsafe {
                ffi::MPI_Comm_split_type(
                    self.comm.0,
                    ffi::RSMPI_COMM_TYPE_SHARED,
                    self.rank as c_int,
                    ffi::RSMPI_INFO_NULL,
                    &mut new,
                )
            };
            self.check(rc, &sig, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)")?;
            let comm = Comm(new);
            let members = mffi::comm_size(comm)
                .and_then(|size| mffi::all_gather_u64(comm, &[self.world_rank() as u64], size));
            let members = match members {
                Ok(m) => m.into_iter().map(|r| r as usize).collect(),
                Err(e) => {
                    mffi::free_comm(comm);
                    return Err(e);
                }
            };
            let group: Group = Arc::new(self.child(comm, members, self.traffic.child())?);
            Ok(group)
        })
    }
}
