//! What a rank saves beside burn-train's checkpoints so a resumed run continues exactly: per
//! rank and epoch, what the run was (a small JSON file) and the pipeline's own state (the
//! library's [`PipelineState`]: steps taken, the averager's and the hook's state, an overlapped
//! average in flight, the outer optimizer's `θ` and momentum), and for ranks other than 0
//! (whose replicas differ from rank 0's between averages) the model, optimizer and scheduler
//! records in burn-train's own format.

use std::path::{Path, PathBuf};

use burn_train::checkpoint::{AsyncCheckpointer, FileCheckpointer, KeepLastNCheckpoints};
use burn_train::{LearnerModel, LearningCheckpointer};
use localsgd_pipeline::checkpoint::PipelineState;
use serde::{Deserialize, Serialize};

use crate::error::StrategyError;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StrategyError + '_ {
    move |source| StrategyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What run a rank's state belongs to, at the end of an epoch (a resume with other settings
/// is refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankState {
    /// The rank.
    pub rank: usize,
    /// The world size of the run.
    pub world: usize,
    /// The algorithm's identity (refuses resuming with other settings).
    pub algorithm: String,
    /// Optimizer steps taken so far (the pipeline state file holds the rest).
    pub iterations: u64,
    /// The strategy's settings that change the step's numbers (`buffers`, `clip_grad_norm`,
    /// `skip_non_finite`), as `setting = value` lines: a resume must keep them, as it must the
    /// algorithm. Absent in files written before they were recorded.
    #[serde(default)]
    pub settings: Option<Vec<String>>,
}

/// The settings of `config` that a resume must keep besides the algorithm, as
/// [`RankState::settings`] records them.
pub(crate) fn fixed_settings(config: &crate::config::StrategyConfig) -> Vec<String> {
    vec![
        format!("buffers = {:?}", config.buffers),
        format!("clip_grad_norm = {:?}", config.clip_grad_norm),
        format!("skip_non_finite = {}", config.skip_non_finite),
    ]
}

/// Where the strategy keeps its files: `<directory>/checkpoint/localsgd/`.
#[derive(Debug, Clone)]
pub(crate) struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub(crate) fn new(directory: &Path) -> Self {
        Self {
            root: directory.join("checkpoint").join("localsgd"),
        }
    }

    pub(crate) fn state_path(&self, rank: usize, epoch: usize) -> PathBuf {
        self.root.join(format!("rank-{rank}-epoch-{epoch}.json"))
    }

    fn rank_dir(&self, rank: usize) -> PathBuf {
        self.root.join(format!("rank-{rank}"))
    }

    /// The model record a rank's checkpointer writes for `epoch` (burn-train's file name).
    pub(crate) fn model_path(&self, rank: usize, epoch: usize) -> PathBuf {
        self.rank_dir(rank).join(format!("model-{epoch}.bpk"))
    }

    /// A checkpointer of a rank other than 0, keeping the last `keep` epochs.
    pub(crate) fn checkpointer<M: LearnerModel>(
        &self,
        rank: usize,
        keep: usize,
    ) -> LearningCheckpointer<M> {
        let dir = self.rank_dir(rank);
        LearningCheckpointer::new(
            AsyncCheckpointer::new(FileCheckpointer::new(&dir, "model")),
            AsyncCheckpointer::new(FileCheckpointer::new(&dir, "optim")),
            AsyncCheckpointer::new(FileCheckpointer::new(&dir, "scheduler")),
            Box::new(KeepLastNCheckpoints::new(keep)),
        )
    }

    /// The pipeline state a rank writes for `epoch`.
    pub(crate) fn pipeline_path(&self, rank: usize, epoch: usize) -> PathBuf {
        self.root
            .join(format!("rank-{rank}-epoch-{epoch}.pipeline"))
    }

    /// Write `state` and `pipeline` for `epoch` (each complete or not at all: a temporary file
    /// renamed; the pipeline state first, so a state file always has its pipeline state), and
    /// remove this rank's files of epoch `epoch - keep`.
    pub(crate) fn save(
        &self,
        state: &RankState,
        pipeline: &PipelineState,
        epoch: usize,
        keep: usize,
    ) -> Result<(), StrategyError> {
        std::fs::create_dir_all(&self.root).map_err(io(&self.root))?;
        let bytes = pipeline.to_bytes()?;
        write_renamed(&self.pipeline_path(state.rank, epoch), &bytes)?;
        let path = self.state_path(state.rank, epoch);
        let json = serde_json::to_string_pretty(state).map_err(|e| StrategyError::State {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        write_renamed(&path, json.as_bytes())?;
        if let Some(old) = epoch.checked_sub(keep) {
            for old in [
                self.state_path(state.rank, old),
                self.pipeline_path(state.rank, old),
            ] {
                if old.exists() {
                    std::fs::remove_file(&old).map_err(io(&old))?;
                }
            }
        }
        Ok(())
    }

    /// Read rank `rank`'s state and pipeline state of `epoch`.
    pub(crate) fn load(
        &self,
        rank: usize,
        epoch: usize,
    ) -> Result<(RankState, PipelineState), StrategyError> {
        let missing = |path: &Path, e: std::io::Error| {
            StrategyError::Resume(format!(
                "resuming after epoch {epoch} needs {} ({e}); the strategy keeps the last \
                 `keep_rank_checkpoints` epochs",
                path.display()
            ))
        };
        let path = self.state_path(rank, epoch);
        let text = std::fs::read_to_string(&path).map_err(|e| missing(&path, e))?;
        let state = serde_json::from_str(&text).map_err(|e| StrategyError::State {
            path,
            reason: e.to_string(),
        })?;
        let path = self.pipeline_path(rank, epoch);
        let bytes = std::fs::read(&path).map_err(|e| missing(&path, e))?;
        let pipeline = PipelineState::from_bytes(&path, &bytes)?;
        Ok((state, pipeline))
    }
}

/// Write `bytes` to `path` whole or not at all, durably (the pipeline's one atomic writer).
fn write_renamed(path: &Path, bytes: &[u8]) -> Result<(), StrategyError> {
    localsgd_pipeline::atomic::write_atomic(path, bytes).map_err(io(path))
}
