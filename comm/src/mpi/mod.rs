//! The MPI backend (cargo feature `mpi`): one process per rank, launched by `mpirun`.
//!
//! [`MpiWorld::init`] initialises MPI once per process and returns the world [`Group`]; keep
//! the [`MpiWorld`] alive for as long as any group is used (dropping it finalises MPI).
//!
//! - All-reduce runs in place (`MPI_IN_PLACE`, no copy of the buffer). `f16`/`bf16` travel as
//!   16-bit words and are reduced by user-defined operations with IEEE half rounding per
//!   addition (no conversion copy); see the `ops` module notes. A mean is a sum followed by a
//!   division on each rank, as in the thread backend.
//! - [`all_gather_bytes`](ProcessGroup::all_gather_bytes) is `MPI_Allgather` of `MPI_UINT8_T`
//!   straight into the caller's buffer: one call up to `i32::MAX` bytes per rank, pieces (a
//!   strided receive datatype) beyond, and on a dedicated communicator polled
//!   `MPI_Iallgather` pieces like its all-reduce's.
//! - [`all_to_all_bytes`](ProcessGroup::all_to_all_bytes) is `MPI_Alltoall` of `MPI_UINT8_T`
//!   (one block per rank) straight between the caller's buffers, cut the same way: one call up
//!   to `i32::MAX` bytes per block, pieces (strided send and receive datatypes) beyond, polled
//!   `MPI_Ialltoall` pieces on a dedicated communicator.
//! - Subgroups: [`split`](ProcessGroup::split) is `MPI_Comm_split`, blocks
//!   ([`new_subgroups`](ProcessGroup::new_subgroups)) are a split by `rank / size`, and
//!   [`intra_node`](ProcessGroup::intra_node) is `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`;
//!   [`host_id`](ProcessGroup::host_id) is a hash of `MPI_Get_processor_name`.
//! - No hang: a watchdog thread aborts the whole job (`MPI_Abort`, exit code
//!   [`WATCHDOG_EXIT_CODE`]) when a collective exceeds the group timeout, after printing the
//!   collective, the group and this rank to stderr. A rank that is killed is normally noticed
//!   sooner by `mpirun` itself, which then terminates the others.
//! - Mismatch detection is opt-in ([`MpiConfig::with_signature_check`]): before each
//!   collective, one extra all-reduce of 6 `u64` words (48 bytes: the max of the 3-word call
//!   signature and of its complement, i.e. max and min); only when they differ, an all-gather of
//!   every rank's 3 words to build the same [`CommError::Mismatch`] as the thread backend. That
//!   costs one small-message latency per collective (a few microseconds in shared memory, tens
//!   over TCP). Without the check, mismatched collectives are undefined behaviour in MPI: they
//!   hang (the watchdog then aborts the job), fail with an MPI error, or give wrong results.
//! - The connections between ranks open in [`MpiWorld::init`], not at first use, so none opens
//!   while two threads of a rank are inside MPI ([`MpiConfig::with_preconnect`]).
//! - Traffic counters count the payload of each collective like the thread backend; the
//!   signature-check words are not counted.
//! - Open MPI's non-blocking all-reduce (used by [dedicated](ProcessGroup::dedicated)
//!   communicators) is set to Rabenseifner's algorithm at start-up unless the user chose one;
//!   see [`MpiWorld::iallreduce_algorithm`] and [`IallreduceAlgorithm`].
//!
//! ```no_run
//! use localsgd_comm::mpi::{MpiConfig, MpiWorld};
//! use localsgd_comm::{GroupExt, ProcessGroup};
//! use std::time::Duration;
//!
//! // Run with `mpirun -np 4 my-program`.
//! let config = MpiConfig::default()
//!     .with_timeout(Duration::from_secs(60))
//!     .with_signature_check(true);
//! let (_world, group) = MpiWorld::init_with(config)?;
//! let mut v = vec![group.rank() as f32; 4];
//! group.average_slice(&mut v)?;
//! let node = group.intra_node()?; // the ranks on this machine
//! # Ok::<(), localsgd_comm::CommError>(())
//! ```

mod ffi;
mod group;
mod ops;
mod spawn;
mod tuning;
mod ulfm;
mod watchdog;

pub use group::MpiGroup;
pub use tuning::{IALLREDUCE_ALGORITHM_VAR, IallreduceAlgorithm, RABENSEIFNER};
pub use ulfm::FT_ENABLE_VAR;
pub use watchdog::WATCHDOG_EXIT_CODE;

use crate::error::CommError;
use crate::group::Group;
#[cfg(doc)]
use crate::group::ProcessGroup;
use crate::watchdog::{Watchdog, What};
use ffi::Comm;
use mpi::environment::{Threading, Universe};
use ops::UserOps;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Default collective timeout of MPI groups (same as the thread backend's).
pub const DEFAULT_TIMEOUT: Duration = crate::thread::DEFAULT_TIMEOUT;

/// Settings of the MPI groups of a process (subgroups inherit them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiConfig {
    timeout: Duration,
    signature_check: bool,
    tcp_links: Option<u32>,
    preconnect: bool,
}

/// TCP connections per pair of ranks that [`MpiConfig::default`] asks Open MPI for
/// (`btl_tcp_links`); see [`MpiConfig::with_tcp_links`].
pub const DEFAULT_TCP_LINKS: u32 = 2;

/// The environment variable through which Open MPI reads `btl_tcp_links` at `MPI_Init`.
pub const TCP_LINKS_VAR: &str = "OMPI_MCA_btl_tcp_links";

impl Default for MpiConfig {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            signature_check: false,
            tcp_links: Some(DEFAULT_TCP_LINKS),
            preconnect: true,
        }
    }
}

impl MpiConfig {
    /// How long one collective may take before the watchdog aborts the job (must be positive).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Compare every collective's signature across the group before running it (one extra
    /// 48-byte all-reduce per collective); mismatches then return [`CommError::Mismatch`] on
    /// every rank instead of hanging or corrupting results.
    pub fn with_signature_check(mut self, on: bool) -> Self {
        self.signature_check = on;
        self
    }

    /// TCP connections Open MPI opens between two ranks on different hosts (its
    /// `btl_tcp_links`; default [`DEFAULT_TCP_LINKS`]; `None`: leave Open MPI's own default, 1).
    ///
    /// With one connection per pair, Open MPI's TCP transport uses only part of a shaped link in
    /// an all-reduce, where both directions carry data at once, while a plain TCP stream gets
    /// the full rate both ways; two connections let it use the link fully
    /// (`bench/results/2026-12-03-mpi-two-connections/`).
    ///
    /// Applied by [`MpiWorld::init_with`] before `MPI_Init`, through the environment variable
    /// [`TCP_LINKS_VAR`], and only when that variable is not set already: a user's
    /// `mpirun --mca btl_tcp_links N` (which `mpirun` passes on in that variable) or
    /// `OMPI_MCA_btl_tcp_links` wins. Other MPI libraries ignore it. Must be at least 1.
    pub fn with_tcp_links(mut self, links: Option<u32>) -> Self {
        self.tcp_links = links;
        self
    }

    /// TCP connections per pair of ranks asked of Open MPI (`None`: its default).
    pub fn tcp_links(&self) -> Option<u32> {
        self.tcp_links
    }

    /// Open the connections between every pair of ranks in [`MpiWorld::init_with`], before it
    /// returns (default on): each rank exchanges empty messages (one per TCP link: the
    /// [`TCP_LINKS_VAR`] Open MPI read, else 1) with every other rank.
    ///
    /// Open MPI opens a TCP connection the first time two ranks exchange a message. Opened
    /// while two threads of a rank are inside MPI at once (a helper thread driving a
    /// [dedicated](ProcessGroup::dedicated) communicator's all-reduce, the training loop
    /// running a world collective), a connection can fail to come up: Open MPI 4.1.4 printed
    /// "Open MPI failed to TCP connect to a peer MPI process" and the job hung until the
    /// collective timeout, twice in a row in this project's CI (4 ranks on 2 network-namespace
    /// hosts, at the first non-blocking all-reduce). Opened here, every connection comes up
    /// while one thread alone is inside MPI, and a peer that never answers is ended by the
    /// collective timeout. On those hosts no connection was opened after start-up, and a shaped
    /// link carried the wide MLP's gradients as fast as without it.
    ///
    /// Cost: one round per other rank at start-up, and a connection to every rank on another
    /// host where Open MPI would open only those its collectives use (ranks on one host talk
    /// through shared memory). Off: connections open as they are first needed, Open MPI's
    /// default; consider it at several hundred ranks, where a process's file descriptor limit
    /// may not hold a connection to every other rank.
    pub fn with_preconnect(mut self, on: bool) -> Self {
        self.preconnect = on;
        self
    }

    /// Whether start-up opens every connection (see [`with_preconnect`](Self::with_preconnect)).
    pub fn preconnect(&self) -> bool {
        self.preconnect
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether signature checks are on.
    pub fn signature_check(&self) -> bool {
        self.signature_check
    }
}

/// Process-wide MPI state shared by every group of the process.
#[derive(Debug)]
pub(crate) struct Runtime {
    watchdog: Watchdog,
    ops: UserOps,
    /// This library's `MPI_IN_PLACE`, when known.
    in_place: Option<usize>,
    /// Serialises MPI calls when the library does not provide `MPI_THREAD_MULTIPLE`.
    serial: Option<Mutex<()>>,
    finalized: AtomicBool,
    host_id: u64,
    /// [`tuning::ranks_share_cores`], read once at start-up.
    shares_cores: bool,
    /// ULFM's functions, when the library has them and the launcher enabled them; otherwise
    /// whether the library has them (for the message of a refused shrink).
    ulfm: Result<ulfm::Ulfm, bool>,
    /// Every communicator of this process not yet freed (the world's included), with the epoch
    /// it was created in, which a failure of that epoch revokes so that no survivor stays
    /// blocked on one of them.
    comms: Mutex<Vec<(Comm, u64)>>,
    /// The current epoch: how many shrinks this process has been through. A group belongs to
    /// the epoch it was created in; a shrink's group starts the next one.
    epoch: AtomicU64,
    /// A duplicate of the last shrink's or grow's communicator (or a replacement's grown world),
    /// owned here (the groups' communicators are freed with them; the next shrink or grow frees
    /// the one it replaces): the job lost a rank, `MPI_Finalize` is skipped and
    /// `MpiWorld::exit_after_failure` meets the final world on it.
    survivors: Mutex<Option<Comm>>,
    /// Whether this process shares a communicator with processes of another job: it started
    /// replacements (`grow`) or is one. Every communicator must then be freed before leaving
    /// (`MpiWorld::exit_after_failure`).
    dynamic: AtomicBool,
    /// Whether this process is a replacement a `grow` started (it must call `MPI_Finalize` to
    /// leave: `mpirun` reports a started process that exits without it).
    joined: AtomicBool,
    /// Epochs below this one have seen a failed peer (ULFM; 0: none): their communicators are
    /// revoked, and each one a group frees afterwards is revoked before it is freed.
    failed_below: AtomicU64,
    /// The MPI library's version string.
    library_version: String,
}

impl Runtime {
    /// A failed peer was seen on a communicator of `epoch` (ULFM): revoke every communicator
    /// of that epoch and earlier, so that no survivor stays blocked in a collective of one that
    /// a peer has left (ULFM reports a failure only to the ranks whose call involves the failed
    /// one). The survivors' groups of later epochs are left alone. Idempotent; the list stays
    /// locked while revoking, so no group frees a communicator meanwhile.
    pub(crate) fn revoke_failed(&self, epoch: u64) {
        let Ok(ulfm) = &self.ulfm else {
            return;
        };
        self.failed_below.fetch_max(epoch + 1, Ordering::AcqRel);
        let comms = self.comms.lock().unwrap_or_else(|e| e.into_inner());
        for (c, e) in comms.iter() {
            if *e <= epoch {
                // A communicator revoked already (by a peer, or earlier) may say so.
                let _ = ulfm.revoke(c.0);
            }
        }
    }

    /// Whether a communicator of `epoch` belongs to a world that lost a rank.
    pub(crate) fn failed(&self, epoch: u64) -> bool {
        epoch < self.failed_below.load(Ordering::Acquire)
    }

    /// The current epoch (see the field).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// A shrink of a group of `epoch` succeeded: its group starts epoch `epoch + 1`.
    pub(crate) fn next_epoch(&self, epoch: u64) -> u64 {
        self.epoch.fetch_max(epoch + 1, Ordering::AcqRel);
        epoch + 1
    }

    /// Keep a duplicate of `comm` (the latest survivors' or grown communicator), owned here,
    /// for the barrier before leaving ([`MpiWorld::exit_after_failure`]), freeing the one it
    /// replaces. Collective over `comm` (`MPI_Comm_dup`).
    pub(crate) fn keep_duplicate(&self, comm: Comm) -> Result<(), CommError> {
        // SAFETY: a null handle is overwritten by MPI_Comm_dup on success.
        let mut keep: mpi::ffi::MPI_Comm = unsafe { std::mem::zeroed() };
        // SAFETY: `comm` is a live communicator.
        let rc = unsafe { mpi::ffi::MPI_Comm_dup(comm.0, &mut keep) };
        ffi::check(rc, || "MPI_Comm_dup".into())?;
        let old = self
            .survivors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(Comm(keep));
        if let Some(old) = old {
            ffi::free_comm(old);
        }
        Ok(())
    }

    /// Enter an MPI call: fails after finalisation, holds the serialising lock if there is one.
    fn enter(&self) -> Result<Option<MutexGuard<'_, ()>>, CommError> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(CommError::Backend {
                backend: "mpi",
                message: "MPI was finalized (the MpiWorld was dropped) but a group is still in use"
                    .into(),
            });
        }
        Ok(self
            .serial
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner())))
    }
}

/// The MPI environment of this process: initialised by [`MpiWorld::init`], finalised when
/// dropped. Keep it alive for the whole program.
pub struct MpiWorld {
    runtime: Arc<Runtime>,
    processor_name: String,
    library_version: String,
    thread_multiple: bool,
    iallreduce: IallreduceAlgorithm,
    universe: Option<Universe>,
}

impl std::fmt::Debug for MpiWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiWorld")
            .field("processor_name", &self.processor_name)
            .field("library_version", &self.library_version)
            .field("thread_multiple", &self.thread_multiple)
            .field("iallreduce", &self.iallreduce)
            .finish()
    }
}

impl MpiWorld {
    /// Initialise MPI with the [default settings](MpiConfig::default) and return the world
    /// group. Call once per process (MPI cannot be initialised twice), before starting threads
    /// that read or write the environment (see [`init_with`](Self::init_with)).
    pub fn init() -> Result<(MpiWorld, Group), CommError> {
        Self::init_with(MpiConfig::default())
    }

    /// Initialise MPI with `config` and return the world group. Call once per process, before
    /// starting threads that read or write the environment: unless the variable is set
    /// already, this sets [`TCP_LINKS_VAR`] from [`MpiConfig::tcp_links`] for `MPI_Init` to read.
    pub fn init_with(config: MpiConfig) -> Result<(MpiWorld, Group), CommError> {
        if config.timeout.is_zero() {
            return Err(CommError::InvalidConfig(
                "the MPI collective timeout must be positive (got 0s)".into(),
            ));
        }
        if let Some(links) = config.tcp_links {
            if links == 0 {
                return Err(CommError::InvalidConfig(
                    "the MPI TCP links per pair of ranks must be at least 1 (got 0); None \
                     leaves Open MPI's default"
                        .into(),
                ));
            }
            // Only before the first initialisation: MPI reads it there and nowhere else, and a
            // second (refused) call may come when the first one's threads are running.
            if !mpi::environment::is_initialized() && std::env::var_os(TCP_LINKS_VAR).is_none() {
                // SAFETY: MPI is not initialised yet, so none of this crate's threads
                // (watchdogs, async helpers) exist; the caller starts no thread that reads or
                // writes the environment while `init` runs (documented on `init`).
                unsafe { std::env::set_var(TCP_LINKS_VAR, links.to_string()) };
            }
        }
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| CommError::Backend {
                backend: "mpi",
                message: "MPI is already initialised in this process: MpiWorld::init may be \
                          called only once per process"
                    .into(),
            })?;
        let world = ffi::comm_world();
        ffi::errors_return(world)?;
        let library_version = mpi::environment::library_version()
            .unwrap_or_default()
            .trim_matches(|c: char| c == '\0' || c.is_whitespace())
            .to_string();
        let in_place = ffi::in_place_sentinel(&library_version);
        if in_place.is_none() {
            tracing::warn!(
                "unknown MPI library ({library_version:?}): MPI_IN_PLACE is not known, so every \
                 all-reduce copies its buffer once"
            );
        }
        // Before any non-blocking all-reduce, on every rank alike (see `tuning`).
        let iallreduce = tuning::prefer_rabenseifner_iallreduce();
        tracing::debug!("MPI_Iallreduce algorithm: {iallreduce:?}");
        let thread_multiple = threading == Threading::Multiple;
        if !thread_multiple {
            tracing::warn!(
                "the MPI library provides {threading:?} thread support, not Multiple: MPI calls \
                 are serialised by a lock"
            );
        }
        let processor_name = ffi::processor_name()?;
        // A replacement started by the survivors of a failure (`grow`) joins their world.
        let joined = spawn::join_parents()?;
        let world_rank = match &joined {
            Some((_, rank)) => *rank,
            None => ffi::comm_rank(world)?,
        };
        let watchdog = watchdog::start(world_rank, processor_name.clone()).map_err(|e| {
            CommError::Backend {
                backend: "mpi",
                message: format!("could not start the watchdog thread: {e}"),
            }
        })?;
        let runtime = Arc::new(Runtime {
            watchdog,
            ops: UserOps::create()?,
            in_place,
            serial: (!thread_multiple).then(|| Mutex::new(())),
            finalized: AtomicBool::new(false),
            host_id: host_hash(&processor_name),
            shares_cores: tuning::ranks_share_cores(),
            ulfm: ulfm::Ulfm::detect(),
            comms: Mutex::new(vec![(world, 0)]),
            epoch: AtomicU64::new(0),
            survivors: Mutex::new(None),
            dynamic: AtomicBool::new(joined.is_some()),
            joined: AtomicBool::new(joined.is_some()),
            failed_below: AtomicU64::new(0),
            library_version: library_version.clone(),
        });
        let world_size = ffi::comm_size(world)?;
        if config.preconnect && joined.is_none() {
            let links = std::env::var(TCP_LINKS_VAR)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
                .unwrap_or(1);
            let everyone: Arc<[usize]> = (0..world_size).collect();
            let _watch = runtime.watchdog.watch(
                What::Named(format!(
                    "opening the connections to every other rank ({links} TCP links per pair)"
                )),
                &everyone,
                config.timeout,
            );
            ffi::connect_all(world, world_rank, world_size, links)?;
        }
        let group = match joined {
            Some((grown, _)) => group::MpiGroup::joined(runtime.clone(), config, grown)?,
            None => group::MpiGroup::world(runtime.clone(), config)?,
        };
        let world = MpiWorld {
            runtime,
            processor_name,
            library_version,
            thread_multiple,
            iallreduce,
            universe: Some(universe),
        };
        Ok((world, Arc::new(group)))
    }

    /// What start-up did about Open MPI's `MPI_Iallreduce` algorithm, which the pipelined
    /// gradient sync and overlapped averaging use: set to Rabenseifner's, kept at the user's
    /// choice, or untouched (another MPI library).
    pub fn iallreduce_algorithm(&self) -> &IallreduceAlgorithm {
        &self.iallreduce
    }

    /// The host name MPI reports for this process (`MPI_Get_processor_name`).
    pub fn processor_name(&self) -> &str {
        &self.processor_name
    }

    /// The MPI library's version string (`MPI_Get_library_version`).
    pub fn library_version(&self) -> &str {
        &self.library_version
    }

    /// Whether the library provides `MPI_THREAD_MULTIPLE` (otherwise calls are serialised).
    pub fn thread_multiple(&self) -> bool {
        self.thread_multiple
    }

    /// Whether this process can survive a failed rank: the MPI library has ULFM and the job was
    /// started with `mpirun --with-ft ulfm` ([`FT_ENABLE_VAR`]). Then a collective whose peer
    /// failed returns [`CommError::PeerFailed`] or [`CommError::Revoked`] instead of ending the
    /// job, and [`ProcessGroup::shrink`](crate::ProcessGroup::shrink) gives the survivors a
    /// group of their own.
    pub fn fault_tolerant(&self) -> bool {
        self.runtime.ulfm.is_ok()
    }

    /// Why [`fault_tolerant`](Self::fault_tolerant) is false (`None` when it is true): the
    /// library, whether it has the ULFM functions, and the launcher's flag.
    pub fn fault_tolerance_missing(&self) -> Option<String> {
        match self.runtime.ulfm {
            Ok(_) => None,
            Err(symbols) => Some(ulfm::unavailable(&self.library_version, symbols)),
        }
    }

    /// End this process after ranks of the job failed and the survivors shrank
    /// ([`ProcessGroup::shrink`](crate::ProcessGroup::shrink)): a barrier with the survivors
    /// (and the replacements a [`grow`](crate::ProcessGroup::grow) started), then exit with
    /// `code` without `MPI_Finalize`, which Open MPI 5 can leave waiting forever for the failed
    /// ranks (open-mpi/ompi#11404). Where replacements were started, every communicator is
    /// freed first (one reaching another job would make a replacement's finalize wait), and a
    /// replacement calls `MPI_Finalize` (`mpirun` reports a started process that exits without
    /// it). Without a shrink (nor, for a replacement, a grow), it returns: drop the world as
    /// usual.
    pub fn exit_after_failure(&self, code: i32) {
        let Some(comm) = *self
            .runtime
            .survivors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        else {
            return;
        };
        if let Ok(_serial) = self.runtime.enter() {
            // SAFETY: `comm` is the runtime's own duplicate of the last shrink's (or grow's)
            // communicator, freed only below. A survivor that failed meanwhile only makes the
            // barrier fail.
            let _ = unsafe { mpi::ffi::MPI_Barrier(comm.0) };
            if self.runtime.dynamic.load(Ordering::Acquire) {
                // Nothing of MPI's is used after this but `MPI_Finalize`: the groups that still
                // hold these communicators are never dropped (the process ends below).
                let world = ffi::comm_world();
                let comms = std::mem::take(
                    &mut *self.runtime.comms.lock().unwrap_or_else(|e| e.into_inner()),
                );
                for (c, _) in comms {
                    if c.0 != world.0 {
                        ffi::free_comm(c);
                    }
                }
                ffi::free_comm(comm);
                if self.runtime.joined.load(Ordering::Acquire) {
                    // No group may use MPI from here on (a late call gets an error, not a
                    // freed communicator), and the watchdog has nothing left to watch.
                    self.runtime.finalized.store(true, Ordering::Release);
                    self.runtime.watchdog.stop();
                    // SAFETY: every communicator this process made is freed; MPI is not used
                    // again.
                    let _ = unsafe { mpi::ffi::MPI_Finalize() };
                }
            }
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        unsafe extern "C" {
            fn _exit(code: std::ffi::c_int) -> !;
        }
        // SAFETY: ends the process at once; nothing of MPI's is used afterwards.
        unsafe { _exit(code) }
    }

    /// End every process of the job at once with exit code `code` (`MPI_Abort`).
    ///
    /// Use it when one rank hits a fatal error: returning normally would drop the world, and
    /// `MPI_Finalize` waits for every rank while the others wait in their next collective, so
    /// the job would only end at the collective timeout. (A process that exits non-zero without
    /// finalising, e.g. `std::process::exit(1)`, also makes `mpirun` end the job.)
    pub fn abort(&self, code: i32) -> ! {
        ffi::abort_world(code)
    }
}

impl Drop for MpiWorld {
    /// Finalises MPI. `MPI_Finalize` waits for every rank, so a rank that leaves early would
    /// wait there while its peers wait in a collective: when the world is dropped during a panic,
    /// the job is aborted instead (exit code 101, Rust's panic code).
    fn drop(&mut self) {
        if std::thread::panicking() {
            ffi::abort_world(101);
        }
        let _serial = self.runtime.enter();
        self.runtime.finalized.store(true, Ordering::Release);
        self.runtime.watchdog.stop();
        let shrunk = self
            .runtime
            .survivors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if shrunk {
            // After a failure `MPI_Finalize` can wait forever for the failed ranks
            // (`exit_after_failure`); leave it out.
            tracing::warn!("ranks of this job failed: ending without MPI_Finalize");
            std::mem::forget(self.universe.take());
            return;
        }
        self.runtime.ops.free();
        // Dropping the universe calls MPI_Finalize.
        self.universe.take();
    }
}

/// A stable 64-bit hash (FNV-1a) of a host name: equal names give equal ids on every rank.
fn host_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
