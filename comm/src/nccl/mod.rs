//! The NCCL backend (cargo feature `nccl`): one process per GPU rank, the same
//! [`ProcessGroup`] contract as the thread and MPI backends.
//!
//! Nothing CUDA is needed to build it: the CUDA driver (`libcuda.so.1`, through cudarc) and
//! NCCL (`libnccl.so.2`, or the file named by [`NCCL_LIB_ENV`]) are loaded when a world is
//! created. Without them, or without a GPU, the constructors return a [`CommError::Backend`]
//! that says what is missing; they never panic.
//!
//! # Starting a world
//!
//! - [`NcclWorld::init_tcp`]: rank, world size and rank 0's `host:port`; rank 0 listens there
//!   and hands the NCCL unique id to the others (see [`rendezvous`]), like torch's
//!   `MASTER_ADDR`/`MASTER_PORT`.
//! - [`NcclWorld::init_from_env`]: the same, from `LOCALSGD_RANK`, `LOCALSGD_WORLD_SIZE`,
//!   `LOCALSGD_MASTER_ADDR`, `LOCALSGD_MASTER_PORT`, and the device from
//!   `LOCALSGD_LOCAL_RANK`; each variable falls back to torch's name (`RANK`, `WORLD_SIZE`,
//!   `MASTER_ADDR`, `MASTER_PORT`, `LOCAL_RANK`) when the `LOCALSGD_` one is unset. Without a
//!   local rank, the device is this rank's index among the ranks on its host (from the host
//!   names exchanged at the rendezvous), modulo the number of GPUs.
//! - [`NcclWorld::init_with_group`]: the id travels through an existing [`Group`] (for example
//!   the MPI world: `mpirun -np 4 prog`, then `init_with_group(&mpi_world, local_gpu, config)`).
//!
//! NCCL allows one rank per GPU in a communicator: two ranks on one device fail at creation
//! ("Duplicate GPU detected").
//!
//! # Cost: the collectives work on host memory
//!
//! The [`ProcessGroup`] contract hands collectives host slices (`&mut [f32]`, ...). Every
//! collective therefore copies the buffer to the GPU, runs NCCL there and copies the result
//! back: two PCIe transfers of the whole buffer (roughly 2 x bytes / 10-25 GB/s for pageable
//! memory) on top of the NCCL time, plus a few tens of microseconds of fixed cost. For
//! models trained on the CPU (the burn `flex` device) this is the price of using GPU
//! interconnects (NVLink, InfiniBand with GPUDirect); it is not the zero-copy path a model
//! whose tensors already live on the GPU would use. Each group keeps one device buffer (the
//! largest size it has seen, never shrunk) so nothing is allocated per call.
//!
//! # Semantics
//!
//! - Sum, max and min are NCCL's (`ncclSum`, `ncclMax`, `ncclMin`) on the buffer's own type
//!   (`f16` as `ncclFloat16`, `bf16` as `ncclBfloat16`). A mean is a sum followed by a division
//!   on each rank, exactly as the thread and MPI backends do. NCCL's summation order is its own
//!   (ring or tree), so float sums may differ in the last bits from the thread backend's
//!   rank-order sum; every rank gets the same result. NaN handling of max/min is NCCL's.
//! - [`split`](ProcessGroup::split) gathers the colors and calls `ncclCommSplit` (NCCL >= 2.18;
//!   older NCCL: fresh unique ids sent through the parent group and `ncclCommInitRank`).
//!   [`intra_node`](ProcessGroup::intra_node) is the default split by
//!   [`host_id`](ProcessGroup::host_id), an FNV-1a hash of the host name.
//! - Traffic counters count each collective's payload like the other backends, subgroups
//!   charging their parents; signature-check words and split bookkeeping are not counted.
//! - Mismatch detection is opt-in ([`NcclConfig::with_signature_check`]): one extra 48-byte
//!   all-reduce (plus its two small copies and a stream wait, some tens of microseconds) before
//!   each collective, and on disagreement an all-gather of every rank's signature, so every
//!   rank returns the same [`CommError::Mismatch`]. Without it, mismatched collectives are
//!   undefined in NCCL: wrong results, an error, or a hang (then the timeout below).
//!
//! # Timeouts and failures: what is covered
//!
//! - A collective whose GPU work does not finish within the group timeout (a peer died or
//!   never called it): the group aborts its communicator (`ncclCommAbort`) and returns
//!   [`CommError::Timeout`] (NCCL cannot tell which peer is missing, so every other rank is
//!   listed). NCCL's asynchronous errors (a peer's connection dropped) end the wait early with
//!   a [`CommError::Backend`]. The aborted group then refuses every later call: NCCL
//!   communicators cannot be repaired; start a new world.
//! - Calls that block the thread inside NCCL (communicator creation, splits, sometimes the
//!   first collective while connections are set up): a watchdog thread ends the process with
//!   exit code [`WATCHDOG_EXIT_CODE`] after the timeout plus [`WATCHDOG_GRACE`], printing what
//!   was stuck. The rendezvous has its own timeout and returns an error.
//! - Not covered: a GPU that hangs outside NCCL, and a peer that dies after the last
//!   collective (nothing waits for it).

mod group;
pub mod library;
pub mod rendezvous;
#[doc(hidden)]
pub mod stand_in;
mod watchdog;

pub use group::NcclGroup;
pub use library::{NCCL_LIB_ENV, try_load_nccl};
pub use rendezvous::{RendezvousOutcome, TcpRendezvous};
pub use watchdog::{WATCHDOG_EXIT_CODE, WATCHDOG_GRACE};

use crate::error::CommError;
use crate::group::Group;
#[cfg(doc)]
use crate::group::ProcessGroup;
use crate::traffic::TrafficChain;
use crate::watchdog::{Watchdog, What};
use cudarc::driver::CudaContext;
use group::Comm;
use library::Nccl;
use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

/// Default collective timeout of NCCL groups (same as the thread backend's).
pub const DEFAULT_TIMEOUT: Duration = crate::thread::DEFAULT_TIMEOUT;

/// Settings of the NCCL groups of a world (subgroups inherit them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclConfig {
    timeout: Duration,
    rendezvous_timeout: Duration,
    signature_check: bool,
}

impl Default for NcclConfig {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            rendezvous_timeout: DEFAULT_TIMEOUT,
            signature_check: false,
        }
    }
}

impl NcclConfig {
    /// How long one collective may take before the communicator is aborted (must be positive).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long the TCP rendezvous waits for all ranks (must be positive).
    pub fn with_rendezvous_timeout(mut self, timeout: Duration) -> Self {
        self.rendezvous_timeout = timeout;
        self
    }

    /// Compare every collective's signature across the group before running it (one extra
    /// 48-byte all-reduce per collective).
    pub fn with_signature_check(mut self, on: bool) -> Self {
        self.signature_check = on;
        self
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The rendezvous timeout.
    pub fn rendezvous_timeout(&self) -> Duration {
        self.rendezvous_timeout
    }

    /// Whether signature checks are on.
    pub fn signature_check(&self) -> bool {
        self.signature_check
    }

    fn validate(&self) -> Result<(), CommError> {
        if self.timeout.is_zero() {
            return Err(CommError::InvalidConfig(
                "the NCCL collective timeout must be positive (got 0s)".into(),
            ));
        }
        if self.rendezvous_timeout.is_zero() {
            return Err(CommError::InvalidConfig(
                "the NCCL rendezvous timeout must be positive (got 0s)".into(),
            ));
        }
        Ok(())
    }
}

/// State shared by every group of one world on this process.
#[derive(Debug)]
pub(crate) struct Runtime {
    nccl: &'static Nccl,
    ctx: Arc<CudaContext>,
    watchdog: Watchdog,
    host_id: u64,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("version", &self.version_string())
            .finish()
    }
}

/// Which GPU a rank uses.
#[derive(Debug, Clone, Copy)]
enum DeviceChoice {
    Ordinal(usize),
    /// This rank's index among the ranks of its host, modulo the number of GPUs.
    LocalRank,
}

/// Facts about this process's NCCL world. The groups stay usable when it is dropped.
#[derive(Debug, Clone)]
pub struct NcclWorld {
    rank: usize,
    size: usize,
    device: usize,
    device_name: String,
    nccl_version: String,
    nccl_path: String,
    host_ids: Vec<u64>,
    hosts: Option<Vec<String>>,
}

/// What [`NcclWorld::probe`] finds on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclProbe {
    /// Number of CUDA devices.
    pub devices: usize,
    /// NCCL version ("2.21.5").
    pub nccl_version: String,
    /// The NCCL library file that was loaded.
    pub nccl_path: String,
}

impl NcclWorld {
    /// Check that the CUDA driver, at least one GPU and NCCL are available, without creating
    /// anything. The error says what is missing.
    pub fn probe() -> Result<NcclProbe, CommError> {
        library::probe_cuda_driver()?;
        let devices = library::no_panic("counting CUDA devices", || {
            CudaContext::device_count().map_err(|e| CommError::Backend {
                backend: "nccl",
                message: format!(
                    "CUDA driver initialisation failed: {} (no usable GPU?)",
                    library::cuda_error(&e)
                ),
            })
        })?;
        if devices <= 0 {
            return Err(CommError::Backend {
                backend: "nccl",
                message: "the CUDA driver reports no GPU on this machine".into(),
            });
        }
        let nccl = library::nccl()?;
        Ok(NcclProbe {
            devices: devices as usize,
            nccl_version: nccl.version_string(),
            nccl_path: nccl.path.clone(),
        })
    }

    /// Join a world of `size` ranks as `rank`, meeting at rank 0's `addr` (`host:port`), and
    /// use GPU `device_ordinal`. Returns the world facts and the world group.
    pub fn init_tcp(
        rank: usize,
        size: usize,
        addr: &str,
        device_ordinal: usize,
        config: NcclConfig,
    ) -> Result<(NcclWorld, Group), CommError> {
        Self::init_tcp_inner(
            rank,
            size,
            addr,
            DeviceChoice::Ordinal(device_ordinal),
            config,
        )
    }

    /// [`init_tcp`](NcclWorld::init_tcp) with everything read from the environment (see the
    /// [module docs](self)): `LOCALSGD_RANK`/`RANK`, `LOCALSGD_WORLD_SIZE`/`WORLD_SIZE`,
    /// `LOCALSGD_MASTER_ADDR`/`MASTER_ADDR`, `LOCALSGD_MASTER_PORT`/`MASTER_PORT`, and
    /// optionally `LOCALSGD_LOCAL_RANK`/`LOCAL_RANK` for the device.
    pub fn init_from_env(config: NcclConfig) -> Result<(NcclWorld, Group), CommError> {
        let rank: usize = env_number("RANK")?;
        let size: usize = env_number("WORLD_SIZE")?;
        let addr = env_var("MASTER_ADDR").ok_or_else(|| missing_env("MASTER_ADDR"))?;
        let port: u16 = env_number("MASTER_PORT")?;
        let device = match env_var("LOCAL_RANK") {
            Some(_) => DeviceChoice::Ordinal(env_number("LOCAL_RANK")?),
            None => DeviceChoice::LocalRank,
        };
        let addr = if addr.contains(':') && !addr.starts_with('[') {
            format!("[{addr}]:{port}")
        } else {
            format!("{addr}:{port}")
        };
        Self::init_tcp_inner(rank, size, &addr, device, config)
    }

    /// Create the NCCL world over the ranks of `bootstrap` (any backend, e.g. the MPI world):
    /// rank 0 of `bootstrap` creates the unique id and every rank receives it through one
    /// [`all_gather_u64`](ProcessGroup::all_gather_u64) of 18 words per rank (16 id words, a
    /// host id, and a flag saying whether this rank could load CUDA and NCCL).
    /// Collective over `bootstrap`. The NCCL world's ranks are `bootstrap`'s ranks.
    pub fn init_with_group(
        bootstrap: &Group,
        device_ordinal: usize,
        config: NcclConfig,
    ) -> Result<(NcclWorld, Group), CommError> {
        config.validate()?;
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        // Fail on every rank alike when a library is missing: the gather below carries a flag.
        let ready = library::probe_cuda_driver().and_then(|_| library::nccl().map(|_| ()));
        let host = hostname();
        let mut mine = [0u64; 18];
        mine[16] = host_hash(&host);
        let mut local_error = None;
        match &ready {
            Ok(()) if rank == 0 => match library::nccl().and_then(group::unique_id) {
                Ok(id) => mine[..16].copy_from_slice(&group::id_to_words(&id)),
                Err(e) => local_error = Some(e),
            },
            Ok(()) => {}
            Err(e) => local_error = Some(e.clone()),
        }
        mine[17] = local_error.is_some() as u64;
        let all = bootstrap.all_gather_u64(&mine)?;
        if let Some(e) = local_error {
            return Err(e);
        }
        let failed: Vec<usize> = (0..size).filter(|&r| all[r * 18 + 17] != 0).collect();
        if !failed.is_empty() {
            return Err(CommError::Backend {
                backend: "nccl",
                message: format!(
                    "NCCL world creation over {} group: rank(s) {failed:?} could not load \
                     CUDA/NCCL (see their error)",
                    bootstrap.backend()
                ),
            });
        }
        let words: [u64; 16] = all[..16].try_into().unwrap_or([0; 16]);
        let id = group::words_to_id(&words);
        let host_ids: Vec<u64> = (0..size).map(|r| all[r * 18 + 16]).collect();
        Self::create(
            rank,
            size,
            id,
            host,
            host_ids,
            None,
            DeviceChoice::Ordinal(device_ordinal),
            config,
        )
    }

    fn init_tcp_inner(
        rank: usize,
        size: usize,
        addr: &str,
        device: DeviceChoice,
        config: NcclConfig,
    ) -> Result<(NcclWorld, Group), CommError> {
        config.validate()?;
        if size == 0 || rank >= size {
            return Err(CommError::InvalidConfig(format!(
                "rank {rank} is not valid for a world of {size} rank(s) (valid ranks: 0..{size})"
            )));
        }
        rendezvous::split_host_port(addr)?;
        library::probe_cuda_driver()?;
        let nccl = library::nccl()?;
        let host = hostname();
        let meeting = TcpRendezvous {
            rank,
            size,
            addr: addr.to_string(),
            timeout: config.rendezvous_timeout,
        };
        let outcome = meeting.run(&host, || {
            group::unique_id(nccl).map(|id| group::id_to_bytes(&id))
        })?;
        let host_ids = outcome.hosts.iter().map(|h| host_hash(h)).collect();
        let id = group::bytes_to_id(&outcome.id);
        Self::create(
            rank,
            size,
            id,
            host,
            host_ids,
            Some(outcome.hosts),
            device,
            config,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        rank: usize,
        size: usize,
        id: cudarc::nccl::sys::ncclUniqueId,
        host: String,
        host_ids: Vec<u64>,
        hosts: Option<Vec<String>>,
        device: DeviceChoice,
        config: NcclConfig,
    ) -> Result<(NcclWorld, Group), CommError> {
        let nccl = library::nccl()?;
        let probe = Self::probe()?;
        let local_rank = (0..rank).filter(|&r| host_ids[r] == host_ids[rank]).count();
        let device = match device {
            DeviceChoice::Ordinal(d) => d,
            DeviceChoice::LocalRank => local_rank % probe.devices,
        };
        if device >= probe.devices {
            return Err(CommError::InvalidConfig(format!(
                "GPU {device} does not exist: this machine has {} GPU(s) (valid ordinals: 0..{})",
                probe.devices, probe.devices
            )));
        }
        let ctx = library::no_panic("creating the CUDA context", || {
            CudaContext::new(device).map_err(|e| CommError::Backend {
                backend: "nccl",
                message: format!(
                    "creating a CUDA context on GPU {device} failed: {}",
                    library::cuda_error(&e)
                ),
            })
        })?;
        let device_name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let watchdog = watchdog::start(rank, host.clone()).map_err(|e| CommError::Backend {
            backend: "nccl",
            message: format!("could not start the watchdog thread: {e}"),
        })?;
        let runtime = Arc::new(Runtime {
            nccl,
            ctx,
            watchdog,
            host_id: host_hash(&host),
        });
        let world_ranks: Arc<[usize]> = (0..size).collect();
        let comm = library::no_panic("ncclCommInitRank", || {
            runtime
                .ctx
                .bind_to_thread()
                .map_err(|e| CommError::Backend {
                    backend: "nccl",
                    message: format!("binding GPU {device}: {}", library::cuda_error(&e)),
                })?;
            let _watch = runtime.watchdog.watch(
                What::Named(format!(
                    "ncclCommInitRank (rank {rank} of {size}, GPU {device})"
                )),
                &world_ranks,
                watchdog::limit(config.timeout),
            );
            let mut comm: cudarc::nccl::sys::ncclComm_t = std::ptr::null_mut();
            // SAFETY: NCCL writes the handle; every rank passes the same id and size.
            let rc = unsafe { (nccl.comm_init_rank)(&mut comm, size as c_int, id, rank as c_int) };
            if rc == library::NCCL_IN_PROGRESS {
                if !comm.is_null() {
                    // SAFETY: the half-made communicator of this process, never used again.
                    unsafe { (nccl.comm_abort)(comm) };
                }
                return Err(CommError::Backend {
                    backend: "nccl",
                    message: format!(
                        "ncclCommInitRank (rank {rank} of {size}) returned \"in progress\": \
                         NCCL_COMM_BLOCKING=0 (in the environment{}, or in nccl.conf) makes \
                         communicators non-blocking, which this backend does not support; \
                         unset it or set it to 1",
                        std::env::var("NCCL_COMM_BLOCKING")
                            .map_or_else(|_| String::new(), |v| format!(": it is {v:?}"))
                    ),
                });
            }
            if rc != library::NCCL_SUCCESS || comm.is_null() {
                return Err(CommError::Backend {
                    backend: "nccl",
                    message: format!(
                        "ncclCommInitRank (rank {rank} of {size}, GPU {device} \"{device_name}\", \
                         NCCL {}) failed: {}. If NCCL reports a duplicate GPU, two ranks use \
                         the same device: give each rank its own GPU",
                        nccl.version_string(),
                        nccl.describe(rc, None)
                    ),
                });
            }
            Ok(Comm(comm))
        })?;
        let group = NcclGroup::new(
            runtime,
            comm,
            rank,
            (0..size).collect(),
            TrafficChain::root(),
            config,
        )?;
        let world = NcclWorld {
            rank,
            size,
            device,
            device_name,
            nccl_version: nccl.version_string(),
            nccl_path: nccl.path.clone(),
            host_ids,
            hosts,
        };
        Ok((world, Arc::new(group)))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The GPU ordinal this rank uses.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The GPU's name as CUDA reports it.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The NCCL version loaded ("2.21.5").
    pub fn nccl_version(&self) -> &str {
        &self.nccl_version
    }

    /// The NCCL library file loaded.
    pub fn nccl_path(&self) -> &str {
        &self.nccl_path
    }

    /// Host id of every rank (FNV-1a of its host name), by rank.
    pub fn host_ids(&self) -> &[u64] {
        &self.host_ids
    }

    /// Host name of every rank, by rank (known after a TCP rendezvous; `None` after
    /// [`init_with_group`](NcclWorld::init_with_group)).
    pub fn hosts(&self) -> Option<&[String]> {
        self.hosts.as_deref()
    }
}

/// `LOCALSGD_<name>`, else `<name>` (torch's variable).
fn env_var(name: &str) -> Option<String> {
    std::env::var(format!("LOCALSGD_{name}"))
        .ok()
        .or_else(|| std::env::var(name).ok())
        .filter(|v| !v.trim().is_empty())
}

fn missing_env(name: &str) -> CommError {
    CommError::InvalidConfig(format!(
        "environment variable LOCALSGD_{name} (or {name}) is not set; NcclWorld::init_from_env \
         needs LOCALSGD_RANK, LOCALSGD_WORLD_SIZE, LOCALSGD_MASTER_ADDR and LOCALSGD_MASTER_PORT \
         (or torch's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
    ))
}

fn env_number<T: std::str::FromStr>(name: &str) -> Result<T, CommError> {
    let v = env_var(name).ok_or_else(|| missing_env(name))?;
    v.trim().parse().map_err(|_| {
        CommError::InvalidConfig(format!(
            "environment variable LOCALSGD_{name} (or {name}) = {v:?} is not a valid number"
        ))
    })
}

/// This machine's host name (`/proc/sys/kernel/hostname`, then `/etc/hostname`, then
/// `$HOSTNAME`, else "localhost").
pub fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

/// A stable 64-bit hash (FNV-1a) of a host name: equal names give equal ids on every rank.
pub fn host_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
