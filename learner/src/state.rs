//! What a rank saves beside burn-train's checkpoints so a resumed run continues the schedule
//! exactly: the optimizer steps taken, the averager's and the hook's state (one small JSON file
//! per rank and epoch), and for ranks other than 0 (whose replicas differ from rank 0's between
//! averages) the model, optimizer and scheduler records in burn-train's own format.

use std::path::{Path, PathBuf};

use burn_train::checkpoint::{AsyncCheckpointer, FileCheckpointer, KeepLastNCheckpoints};
use burn_train::{LearnerModel, LearningCheckpointer};
use localsgd_averagers::AveragerState;
use localsgd_hooks::HookState;
use serde::{Deserialize, Serialize};

/// One rank's schedule at the end of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankState {
    /// The rank.
    pub rank: usize,
    /// The world size of the run.
    pub world: usize,
    /// The algorithm's identity (refuses resuming with other settings).
    pub algorithm: String,
    /// Optimizer steps taken so far.
    pub iterations: u64,
    /// The averager's state, if the algorithm averages.
    pub averager: Option<AveragerState>,
    /// The gradient hook's state, if the algorithm syncs gradients.
    pub hook: Option<HookState>,
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

    /// Write `state` for `epoch` (complete or not at all: a temporary file renamed), and remove
    /// this rank's state of epoch `epoch - keep`.
    pub(crate) fn save(&self, state: &RankState, epoch: usize, keep: usize) -> Result<(), String> {
        std::fs::create_dir_all(&self.root)
            .map_err(|e| format!("creating {}: {e}", self.root.display()))?;
        let path = self.state_path(state.rank, epoch);
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_string_pretty(state).map_err(|e| e.to_string())?;
        std::fs::write(&tmp, json).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("writing {}: {e}", path.display()))?;
        if let Some(old) = epoch.checked_sub(keep) {
            let old = self.state_path(state.rank, old);
            if old.exists() {
                std::fs::remove_file(&old)
                    .map_err(|e| format!("removing {}: {e}", old.display()))?;
            }
        }
        Ok(())
    }

    /// Read rank `rank`'s state of `epoch`.
    pub(crate) fn load(&self, rank: usize, epoch: usize) -> Result<RankState, String> {
        let path = self.state_path(rank, epoch);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "resuming after epoch {epoch} needs {} ({e}); the strategy keeps the last \
                 `keep_rank_checkpoints` epochs",
                path.display()
            )
        })?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}
