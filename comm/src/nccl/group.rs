//! `NcclGroup`: one process's handle on an NCCL communicator, with the host-buffer
//! [`ProcessGroup`] contract on top.

use super::library::{
    self as lib, NCCL_BFLOAT16, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_IN_PROGRESS,
    NCCL_MAX, NCCL_MIN, NCCL_SUCCESS, NCCL_SUM, NCCL_UINT8, NCCL_UINT64, Nccl,
};
use super::{NcclConfig, Runtime, watchdog};
use crate::buffer::{BufferMut, Element, with_typed_slice};
use crate::error::CommError;
use crate::group::{Group, ProcessGroup, validate_gather_output};
use crate::signature::{CallSignature, ReduceOp};
use crate::traffic::{Traffic, TrafficChain};
use crate::watchdog::What;
use cudarc::driver::sys::{CUdeviceptr, CUresult};
use cudarc::driver::{CudaStream, result as cu};
use cudarc::nccl::sys::{ncclComm_t, ncclUniqueId};
use half::{bf16, f16};
use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Alignment of the regions inside the scratch buffer.
const ALIGN: usize = 256;
/// Smallest scratch allocation.
const MIN_SCRATCH: usize = 4096;
/// How long the completion poll spins (yielding) before it starts sleeping between polls.
const SPIN: Duration = Duration::from_millis(2);
const NAP: Duration = Duration::from_micros(50);

/// A communicator handle shareable between threads (every use is serialised by the group's lock).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Comm(pub ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread; this crate never issues two calls on
// one communicator at the same time (the group's mutex).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// The per-group device state: its stream and its reusable scratch buffer.
struct DeviceState {
    stream: Arc<CudaStream>,
    scratch: CUdeviceptr,
    capacity: usize,
    /// Set when the communicator was aborted (after a timeout or an NCCL/CUDA error).
    aborted: Option<String>,
    /// When the running collective started: every wait inside it counts against one timeout
    /// from here, so the error comes before the watchdog's limit (timeout + grace).
    started: Instant,
}

/// One process's handle on a group of GPU ranks (an NCCL communicator).
///
/// Obtained from [`NcclWorld`](super::NcclWorld) constructors (the world) and from the subgroup
/// methods of [`ProcessGroup`]. Every collective copies the caller's host buffer into a device
/// buffer kept by this group (grown when a call needs more, never shrunk), runs the NCCL
/// collective on the group's own CUDA stream, waits for it with the group timeout, and copies the
/// result back.
pub struct NcclGroup {
    comm: Comm,
    rank: usize,
    world_ranks: Arc<[usize]>,
    traffic: TrafficChain,
    config: NcclConfig,
    runtime: Arc<Runtime>,
    /// Serialises collectives issued through this handle by several threads of one rank.
    state: Mutex<DeviceState>,
}

impl fmt::Debug for NcclGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclGroup")
            .field("rank", &self.rank)
            .field("world_ranks", &&self.world_ranks[..])
            .field("device", &self.runtime.ctx.ordinal())
            .field("signature_check", &self.config.signature_check)
            .finish()
    }
}

/// An element type as NCCL sees it.
trait NcclElement: Element {
    const DATATYPE: c_int;
}
impl NcclElement for f32 {
    const DATATYPE: c_int = NCCL_FLOAT32;
}
impl NcclElement for f64 {
    const DATATYPE: c_int = NCCL_FLOAT64;
}
impl NcclElement for f16 {
    const DATATYPE: c_int = NCCL_FLOAT16;
}
impl NcclElement for bf16 {
    const DATATYPE: c_int = NCCL_BFLOAT16;
}

fn nccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => NCCL_SUM,
        ReduceOp::Max => NCCL_MAX,
        ReduceOp::Min => NCCL_MIN,
    }
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

fn cuda_err(what: &str, e: &cudarc::driver::DriverError) -> CommError {
    CommError::Backend {
        backend: "nccl",
        message: format!("{what} failed: {}", lib::cuda_error(e)),
    }
}

impl NcclGroup {
    /// A group over a communicator this process just created.
    pub(crate) fn new(
        runtime: Arc<Runtime>,
        comm: Comm,
        rank: usize,
        world_ranks: Vec<usize>,
        traffic: TrafficChain,
        config: NcclConfig,
    ) -> Result<Self, CommError> {
        let stream = match runtime.ctx.new_stream() {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: `comm` was created by this process and is not used elsewhere.
                unsafe { (runtime.nccl.comm_abort)(comm.0) };
                return Err(cuda_err("creating a CUDA stream", &e));
            }
        };
        Ok(Self {
            comm,
            rank,
            world_ranks: world_ranks.into(),
            traffic,
            config,
            runtime,
            state: Mutex::new(DeviceState {
                stream,
                scratch: 0,
                capacity: 0,
                aborted: None,
                started: Instant::now(),
            }),
        })
    }

    fn nccl(&self) -> &'static Nccl {
        self.runtime.nccl
    }

    /// This rank's world rank.
    fn world_rank(&self) -> usize {
        self.world_ranks[self.rank]
    }

    /// Whether every collective on this group is preceded by a cross-rank signature check.
    pub fn signature_check(&self) -> bool {
        self.config.signature_check
    }

    /// The CUDA device ordinal this group's rank uses.
    pub fn device_ordinal(&self) -> usize {
        self.runtime.ctx.ordinal()
    }

    /// Bytes of device memory this group currently holds as its copy buffer.
    pub fn scratch_bytes(&self) -> usize {
        self.lock().capacity
    }

    fn lock(&self) -> MutexGuard<'_, DeviceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Abort the communicator (its peers' pending collectives fail too) and remember why; later
    /// calls on this group fail at once. Then drain the group's stream, so that no copy enqueued
    /// by the failed collective still reads or writes the caller's buffer after the error is
    /// returned (the abort ends NCCL's kernels; a GPU that hangs even so is the watchdog's).
    fn abort(&self, st: &mut DeviceState, why: &str) {
        if st.aborted.is_none() {
            // SAFETY: a live communicator of this process; after the abort it is never used.
            let rc = unsafe { (self.nccl().comm_abort)(self.comm.0) };
            if rc != NCCL_SUCCESS {
                tracing::warn!("ncclCommAbort failed: {}", self.nccl().describe(rc, None));
            }
            st.aborted = Some(why.to_string());
        }
        // SAFETY: the group's live stream. Its result does not matter: the group is dead.
        let _ = unsafe { cudarc::driver::sys::cuStreamSynchronize(st.stream.cu_stream()) };
    }

    /// A failed NCCL or CUDA step: abort the communicator and build the error.
    fn fail(
        &self,
        st: &mut DeviceState,
        sig: &CallSignature,
        what: &str,
        detail: String,
    ) -> CommError {
        let message = format!(
            "{what} for {sig} on group {:?} (world rank {}, GPU {}) failed: {detail}; the \
             communicator was aborted",
            &self.world_ranks[..],
            self.world_rank(),
            self.device_ordinal()
        );
        self.abort(st, &message);
        CommError::Backend {
            backend: "nccl",
            message,
        }
    }

    fn check_nccl(
        &self,
        st: &mut DeviceState,
        rc: c_int,
        sig: &CallSignature,
        what: &str,
    ) -> Result<(), CommError> {
        if rc == NCCL_SUCCESS || rc == NCCL_IN_PROGRESS {
            return Ok(());
        }
        let detail = self.nccl().describe(rc, Some(self.comm.0));
        Err(self.fail(st, sig, what, detail))
    }

    fn check_cuda(
        &self,
        st: &mut DeviceState,
        r: Result<(), cudarc::driver::DriverError>,
        sig: &CallSignature,
        what: &str,
    ) -> Result<(), CommError> {
        r.map_err(|e| self.fail(st, sig, what, lib::cuda_error(&e)))
    }

    /// The scratch buffer, grown to at least `bytes` (the stream is idle between collectives, so
    /// the old buffer can be freed at once).
    fn scratch(
        &self,
        st: &mut DeviceState,
        bytes: usize,
        sig: &CallSignature,
    ) -> Result<CUdeviceptr, CommError> {
        if st.capacity >= bytes && st.scratch != 0 {
            return Ok(st.scratch);
        }
        if st.scratch != 0 {
            // SAFETY: allocated by malloc_sync in this context; no work on it is pending.
            let r = unsafe { cu::free_sync(st.scratch) };
            st.scratch = 0;
            st.capacity = 0;
            self.check_cuda(st, r, sig, "cuMemFree (growing the copy buffer)")?;
        }
        let want = align(bytes.max(MIN_SCRATCH));
        // SAFETY: plain device allocation in the bound context.
        match unsafe { cu::malloc_sync(want) } {
            Ok(p) => {
                st.scratch = p;
                st.capacity = want;
                Ok(p)
            }
            Err(e) => Err(self.fail(
                st,
                sig,
                &format!("cuMemAlloc of {want} bytes (the copy buffer)"),
                format!(
                    "{}; the GPU is out of memory? (the NCCL backend keeps one device copy of \
                     the largest buffer per group)",
                    lib::cuda_error(&e)
                ),
            )),
        }
    }

    fn h2d<T>(
        &self,
        st: &mut DeviceState,
        dst: CUdeviceptr,
        src: &[T],
        sig: &CallSignature,
    ) -> Result<(), CommError> {
        if src.is_empty() {
            return Ok(());
        }
        let stream = st.stream.cu_stream();
        // SAFETY: `dst` has room for `src` (scratch was sized for it); the host slice stays
        // borrowed until the stream is synchronised in this collective.
        let r = unsafe { cu::memcpy_htod_async(dst, src, stream) };
        self.check_cuda(st, r, sig, "cuMemcpyHtoDAsync")
    }

    /// Copy a result back; called only once the stream is idle (after [`Self::wait`]). The copy
    /// is synchronised without a timeout: it is local work, and it must never still be writing
    /// into `dst` when this returns, not even on an error.
    fn d2h<T>(
        &self,
        st: &mut DeviceState,
        dst: &mut [T],
        src: CUdeviceptr,
        sig: &CallSignature,
    ) -> Result<(), CommError> {
        if dst.is_empty() {
            return Ok(());
        }
        let stream = st.stream.cu_stream();
        // SAFETY: `src` holds `dst.len()` elements and the stream is idle; `dst` stays borrowed
        // until the stream is synchronised below (or drained by the abort in `fail`).
        let r = unsafe { cu::memcpy_dtoh_async(dst, src, stream) };
        self.check_cuda(st, r, sig, "cuMemcpyDtoHAsync")?;
        // SAFETY: the group's live stream.
        let r = unsafe { cudarc::driver::sys::cuStreamSynchronize(stream) }.result();
        self.check_cuda(st, r, sig, "cuStreamSynchronize (copying the result back)")
    }

    /// Wait until the group's stream is idle, until the group timeout counted from the start of
    /// the collective. NCCL's asynchronous errors (a peer's connection dropped) end the wait
    /// early. On timeout the communicator is aborted and [`CommError::Timeout`] returned.
    fn wait(&self, st: &mut DeviceState, sig: &CallSignature) -> Result<(), CommError> {
        let stream = st.stream.cu_stream();
        let start = st.started;
        let spin_start = Instant::now();
        let mut polls: u64 = 0;
        loop {
            // SAFETY: the group's live stream.
            let rc = unsafe { cudarc::driver::sys::cuStreamQuery(stream) };
            match rc {
                CUresult::CUDA_SUCCESS => return Ok(()),
                CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    let e = cudarc::driver::DriverError(other);
                    return Err(self.fail(st, sig, "waiting for the stream", lib::cuda_error(&e)));
                }
            }
            polls += 1;
            if polls.is_multiple_of(64) {
                let mut async_rc: c_int = NCCL_SUCCESS;
                // SAFETY: live communicator, valid out-pointer.
                let rc = unsafe { (self.nccl().comm_get_async_error)(self.comm.0, &mut async_rc) };
                if rc != NCCL_SUCCESS {
                    let detail = self.nccl().describe(rc, Some(self.comm.0));
                    return Err(self.fail(st, sig, "ncclCommGetAsyncError", detail));
                }
                if async_rc != NCCL_SUCCESS && async_rc != NCCL_IN_PROGRESS {
                    let detail = self.nccl().describe(async_rc, Some(self.comm.0));
                    return Err(self.fail(
                        st,
                        sig,
                        "the NCCL collective (asynchronous error: a peer failed?)",
                        detail,
                    ));
                }
            }
            let waited = start.elapsed();
            if waited >= self.config.timeout {
                let message = format!("{sig} timed out after {waited:?}");
                self.abort(st, &message);
                return Err(CommError::Timeout {
                    call: sig.to_string(),
                    waited,
                    // NCCL cannot tell which peer is missing: every other rank is listed.
                    missing: self
                        .world_ranks
                        .iter()
                        .copied()
                        .filter(|&r| r != self.world_rank())
                        .collect(),
                    group: self.world_ranks.to_vec(),
                });
            }
            if spin_start.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }

    /// Run one collective: serialise, refuse on an aborted communicator, bind the GPU, watch it,
    /// check signatures (if enabled), run `body`, count the traffic.
    fn collective<R>(
        &self,
        sig: CallSignature,
        body: impl FnOnce(&mut DeviceState) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        let mut st = self.lock();
        if let Some(why) = &st.aborted {
            return Err(CommError::Backend {
                backend: "nccl",
                message: format!(
                    "{sig} on group {:?}: this communicator was aborted earlier ({why}); NCCL \
                     communicators cannot be repaired: start a new NcclWorld",
                    &self.world_ranks[..]
                ),
            });
        }
        let st = &mut *st;
        st.started = Instant::now();
        // Everything below, aborts included (they can block inside NCCL), is watched.
        let _watch = self.runtime.watchdog.watch(
            What::Call(sig),
            &self.world_ranks,
            watchdog::limit(self.config.timeout),
        );
        let mut returned = false;
        let result = lib::no_panic(sig, || {
            let r = self.bind_and_run(st, &sig, body);
            returned = true;
            r
        });
        if !returned && st.aborted.is_none() {
            // A panic inside the CUDA bindings: the stream may hold work of this collective
            // and the peers may be inside it. Abort (and drain) as for any other failure.
            self.abort(st, &format!("{sig}: the CUDA bindings panicked"));
        }
        result
    }

    /// Bind the CUDA context, check the signature (if enabled), run `body`, count the traffic.
    fn bind_and_run<R>(
        &self,
        st: &mut DeviceState,
        sig: &CallSignature,
        body: impl FnOnce(&mut DeviceState) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        // cudarc keeps the latest error of its own clean-ups (a freed stream or event), and
        // `bind_to_thread` would return it: report it here, then bind. Another thread's
        // clean-up can store one in between, hence one retry. A bind that still fails aborts
        // the group, so that this rank never skips a collective its peers run and then
        // carries on out of step.
        if let Err(e) = self.runtime.ctx.check_err() {
            tracing::warn!(
                "an earlier CUDA clean-up failed: {} (noticed before {sig})",
                lib::cuda_error(&e)
            );
        }
        let bound = self.runtime.ctx.bind_to_thread().or_else(|_| {
            let _ = self.runtime.ctx.check_err();
            self.runtime.ctx.bind_to_thread()
        });
        if let Err(e) = bound {
            return Err(self.fail(st, sig, "binding the CUDA context", lib::cuda_error(&e)));
        }
        if self.config.signature_check {
            self.check_signature(st, sig)?;
        }
        let out = body(st)?;
        self.traffic.record(sig, self.size());
        Ok(out)
    }

    /// All-gather `local.len()` words per rank, inside a collective.
    fn gather_words(
        &self,
        st: &mut DeviceState,
        local: &[u64],
        sig: &CallSignature,
    ) -> Result<Vec<u64>, CommError> {
        let n = local.len();
        let mut out = vec![0u64; n * self.size()];
        if n == 0 {
            return Ok(out);
        }
        let recv_at = align(n * 8);
        let base = self.scratch(st, recv_at + n * 8 * self.size(), sig)?;
        self.h2d(st, base, local, sig)?;
        // SAFETY: send region [base, base + 8n) and receive region [base + recv_at, +8n*size)
        // lie inside the scratch buffer and do not overlap.
        let rc = unsafe {
            (self.nccl().all_gather)(
                base as *const c_void,
                (base + recv_at as u64) as *mut c_void,
                n,
                NCCL_UINT64,
                self.comm.0,
                st.stream.cu_stream() as lib::Stream,
            )
        };
        self.check_nccl(st, rc, sig, "ncclAllGather")?;
        self.wait(st, sig)?;
        self.d2h(st, &mut out, base + recv_at as u64, sig)?;
        Ok(out)
    }

    /// One 6-word all-reduce (max of the signature and of its complement, i.e. max and min);
    /// on disagreement, an all-gather of every rank's signature to name each rank's call.
    fn check_signature(&self, st: &mut DeviceState, sig: &CallSignature) -> Result<(), CommError> {
        let w = sig.encode();
        let mut words = [w[0], w[1], w[2], !w[0], !w[1], !w[2]];
        let base = self.scratch(st, 48, sig)?;
        self.h2d(st, base, &words, sig)?;
        // SAFETY: 6 words at `base`, in place.
        let rc = unsafe {
            (self.nccl().all_reduce)(
                base as *const c_void,
                base as *mut c_void,
                6,
                NCCL_UINT64,
                NCCL_MAX,
                self.comm.0,
                st.stream.cu_stream() as lib::Stream,
            )
        };
        self.check_nccl(st, rc, sig, "ncclAllReduce (signature check)")?;
        self.wait(st, sig)?;
        self.d2h(st, &mut words, base, sig)?;
        if (0..3).all(|i| words[i] == !words[i + 3]) {
            return Ok(());
        }
        let all = self.gather_words(st, &w, sig)?;
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

    fn all_reduce_typed<T: NcclElement>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let sig = CallSignature::all_reduce(op, T::TYPE, buf.len());
        self.collective(sig, |st| {
            if buf.is_empty() {
                return Ok(());
            }
            let ptr = self.scratch(st, std::mem::size_of_val(buf), &sig)?;
            self.h2d(st, ptr, buf, &sig)?;
            // SAFETY: `buf.len()` elements of the datatype at `ptr`, reduced in place.
            let rc = unsafe {
                (self.nccl().all_reduce)(
                    ptr as *const c_void,
                    ptr as *mut c_void,
                    buf.len(),
                    T::DATATYPE,
                    nccl_op(op),
                    self.comm.0,
                    st.stream.cu_stream() as lib::Stream,
                )
            };
            self.check_nccl(st, rc, &sig, "ncclAllReduce")?;
            self.wait(st, &sig)?;
            self.d2h(st, buf, ptr, &sig)?;
            if op == ReduceOp::Mean {
                // Sum first, then divide, as the thread and MPI backends do.
                let n = self.size();
                for x in buf.iter_mut() {
                    *x = x.div_count(n);
                }
            }
            Ok(())
        })
    }

    fn broadcast_typed<T: NcclElement>(&self, buf: &mut [T], root: usize) -> Result<(), CommError> {
        let size = self.size();
        if root >= size {
            return Err(CommError::InvalidRoot { root, size });
        }
        let sig = CallSignature::broadcast(root, T::TYPE, buf.len());
        let me = self.rank;
        self.collective(sig, |st| {
            if buf.is_empty() {
                return Ok(());
            }
            let ptr = self.scratch(st, std::mem::size_of_val(buf), &sig)?;
            if me == root {
                self.h2d(st, ptr, buf, &sig)?;
            }
            // SAFETY: `buf.len()` elements at `ptr`, in place; `root` is a rank of the group.
            let rc = unsafe {
                (self.nccl().broadcast)(
                    ptr as *const c_void,
                    ptr as *mut c_void,
                    buf.len(),
                    T::DATATYPE,
                    root as c_int,
                    self.comm.0,
                    st.stream.cu_stream() as lib::Stream,
                )
            };
            self.check_nccl(st, rc, &sig, "ncclBroadcast")?;
            self.wait(st, &sig)?;
            if me != root {
                self.d2h(st, buf, ptr, &sig)?;
            }
            Ok(())
        })
    }

    /// Create this rank's communicator for a split: `ncclCommSplit` when the library has it
    /// (NCCL >= 2.18), otherwise the lowest rank of each color creates a unique id, every rank
    /// gathers the ids through this group, and the members of each color call
    /// `ncclCommInitRank`.
    fn split_comm(
        &self,
        st: &mut DeviceState,
        colors: &[u64],
        color: u64,
        sig: &CallSignature,
    ) -> Result<(Comm, usize), CommError> {
        let mut distinct = colors.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let index = distinct.binary_search(&color).unwrap_or_default();
        let members: Vec<usize> = (0..colors.len()).filter(|&r| colors[r] == color).collect();
        let new_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .unwrap_or_default();
        let mut new: ncclComm_t = std::ptr::null_mut();
        if let Some(split) = self.nccl().comm_split {
            // SAFETY: live parent communicator; NCCL writes the new handle; a null config means
            // the parent's settings.
            let rc = unsafe {
                split(
                    self.comm.0,
                    index as c_int,
                    self.rank as c_int,
                    &mut new,
                    std::ptr::null_mut(),
                )
            };
            self.check_nccl(st, rc, sig, "ncclCommSplit")?;
        } else {
            // Each rank sends 16 id words and a flag (1: no id, the leader failed). A leader that cannot
            // create an id still takes part in the gather, so every rank stays in step, and
            // every member of its color gets the error.
            let leader = members[0];
            let mut mine = [0u64; 17];
            let mut own_error = None;
            if self.rank == leader {
                match unique_id(self.nccl()) {
                    Ok(id) => {
                        mine[..16].copy_from_slice(&id_to_words(&id));
                    }
                    Err(e) => own_error = Some(e),
                }
            }
            mine[16] = own_error.is_some() as u64;
            let ids = self.gather_words(st, &mine, sig)?;
            if let Some(e) = own_error {
                return Err(e);
            }
            let theirs = &ids[leader * 17..leader * 17 + 17];
            if theirs[16] != 0 {
                return Err(CommError::Backend {
                    backend: "nccl",
                    message: format!(
                        "{sig}: rank {} (world rank {}) could not create the NCCL id for this \
                         rank's subgroup (see its error)",
                        leader, self.world_ranks[leader]
                    ),
                });
            }
            let words: [u64; 16] = theirs[..16].try_into().unwrap_or([0; 16]);
            let id = words_to_id(&words);
            // SAFETY: NCCL writes the new handle; every member passes the same id and size.
            let rc = unsafe {
                (self.nccl().comm_init_rank)(
                    &mut new,
                    members.len() as c_int,
                    id,
                    new_rank as c_int,
                )
            };
            self.check_nccl(st, rc, sig, "ncclCommInitRank (subgroup)")?;
        }
        if new.is_null() {
            return Err(self.fail(
                st,
                sig,
                "creating the subgroup",
                "NCCL returned no communicator".into(),
            ));
        }
        Ok((Comm(new), new_rank))
    }
}

/// A fresh NCCL unique id.
pub(crate) fn unique_id(nccl: &Nccl) -> Result<ncclUniqueId, CommError> {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    let rc = unsafe { (nccl.get_unique_id)(&mut id) };
    if rc != NCCL_SUCCESS {
        return Err(CommError::Backend {
            backend: "nccl",
            message: format!(
                "ncclGetUniqueId failed: {} (NCCL could not open its bootstrap socket; set \
                 NCCL_SOCKET_IFNAME to a working network interface)",
                nccl.describe(rc, None)
            ),
        });
    }
    Ok(id)
}

/// The 128 id bytes as 16 little-endian words (for an all-gather).
pub(crate) fn id_to_words(id: &ncclUniqueId) -> [u64; 16] {
    let bytes = id_to_bytes(id);
    let mut w = [0u64; 16];
    for (i, c) in bytes.chunks_exact(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        w[i] = u64::from_le_bytes(b);
    }
    w
}

/// Inverse of [`id_to_words`].
pub(crate) fn words_to_id(words: &[u64; 16]) -> ncclUniqueId {
    let mut bytes = [0u8; 128];
    for (i, w) in words.iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    bytes_to_id(&bytes)
}

pub(crate) fn id_to_bytes(id: &ncclUniqueId) -> [u8; 128] {
    id.internal.map(|c| c as u8)
}

pub(crate) fn bytes_to_id(bytes: &[u8; 128]) -> ncclUniqueId {
    ncclUniqueId {
        internal: bytes.map(|b| b as std::ffi::c_char),
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let nccl = self.runtime.nccl;
        let ctx = &self.runtime.ctx;
        let comm = self.comm;
        let aborted = st.aborted.is_some();
        let scratch = std::mem::take(&mut st.scratch);
        let world_ranks = self.world_ranks.clone();
        let timeout = self.config.timeout;
        let watchdog = &self.runtime.watchdog;
        // Destroying (or aborting) a communicator can wait for its peers: watched throughout.
        let _watch = watchdog.watch(
            What::Named(if aborted {
                "releasing an aborted NCCL group".into()
            } else {
                "ncclCommDestroy".into()
            }),
            &world_ranks,
            watchdog::limit(timeout),
        );
        let _ = lib::no_panic("dropping an NCCL group", || {
            // A stored error from an earlier cudarc clean-up must not stop this one.
            let _ = ctx.check_err();
            if ctx.bind_to_thread().is_err() {
                // Without the context the buffer cannot be freed; the communicator is still
                // released (NCCL selects its device itself), by abort: no collective here.
                if !aborted {
                    // SAFETY: a live communicator of this process, never used again.
                    let _ = unsafe { (nccl.comm_abort)(comm.0) };
                }
                return Ok(());
            }
            if scratch != 0 {
                // SAFETY: allocated by this group; no collective is running (we own `self`).
                let _ = unsafe { cu::free_sync(scratch) };
            }
            if !aborted {
                // SAFETY: a live communicator of this process, never used again.
                let rc = unsafe { (nccl.comm_destroy)(comm.0) };
                if rc != NCCL_SUCCESS {
                    tracing::warn!("ncclCommDestroy failed: {}", nccl.describe(rc, None));
                }
            }
            Ok(())
        });
    }
}

impl ProcessGroup for NcclGroup {
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
        "nccl"
    }

    fn all_reduce(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<(), CommError> {
        with_typed_slice!(buf, b => self.all_reduce_typed(b, op))
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), CommError> {
        with_typed_slice!(buf, b => self.broadcast_typed(b, root))
    }

    /// A one-element all-reduce, then a wait for the stream.
    fn barrier(&self) -> Result<(), CommError> {
        let sig = CallSignature::barrier();
        self.collective(sig, |st| {
            let ptr = self.scratch(st, 4, &sig)?;
            // SAFETY: one f32 at `ptr` (its value does not matter), in place.
            let rc = unsafe {
                (self.nccl().all_reduce)(
                    ptr as *const c_void,
                    ptr as *mut c_void,
                    1,
                    NCCL_FLOAT32,
                    NCCL_SUM,
                    self.comm.0,
                    st.stream.cu_stream() as lib::Stream,
                )
            };
            self.check_nccl(st, rc, &sig, "ncclAllReduce (barrier)")?;
            self.wait(st, &sig)
        })
    }

    /// `ncclAllGather` of `u64` words through the copy buffer.
    fn all_gather_u64(&self, local: &[u64]) -> Result<Vec<u64>, CommError> {
        let sig = CallSignature::all_gather(local.len());
        self.collective(sig, |st| self.gather_words(st, local, &sig))
    }

    /// `ncclAllGather` of `ncclUint8` through the copy buffer: `local` and the gathered bytes
    /// side by side on the device, one copy in, one copy of all `size * local.len()` out.
    fn all_gather_bytes(&self, local: &[u8], out: &mut [u8]) -> Result<(), CommError> {
        let len = local.len();
        let sig = CallSignature::all_gather_bytes(len);
        validate_gather_output(&sig, self.size(), len, out.len())?;
        self.collective(sig, |st| {
            if len == 0 {
                return Ok(());
            }
            let recv_at = align(len);
            let base = self.scratch(st, recv_at + out.len(), &sig)?;
            self.h2d(st, base, local, &sig)?;
            // SAFETY: send region [base, base + len) and receive region [base + recv_at,
            // + len * size) lie inside the scratch buffer and do not overlap.
            let rc = unsafe {
                (self.nccl().all_gather)(
                    base as *const c_void,
                    (base + recv_at as u64) as *mut c_void,
                    len,
                    NCCL_UINT8,
                    self.comm.0,
                    st.stream.cu_stream() as lib::Stream,
                )
            };
            self.check_nccl(st, rc, &sig, "ncclAllGather")?;
            self.wait(st, &sig)?;
            self.d2h(st, out, base + recv_at as u64, &sig)
        })
    }

    /// An all-gather of the colors, then `ncclCommSplit` (or, before NCCL 2.18, fresh unique
    /// ids distributed through this group and `ncclCommInitRank`).
    fn split(&self, color: u64) -> Result<Group, CommError> {
        self.split_into(color, self.traffic.child())
    }

    /// A split with one color: a second communicator over the same ranks, with its own stream
    /// and copy buffer, so a helper thread can drive it while this group keeps working.
    fn dedicated(&self) -> Result<Group, CommError> {
        self.split_into(0, TrafficChain::root())
    }

    fn charge(&self, sig: &CallSignature) {
        self.traffic.record(sig, self.size());
    }

    fn host_id(&self) -> u64 {
        self.runtime.host_id
    }

    fn traffic(&self) -> Traffic {
        self.traffic.snapshot()
    }
}

impl NcclGroup {
    /// `split`, with the new group charging `traffic`.
    fn split_into(&self, color: u64, traffic: TrafficChain) -> Result<Group, CommError> {
        let sig = CallSignature::split();
        self.collective(sig, |st| {
            let colors = self.gather_words(st, &[color], &sig)?;
            let (comm, new_rank) = self.split_comm(st, &colors, color, &sig)?;
            let members: Vec<usize> = (0..colors.len())
                .filter(|&r| colors[r] == color)
                .map(|r| self.world_ranks[r])
                .collect();
            let group = NcclGroup::new(
                self.runtime.clone(),
                comm,
                new_rank,
                members,
                traffic,
                self.config.clone(),
            )?;
            let group: Group = Arc::new(group);
            Ok(group)
        })
    }
}
