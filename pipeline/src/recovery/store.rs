//! Where a job's checkpoints live, as a recovery reads them: the latest checkpoint every rank
//! of its world sealed, and one saved rank's state of it as bytes for a replacement. The
//! pipeline's [`Checkpoints`](crate::checkpoint::Checkpoints) directory is one such store
//! ([`CheckpointDirStore`]); an entry point that keeps its state elsewhere (burn-train's
//! Learner: per-epoch files beside burn-train's own) brings its own.

use crate::algorithm::AlgorithmSpec;
use crate::checkpoint::{CheckpointDir, CheckpointError};
use std::path::{Path, PathBuf};

/// A job's checkpoints as [`Recovery`](super::Recovery) reads them. Every rank of a world
/// must see the same latest checkpoint (a shared file system): the survivors of a failure
/// check that they agree.
pub trait CheckpointStore: std::fmt::Debug + Send {
    /// The iterations of the latest checkpoint every rank of its world sealed; `None` when
    /// there is none yet.
    fn latest(&self) -> Result<Option<u64>, CheckpointError>;

    /// The state of the latest checkpoint that a replacement for job-world rank `job_rank`
    /// takes: the file of the saved rank that was `job_rank` in the saving world, or saved
    /// rank `own`'s (the sender's) when no saved rank was. Returns that saved rank, the bytes
    /// and the iterations the checkpoint holds.
    fn rank_bytes(
        &self,
        job_rank: usize,
        own: usize,
    ) -> Result<(usize, Vec<u8>, u64), CheckpointError>;

    /// Where the checkpoints are, for messages.
    fn location(&self) -> PathBuf;
}

/// The pipeline's checkpoint directory ([`CheckpointDir`]) of a run of `spec`.
#[derive(Debug, Clone)]
pub struct CheckpointDirStore {
    run_dir: PathBuf,
    spec: AlgorithmSpec,
}

impl CheckpointDirStore {
    /// The checkpoints of the run directory `run_dir` of a run of `spec`.
    pub fn new(run_dir: &Path, spec: AlgorithmSpec) -> Self {
        Self {
            run_dir: run_dir.to_path_buf(),
            spec,
        }
    }
}

impl CheckpointStore for CheckpointDirStore {
    fn latest(&self) -> Result<Option<u64>, CheckpointError> {
        match CheckpointDir::new(&self.run_dir).latest_iterations() {
            Ok(i) => Ok(Some(i)),
            Err(CheckpointError::Missing(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn rank_bytes(
        &self,
        job_rank: usize,
        own: usize,
    ) -> Result<(usize, Vec<u8>, u64), CheckpointError> {
        let checkpoints = CheckpointDir::new(&self.run_dir);
        let (_, saved) = checkpoints.latest_identity()?;
        let saved_rank = saved
            .member_ranks()
            .iter()
            .position(|&m| m == job_rank)
            .unwrap_or(own);
        let (bytes, iterations) = checkpoints.latest_rank_bytes(saved_rank, &self.spec)?;
        Ok((saved_rank, bytes, iterations))
    }

    fn location(&self) -> PathBuf {
        self.run_dir.clone()
    }
}
