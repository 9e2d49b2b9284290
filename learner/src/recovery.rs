//! What the strategy keeps so its ranks survive a failed rank (`on_rank_failure = Continue |
//! Replace`): after every epoch, each rank's whole state in one file — the `Learner`'s model,
//! optimizer and scheduler records (burn-train's burnpack bytes), the pipeline's state and the
//! [`RankState`] — under `<directory>/checkpoint/localsgd/recovery/`, and once every rank wrote
//! its file, rank 0 seals the epoch in `latest.json`. The pipeline's
//! [`Recovery`](localsgd_pipeline::recovery::Recovery) reads them through [`EpochStore`], its
//! [`CheckpointStore`]: the survivors continue from their own file of the latest sealed epoch,
//! a replacement from the failed rank's, handed over by a live rank.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;

use burn::store::ModuleRecord;
use burn::tensor::Bytes;
use burn_train::checkpoint::{
    AsyncCheckpointer, Checkpoint, Checkpointer, CheckpointerError, CheckpointingAction,
    CheckpointingStrategy,
};
use burn_train::metric::store::EventStoreClient;
use burn_train::{Learner, LearnerModel, LearningCheckpointer};
use localsgd_pipeline::checkpoint::CheckpointError;
use localsgd_pipeline::recovery::CheckpointStore;
use serde::{Deserialize, Serialize};

use crate::error::StrategyError;
use crate::state::RankState;

/// One rank's whole state after an epoch.
#[derive(Debug, Clone)]
pub(crate) struct Bundle {
    /// What run it belongs to (world, algorithm, settings) and the optimizer steps taken.
    pub state: RankState,
    /// The epoch it ends.
    pub epoch: usize,
    /// The pipeline's state ([`PipelineState::to_bytes`](localsgd_pipeline::checkpoint::PipelineState::to_bytes)).
    pub pipeline: Vec<u8>,
    /// The `Learner`'s records, as burn-train's checkpointers write them.
    pub model: Vec<u8>,
    pub optim: Vec<u8>,
    pub scheduler: Vec<u8>,
}

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"LSGDLRN1";

#[derive(Serialize, Deserialize)]
struct Header {
    state: RankState,
    epoch: usize,
}

impl Bundle {
    /// The file: magic, then length-prefixed sections (header JSON, pipeline, model, optimizer,
    /// scheduler).
    pub(crate) fn encode(&self) -> Result<Vec<u8>, StrategyError> {
        let header = serde_json::to_vec(&Header {
            state: self.state.clone(),
            epoch: self.epoch,
        })
        .map_err(|e| StrategyError::Config(format!("encoding a rank's state: {e}")))?;
        let sections = [
            &header[..],
            &self.pipeline,
            &self.model,
            &self.optim,
            &self.scheduler,
        ];
        let mut out = Vec::with_capacity(8 + sections.iter().map(|s| 8 + s.len()).sum::<usize>());
        out.extend_from_slice(MAGIC);
        for s in sections {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s);
        }
        Ok(out)
    }

    /// Read a file [`encode`](Self::encode) wrote; `source` names it in errors.
    pub(crate) fn decode(source: &Path, bytes: &[u8]) -> Result<Self, CheckpointError> {
        let bad = |reason: &str| CheckpointError::Corrupt {
            path: source.to_path_buf(),
            reason: reason.to_string(),
        };
        let mut rest = bytes
            .strip_prefix(MAGIC)
            .ok_or_else(|| bad("not a rank state file of the burn-train strategy"))?;
        let mut sections = Vec::with_capacity(5);
        for _ in 0..5 {
            let (len, tail) = rest
                .split_first_chunk::<8>()
                .ok_or_else(|| bad("truncated"))?;
            let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| bad("truncated"))?;
            if len > tail.len() {
                return Err(bad("truncated"));
            }
            let (section, tail) = tail.split_at(len);
            sections.push(section.to_vec());
            rest = tail;
        }
        let mut sections = sections.into_iter();
        let mut next = || sections.next().unwrap_or_default();
        let header: Header =
            serde_json::from_slice(&next()).map_err(|e| bad(&format!("header: {e}")))?;
        Ok(Self {
            state: header.state,
            epoch: header.epoch,
            pipeline: next(),
            model: next(),
            optim: next(),
            scheduler: next(),
        })
    }

    /// Load the `Learner`'s records into `learner`.
    pub(crate) fn restore_learner<M: LearnerModel>(
        &self,
        learner: &mut Learner<M>,
    ) -> Result<(), StrategyError> {
        fn record<R: Checkpoint>(bytes: &[u8], what: &str) -> Result<R, StrategyError> {
            R::checkpoint_from_bytes(Bytes::from_bytes_vec(bytes.to_vec())).map_err(|e| {
                StrategyError::Resume(format!("the {what} record of a rank's state: {e}"))
            })
        }
        learner.load_model(record::<ModuleRecord>(&self.model, "model")?);
        learner.load_optim(record(&self.optim, "optimizer")?);
        learner.load_scheduler(record(&self.scheduler, "scheduler")?);
        Ok(())
    }
}

/// The epoch every rank of a world wrote its file of, sealed by rank 0.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Latest {
    epoch: usize,
    /// Optimizer steps taken by then (the recovery's checkpoint key).
    iterations: u64,
    /// The job-world rank of each rank of the world that wrote it, in rank order.
    members: Vec<usize>,
}

/// The recovery files of a run (module docs).
#[derive(Debug, Clone)]
pub(crate) struct EpochStore {
    root: PathBuf,
}

impl EpochStore {
    /// The files under `directory` (the strategy's, `with_directory`).
    pub(crate) fn new(directory: &Path) -> Self {
        Self {
            root: directory
                .join("checkpoint")
                .join("localsgd")
                .join("recovery"),
        }
    }

    fn bundle_path(&self, rank: usize, epoch: usize) -> PathBuf {
        self.root.join(format!("rank-{rank}-epoch-{epoch}.state"))
    }

    fn latest_path(&self) -> PathBuf {
        self.root.join("latest.json")
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StrategyError + '_ {
        move |source| StrategyError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Write rank `bundle.state.rank`'s file of its epoch (whole or not at all), and remove
    /// its file of `keep` epochs before.
    pub(crate) fn write(&self, bundle: &Bundle, keep: usize) -> Result<(), StrategyError> {
        std::fs::create_dir_all(&self.root).map_err(Self::io(&self.root))?;
        let path = self.bundle_path(bundle.state.rank, bundle.epoch);
        localsgd_pipeline::atomic::write_atomic(&path, &bundle.encode()?)
            .map_err(Self::io(&path))?;
        if let Some(old) = bundle.epoch.checked_sub(keep) {
            let old = self.bundle_path(bundle.state.rank, old);
            if old.exists() {
                std::fs::remove_file(&old).map_err(Self::io(&old))?;
            }
        }
        Ok(())
    }

    /// Seal `epoch` (after `iterations` optimizer steps) as written by every rank of a world
    /// whose job-world ranks are `members`: rank 0 calls it once every rank wrote its file.
    pub(crate) fn seal(
        &self,
        epoch: usize,
        iterations: u64,
        members: &[usize],
    ) -> Result<(), StrategyError> {
        let latest = Latest {
            epoch,
            iterations,
            members: members.to_vec(),
        };
        let path = self.latest_path();
        let json = serde_json::to_vec_pretty(&latest).map_err(|e| StrategyError::State {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        localsgd_pipeline::atomic::write_atomic(&path, &json).map_err(Self::io(&path))
    }

    fn read_latest(&self) -> Result<Option<Latest>, CheckpointError> {
        let path = self.latest_path();
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CheckpointError::Io { path, source }),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| CheckpointError::Corrupt {
                path,
                reason: e.to_string(),
            })
    }

    /// Saved rank `saved_rank`'s file of the latest sealed epoch.
    pub(crate) fn read(&self, saved_rank: usize) -> Result<Bundle, CheckpointError> {
        let latest = self
            .read_latest()?
            .ok_or_else(|| CheckpointError::Missing(self.latest_path()))?;
        let (bytes, path) = self.bytes(saved_rank, latest.epoch)?;
        Bundle::decode(&path, &bytes)
    }

    fn bytes(&self, rank: usize, epoch: usize) -> Result<(Vec<u8>, PathBuf), CheckpointError> {
        let path = self.bundle_path(rank, epoch);
        match std::fs::read(&path) {
            Ok(b) => Ok((b, path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(CheckpointError::Missing(path))
            }
            Err(source) => Err(CheckpointError::Io { path, source }),
        }
    }
}

impl CheckpointStore for EpochStore {
    fn latest(&self) -> Result<Option<u64>, CheckpointError> {
        Ok(self.read_latest()?.map(|l| l.iterations))
    }

    fn rank_bytes(
        &self,
        job_rank: usize,
        own: usize,
    ) -> Result<(usize, Vec<u8>, u64), CheckpointError> {
        let latest = self
            .read_latest()?
            .ok_or_else(|| CheckpointError::Missing(self.latest_path()))?;
        let saved_rank = latest
            .members
            .iter()
            .position(|&m| m == job_rank)
            .unwrap_or(own);
        let (bytes, _) = self.bytes(saved_rank, latest.epoch)?;
        Ok((saved_rank, bytes, latest.iterations))
    }

    fn location(&self) -> PathBuf {
        self.root.clone()
    }
}

/// burn-train keeps the `Learner`'s optimizer and scheduler private; its checkpointer is the
/// one way to their records. This one hands the three records over as bytes, synchronously.
pub(crate) struct RecordCapture<M: LearnerModel> {
    checkpointer: LearningCheckpointer<M>,
    received: [mpsc::Receiver<Result<Vec<u8>, String>>; 3],
}

/// A checkpointer that sends each record's bytes down a channel.
struct Sink<R> {
    tx: Mutex<mpsc::Sender<Result<Vec<u8>, String>>>,
    _record: PhantomData<fn(R)>,
}

impl<R: Checkpoint> Checkpointer<R> for Sink<R> {
    fn save(&self, _epoch: usize, record: R) -> Result<(), CheckpointerError> {
        let bytes = record
            .checkpoint_into_bytes()
            .map(|b| b.to_vec())
            .map_err(|e| e.to_string());
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        tx.send(bytes)
            .map_err(|e| CheckpointerError::Unknown(e.to_string()))
    }

    fn restore(&self, _epoch: usize) -> Result<R, CheckpointerError> {
        Err(CheckpointerError::Unknown(
            "the strategy's record capture restores nothing".into(),
        ))
    }

    fn delete(&self, _epoch: usize) -> Result<(), CheckpointerError> {
        Ok(())
    }
}

/// Save every epoch.
struct Always;

impl CheckpointingStrategy for Always {
    fn checkpointing(&mut self, _: usize, _: &EventStoreClient) -> Vec<CheckpointingAction> {
        vec![CheckpointingAction::Save]
    }
}

impl<M: LearnerModel> RecordCapture<M> {
    pub(crate) fn new() -> Self {
        fn sink<R: Checkpoint>() -> (
            AsyncCheckpointer<R>,
            mpsc::Receiver<Result<Vec<u8>, String>>,
        ) {
            let (tx, rx) = mpsc::channel();
            let sink = Sink::<R> {
                tx: Mutex::new(tx),
                _record: PhantomData,
            };
            (AsyncCheckpointer::new(sink), rx)
        }
        let (model, m) = sink();
        let (optim, o) = sink();
        let (scheduler, s) = sink();
        Self {
            checkpointer: LearningCheckpointer::new(model, optim, scheduler, Box::new(Always)),
            received: [m, o, s],
        }
    }

    /// The model, optimizer and scheduler records of `learner`, as bytes.
    pub(crate) fn capture(
        &mut self,
        learner: &Learner<M>,
        store: &EventStoreClient,
    ) -> Result<[Vec<u8>; 3], StrategyError> {
        self.checkpointer.checkpoint(learner, 0, store);
        let mut out: [Vec<u8>; 3] = Default::default();
        for (slot, rx) in out.iter_mut().zip(&self.received) {
            *slot = rx
                .recv()
                .map_err(|e| e.to_string())
                .and_then(|r| r)
                .map_err(|e| {
                    StrategyError::Config(format!("capturing the learner's state: {e}"))
                })?;
        }
        Ok(out)
    }
}
