//! One rank per process (part of the binary): the world a launcher started, for
//! `localsgd train` and `localsgd bench-comm` with `backend = "mpi"` (under `mpirun`) or
//! `backend = "nccl"` (a torchrun-style launcher that sets `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`, or their `LOCALSGD_` names).
//!
//! How a rank ends the job after an error differs: MPI ends every process at once
//! (`MPI_Abort`); NCCL has no such call, so the failing rank exits and its peers fail at their
//! next collective after the collective timeout (or, blocked inside NCCL, are ended by the
//! watchdog, exit code 70).

use anyhow::{Context, Result};
use localsgd_comm::Group;
use localsgd_trainer::config::Backend;
use std::time::Duration;

/// The world of this process and its world group.
pub(crate) struct ProcessWorld {
    /// The world group (rank and size are the launcher's).
    pub group: Group,
    world: World,
}

enum World {
    #[cfg(feature = "mpi")]
    Mpi(localsgd_comm::mpi::MpiWorld),
    #[cfg(feature = "nccl")]
    Nccl(localsgd_comm::nccl::NcclWorld),
}

/// Whether an MPI launcher started this process: Open MPI's `mpirun` (and processes it spawns)
/// sets `OMPI_COMM_WORLD_SIZE`; PMIx-based launchers (Open MPI 5, Slurm's `srun --mpi=pmix`)
/// `PMIX_RANK`; MPICH's Hydra and PMI-2 launchers `PMI_RANK`.
#[cfg(feature = "mpi")]
fn started_by_mpi_launcher() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

impl ProcessWorld {
    /// Join the world of `backend` (one of the one-process-per-rank backends this binary was
    /// built with; the configuration was validated for that). `timeout` bounds every collective.
    pub fn start(backend: Backend, timeout: Duration) -> Result<Self> {
        match backend {
            #[cfg(feature = "mpi")]
            Backend::Mpi => {
                use localsgd_comm::mpi::{MpiConfig, MpiWorld};
                // Started alone, MPI makes a world of one process ("singleton"), which would
                // train as a single worker without a word.
                if !started_by_mpi_launcher() {
                    anyhow::bail!(
                        "invalid setting `backend` = mpi: this process was not started by an MPI launcher, so it would train alone as a world of one; start it with `mpirun -np N localsgd train --backend mpi ...` (as root, add `--allow-run-as-root`), or use `backend = \"threads\"` with `workers` = N to train in one process"
                    );
                }
                let config = MpiConfig::default().with_timeout(timeout);
                let (world, group) = MpiWorld::init_with(config).context("starting MPI")?;
                Ok(Self {
                    group,
                    world: World::Mpi(world),
                })
            }
            #[cfg(feature = "nccl")]
            Backend::Nccl => {
                use localsgd_comm::nccl::{NcclConfig, NcclWorld};
                let config = NcclConfig::default()
                    .with_timeout(timeout)
                    .with_rendezvous_timeout(timeout);
                let (world, group) = NcclWorld::init_from_env(config).context("starting NCCL")?;
                Ok(Self {
                    group,
                    world: World::Nccl(world),
                })
            }
            other => anyhow::bail!(
                "backend {} is not a one-process-per-rank backend of this binary",
                other.name()
            ),
        }
    }

    /// "MPI" or "NCCL", for messages.
    pub fn name(&self) -> &'static str {
        match self.world {
            #[cfg(feature = "mpi")]
            World::Mpi(_) => "MPI",
            #[cfg(feature = "nccl")]
            World::Nccl(_) => "NCCL",
        }
    }

    /// How the user sets the number of ranks, for messages.
    pub fn size_hint(&self, size: usize) -> String {
        match self.world {
            #[cfg(feature = "mpi")]
            World::Mpi(_) => format!("`mpirun -np {size}`"),
            #[cfg(feature = "nccl")]
            World::Nccl(_) => format!("`WORLD_SIZE={size}` or `LOCALSGD_WORLD_SIZE={size}`"),
        }
    }

    /// Where this rank runs, for error lines: the host, and for NCCL the GPU.
    pub fn whereabouts(&self) -> String {
        match &self.world {
            #[cfg(feature = "mpi")]
            World::Mpi(w) => w.processor_name().to_string(),
            #[cfg(feature = "nccl")]
            World::Nccl(w) => {
                let host = w
                    .hosts()
                    .and_then(|h| h.get(self.group.rank()))
                    .map_or("this host", String::as_str);
                format!("{host}, GPU {} {}", w.device(), w.device_name())
            }
        }
    }

    /// Why this world cannot survive a failed rank (`on-rank-failure = "continue"`), or `None`
    /// when it can: MPI needs ULFM (Open MPI 5, `mpirun --with-ft ulfm`); NCCL cannot.
    pub fn fault_tolerance_missing(&self) -> Option<String> {
        match &self.world {
            #[cfg(feature = "mpi")]
            World::Mpi(w) => w.fault_tolerance_missing(),
            #[cfg(feature = "nccl")]
            World::Nccl(_) => Some("the NCCL backend cannot continue after a rank failure".into()),
        }
    }

    /// After ranks failed and the survivors shrank: meet the survivors, then end this process
    /// with `code` without finalising (see `MpiWorld::exit_after_failure`). Returns when no
    /// rank failed.
    pub fn exit_after_failure(&self, code: i32) {
        match &self.world {
            #[cfg(feature = "mpi")]
            World::Mpi(w) => w.exit_after_failure(code),
            #[cfg(feature = "nccl")]
            World::Nccl(_) => {}
        }
    }

    /// End the job after an error on this rank (the message was printed): `MPI_Abort`, or for
    /// NCCL leaving at once (the peers' next collective fails).
    pub fn abort(self, code: i32) -> ! {
        match &self.world {
            #[cfg(feature = "mpi")]
            World::Mpi(w) => w.abort(code),
            #[cfg(feature = "nccl")]
            World::Nccl(_) => std::process::exit(code),
        }
    }

    /// Leave normally: finalise MPI, or destroy the NCCL communicators (world group last).
    pub fn finish(self) {
        let Self { group, world } = self;
        match world {
            #[cfg(feature = "mpi")]
            // MPI_Finalize first; the group's communicator is gone with it.
            World::Mpi(w) => {
                drop(w);
                drop(group);
            }
            #[cfg(feature = "nccl")]
            World::Nccl(w) => {
                drop(group);
                drop(w);
            }
        }
    }
}
