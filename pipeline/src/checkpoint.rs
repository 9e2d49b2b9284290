//! Checkpoints: everything needed to continue a run exactly, written atomically, for any burn
//! [`Module`].
//!
//! A loop gets them in one call each through [`Checkpoints`] (the run directory and the
//! [`RunIdentity`] every checkpoint records): [`Checkpoints::checkpointer`] for
//! [`Pipeline::with_checkpointer`](crate::pipeline::Pipeline::with_checkpointer) (the checkpoint
//! phase, every `checkpoint_every` iterations), [`Checkpoints::save_final`] (or
//! [`save_state`](Checkpoints::save_state)) after the last iteration, and
//! [`Checkpoints::resume`] into a fresh model and pipeline. Saves are collective: every rank
//! writes its own file between barriers. [`RankCheckpoint`] and [`CheckpointDir`] are the file
//! format and the directory underneath.
//!
//! ```
//! use burn::module::{Module, Param};
//! use burn::optim::SgdConfig;
//! use burn::tensor::{Device, Tensor};
//! use localsgd_comm::ThreadWorld;
//! use localsgd_pipeline::algorithm::{AlgorithmSpec, build};
//! use localsgd_pipeline::checkpoint::{CheckpointError, Checkpoints, Publish, RunIdentity};
//! use localsgd_pipeline::pipeline::{IterSource, Outcome, Pipeline, PipelineOptions};
//! use localsgd_pipeline::settings::AlgorithmKind;
//!
//! #[derive(Module, Debug)]
//! struct Scale {
//!     w: Param<Tensor<1>>,
//! }
//!
//! let run_dir = std::env::temp_dir().join(format!("localsgd-checkpoint-doc-{}", std::process::id()));
//! let spec = AlgorithmSpec {
//!     kind: AlgorithmKind::LocalSgd,
//!     period: Some(2),
//!     ..AlgorithmSpec::default()
//! };
//! // Train the run to `steps` iterations on 2 ranks, from its latest checkpoint if it has one:
//! // every rank's (iteration resumed from, iterations done).
//! let train = |steps: u64| -> Result<Vec<(u64, u64)>, Box<dyn std::error::Error>> {
//!     Ok(ThreadWorld::new(2)?.run(|world| {
//!         let device = Device::flex().autodiff();
//!         let identity = RunIdentity::from_spec(&spec, world.size());
//!         let checkpoints = Checkpoints::new(&run_dir, identity);
//!         let parts = build(&spec, &world).unwrap();
//!         let options = PipelineOptions { checkpoint_every: 3, ..Default::default() };
//!         let mut pipeline = Pipeline::new(world.clone(), SgdConfig::new().init(), options)
//!             .with_averager(parts.averager.unwrap())
//!             .with_checkpointer(checkpoints.checkpointer(Publish::Now));
//!         let mut model = Scale { w: Param::from_tensor(Tensor::ones([1], &device)) };
//!         let from = match checkpoints.resume(model.clone(), &mut pipeline) {
//!             Ok(resumed) => {
//!                 model = resumed.model;
//!                 resumed.iterations_done
//!             }
//!             Err(CheckpointError::Missing(_)) => 0, // nothing saved yet: a fresh run
//!             Err(e) => panic!("{e}"),
//!         };
//!         let mut data = IterSource(std::iter::repeat(world.rank() as f32));
//!         let loss = |m: &Scale, target: &f32| {
//!             let d = m.w.val() - *target;
//!             (d.clone() * d).mean()
//!         };
//!         while pipeline.iteration() < steps {
//!             model = match pipeline.run_iteration(model, &mut data, &loss).unwrap() {
//!                 Outcome::Trained(m, _) | Outcome::EndOfData(m) => m,
//!             };
//!         }
//!         // The last state, unless the checkpoint phase just saved it (`IterSource` cannot
//!         // say where it stands: no data position).
//!         checkpoints.save_final(&mut pipeline, &model, None).unwrap();
//!         (from, pipeline.iteration())
//!     })?)
//! };
//! assert_eq!(train(4)?, [(0, 4), (0, 4)]); // checkpoints of 3 and 4 iterations
//! assert_eq!(train(7)?, [(4, 7), (4, 7)]); // resumed at 4: checkpoints of 6 and 7
//! let latest = std::fs::read_to_string(run_dir.join("checkpoints/latest"))?;
//! assert_eq!(latest, "step-00000007");
//! std::fs::remove_dir_all(&run_dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layout in the run directory:
//! ```text
//! checkpoints/step-00000120/rank-0.ckpt   one file per rank (ranks diverge under local SGD)
//! checkpoints/step-00000120/manifest.json world size, algorithm, iteration
//! checkpoints/latest                      name of the newest complete checkpoint
//! ```
//! A checkpoint is written into `step-N.tmp/`, synced, renamed to `step-N/` (sealed), and only
//! then does `latest` (itself replaced by rename) point at it (published). A crash at any moment
//! leaves the previous checkpoint intact and `latest` pointing at a complete one. The `localsgd`
//! binary seals in the checkpoint phase ([`Publish::Later`]) and publishes a checkpoint only once
//! the metrics rows up to it are synced, so the rows a resume keeps are exactly those of the
//! iterations the checkpoint holds.
//!
//! Each rank file holds: parameters in traversal order with their `ParamId`s (restored on
//! resume, so the optimizer's per-parameter state re-attaches), the optimizer record, the
//! averager state (its step) and, with overlapped averaging, an average started and not yet
//! applied (its snapshot and result), with `diloco`/`slowmo` the outer averager's `θ`, outer
//! momentum and outer-step count, the hook state (post-local SGD `iter`), iterations done,
//! skipped steps and the data position (epoch, next batch). Shuffling is a pure function of (seed,
//! epoch), so that position is the whole RNG state.

mod collective;
mod pipeline_state;

pub use collective::{Checkpoints, Publish, Resumed, current_context};
pub use pipeline_state::PipelineState;

use crate::algorithm::AlgorithmSpec;
use crate::atomic;
use crate::pipeline::{DataPosition, PipelineError};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::ModuleOptimizer;
use burn::tensor::{Bytes, Tensor};
use localsgd_averagers::{AveragerState, OuterState, PendingAverage};
use localsgd_comm::CommError;
use localsgd_comm::params::{
    FlatBuffer, FlatLayout, FlatParams, ParamSelection, flatten_params, write_params,
};
use localsgd_hooks::HookState;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"LSGDCKPT";
/// Format 2 added the pending overlapped average (a fourth part), format 3 the outer averager's
/// state (a fifth, empty without one), format 4 a CRC-32 of everything before it as the last
/// four bytes (a flipped bit anywhere is a "damaged" error, not a silently different model);
/// format 1 to 3 files still load.
const FORMAT: u32 = 4;

/// Checkpoint failures, naming the file involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// File system error.
    #[error("checkpoint I/O on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a checkpoint of this format, or is damaged.
    #[error("checkpoint {path} is damaged or not a localsgd checkpoint: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint was written by a run with other settings.
    #[error("cannot resume: {0}")]
    Incompatible(String),
    /// No checkpoint to resume from.
    #[error(
        "no checkpoint to resume from in {0} (run without `resume` first, or point `run-dir` at a run that saved one)"
    )]
    Missing(PathBuf),
    /// Burn failed to (de)serialize the optimizer or parameters.
    #[error("checkpoint data: {0}")]
    Data(String),
    /// A collective of a save failed (a barrier: a peer died, timed out or called something
    /// else).
    #[error("checkpoint: communication failed: {0}")]
    Comm(#[from] CommError),
    /// The pipeline refused the checkpoint's counters and states
    /// ([`Pipeline::restore`](crate::pipeline::Pipeline::restore)): a checkpoint of an algorithm
    /// with other parts (an outer averager, overlap, a hook).
    #[error("cannot resume: {0}")]
    Restore(#[source] PipelineError),
    /// The pipeline could not hand over its state for a save (completing a pending overlapped
    /// average or an outer pseudo-gradient in flight failed).
    #[error("checkpoint: {0}")]
    Pipeline(#[source] PipelineError),
    /// This pipeline's state cannot be saved here (its optimizer is an
    /// [`InnerOptimizer`](crate::pipeline::InnerOptimizer) whose state the pipeline does not
    /// hold).
    #[error("checkpoint not possible: {0}")]
    Unsupported(String),
}

impl CheckpointError {
    /// Whether saving or loading failed because a peer is gone (a collective of the
    /// checkpoint, or the pipeline that took up the saved state): see
    /// [`PipelineError::is_peer_lost`].
    pub fn is_peer_lost(&self) -> bool {
        match self {
            CheckpointError::Comm(c) => c.is_peer_lost(),
            CheckpointError::Restore(p) | CheckpointError::Pipeline(p) => p.is_peer_lost(),
            _ => false,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Run-level facts every rank file and the manifest carry; resuming checks them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunIdentity {
    /// Number of ranks.
    pub world_size: usize,
    /// The algorithm settings (algorithm, warmup, period, levels, ...), as text.
    pub algorithm: String,
    /// Which ranks of the job's first world this run's ranks are, in rank order, when they are
    /// not `0..world_size`: the survivors of a run that went on after ranks failed
    /// ([`with_members`](Self::with_members)). Empty means `0..world_size`. Not part of what a
    /// resume must match: it says which saved file each survivor continues from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<usize>,
}

impl RunIdentity {
    /// The identity of a run of `spec` on `world_size` ranks: what every checkpoint of it
    /// records and what a resumed run must match (its settings as
    /// [`AlgorithmSpec::identity`] writes them).
    pub fn from_spec(spec: &AlgorithmSpec, world_size: usize) -> Self {
        Self {
            world_size,
            algorithm: spec.identity(),
            members: Vec::new(),
        }
    }

    /// The same identity for a run whose ranks are `members` of the job's first world, in rank
    /// order (a group's [`world_ranks`](localsgd_comm::ProcessGroup::world_ranks)); recorded
    /// only when they are not `0..world_size`.
    pub fn with_members(mut self, members: &[usize]) -> Self {
        let identity = members.iter().copied().eq(0..self.world_size);
        self.members = if identity {
            Vec::new()
        } else {
            members.to_vec()
        };
        self
    }

    /// The job-world rank of every rank of this run, in rank order (`0..world_size` unless
    /// [`members`](Self::members) says otherwise).
    pub fn member_ranks(&self) -> Vec<usize> {
        if self.members.is_empty() {
            (0..self.world_size).collect()
        } else {
            self.members.clone()
        }
    }
}

/// Per-rank metadata stored ahead of the binary payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankMeta {
    /// Format version.
    pub format: u32,
    /// This rank.
    pub rank: usize,
    /// World size and algorithm.
    pub identity: RunIdentity,
    /// Iterations completed.
    pub iterations_done: u64,
    /// Optimizer steps skipped for non-finite gradients.
    pub skipped_steps: u64,
    /// Data position after the last completed iteration.
    pub data: Option<DataPosition>,
    /// Averager state.
    pub averager: Option<AveragerState>,
    /// Hook state.
    pub hook: Option<HookState>,
    /// `ParamId` of every float parameter, in traversal order.
    pub param_ids: Vec<u64>,
    /// Shape of every float parameter, in traversal order.
    pub param_shapes: Vec<Vec<usize>>,
    /// `"f32"` or `"f64"`.
    pub param_dtype: String,
    /// An overlapped average started and not yet applied (its vectors are the file's fourth
    /// part).
    #[serde(default)]
    pub pending: Option<PendingMeta>,
}

/// The metadata of a pending overlapped average in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMeta {
    /// The averaging step that started it.
    pub started_at: u64,
    /// World ranks of its group.
    pub group: Vec<usize>,
    /// Traversal indices of the averaged parameters.
    pub indices: Vec<usize>,
    /// Elements of each of the two vectors (snapshot, average).
    pub len: usize,
    /// `"f32"` or `"f64"`.
    pub dtype: String,
}

/// One rank's checkpoint, in memory.
pub struct RankCheckpoint {
    /// Metadata.
    pub meta: RankMeta,
    /// Parameter values in traversal order.
    pub params: FlatBuffer,
    /// The pending overlapped average's snapshot and average (with `meta.pending`).
    pub pending: Option<(FlatBuffer, FlatBuffer)>,
    /// The outer averager's state (`diloco`, `slowmo`).
    pub outer: Option<OuterState>,
    /// The optimizer record, serialized by burn.
    pub optimizer: Vec<u8>,
}

struct IdsVisitor(Vec<u64>);
impl ModuleVisitor for IdsVisitor {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        self.0.push(p.id.val());
    }
}

struct SetIds<'a> {
    ids: &'a [u64],
    next: usize,
}
impl ModuleMapper for SetIds<'_> {
    fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let id = self.ids.get(self.next).copied();
        self.next += 1;
        match id {
            Some(id) => {
                let (_, tensor, mapper) = p.consume();
                Param::from_mapped_value(ParamId::from(id), tensor, mapper)
            }
            None => p,
        }
    }
}

impl RankCheckpoint {
    /// Capture a rank's state.
    #[allow(clippy::too_many_arguments)]
    pub fn capture<M: Module>(
        rank: usize,
        identity: RunIdentity,
        iterations_done: u64,
        skipped_steps: u64,
        data: Option<DataPosition>,
        averager: Option<AveragerState>,
        pending: Option<PendingAverage>,
        outer: Option<OuterState>,
        hook: Option<HookState>,
        model: &M,
        optimizer: &ModuleOptimizer,
    ) -> Result<Self, CheckpointError> {
        let flat = flatten_params(model, &ParamSelection::All)
            .map_err(|e| CheckpointError::Data(e.to_string()))?;
        let mut ids = IdsVisitor(Vec::new());
        model.visit(&mut ids);
        let optimizer = optimizer
            .into_bytes()
            .map_err(|e| CheckpointError::Data(format!("optimizer record: {e:?}")))?
            .to_vec();
        let param_dtype = match flat.buffer {
            FlatBuffer::F32(_) => "f32",
            FlatBuffer::F64(_) => "f64",
        };
        Ok(Self {
            meta: RankMeta {
                format: FORMAT,
                rank,
                identity,
                iterations_done,
                skipped_steps,
                data,
                averager,
                hook,
                param_ids: ids.0,
                param_shapes: flat
                    .layout
                    .entries
                    .iter()
                    .map(|e| e.shape.clone())
                    .collect(),
                param_dtype: param_dtype.to_string(),
                pending: pending.as_ref().map(|p| PendingMeta {
                    started_at: p.started_at,
                    group: p.group.clone(),
                    indices: p.indices.clone(),
                    len: p.snapshot.len(),
                    dtype: dtype_name(&p.snapshot).to_string(),
                }),
            },
            params: flat.buffer,
            pending: pending.map(|p| (p.snapshot, p.average)),
            outer,
            optimizer,
        })
    }

    /// The pending overlapped average saved in this checkpoint, to hand to
    /// [`Pipeline::restore`](crate::pipeline::Pipeline::restore).
    pub fn pending_average(&self) -> Option<PendingAverage> {
        let meta = self.meta.pending.as_ref()?;
        let (snapshot, average) = self.pending.clone()?;
        Some(PendingAverage {
            started_at: meta.started_at,
            group: meta.group.clone(),
            indices: meta.indices.clone(),
            snapshot,
            average,
        })
    }

    /// Put the saved parameters (with their saved `ParamId`s) into `model` and rebuild the
    /// optimizer from its record. Fails if the model's shapes differ from the checkpoint's.
    pub fn restore<M: Module>(
        &self,
        model: M,
        optimizer: ModuleOptimizer,
    ) -> Result<(M, ModuleOptimizer), CheckpointError> {
        let model = self.restore_params(model)?;
        // burn's record decoder panics on some damaged records ("Optimizer record tensors should
        // carry a parameter id"); the file's CRC-32 catches damage on disk, this catches a file
        // rewritten with a valid checksum.
        let bytes = Bytes::from_bytes_vec(self.optimizer.clone());
        let decoded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| optimizer.from_bytes(bytes)))
                .map_err(|panic| {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "no message".into());
                    CheckpointError::Data(format!(
                        "optimizer record: damaged (burn's decoder panicked: {why})"
                    ))
                })?;
        let optimizer =
            decoded.map_err(|e| CheckpointError::Data(format!("optimizer record: {e:?}")))?;
        Ok((model, optimizer))
    }

    /// Put the saved parameters (with their saved `ParamId`s) into `model`, without the
    /// optimizer (for reading a run's models: `localsgd export`). Fails if the model's shapes
    /// differ from the checkpoint's.
    pub fn restore_params<M: Module>(&self, model: M) -> Result<M, CheckpointError> {
        let model = model.map(&mut SetIds {
            ids: &self.meta.param_ids,
            next: 0,
        });
        let layout = FlatLayout::of(&model, &ParamSelection::All);
        let shapes: Vec<Vec<usize>> = layout.entries.iter().map(|e| e.shape.clone()).collect();
        if shapes != self.meta.param_shapes {
            return Err(CheckpointError::Incompatible(format!(
                "the model's parameter shapes {shapes:?} differ from the checkpoint's {:?}",
                self.meta.param_shapes
            )));
        }
        let flat = FlatParams {
            layout,
            buffer: self.params.clone(),
        };
        let model = write_params(model, &flat).map_err(|e| CheckpointError::Data(e.to_string()))?;
        Ok(model)
    }

    fn encode(&self) -> Result<Vec<u8>, CheckpointError> {
        let meta =
            serde_json::to_vec(&self.meta).map_err(|e| CheckpointError::Data(e.to_string()))?;
        let params = le_bytes(&self.params);
        let mut pending = Vec::new();
        if let Some((snapshot, average)) = &self.pending {
            pending.extend(le_bytes(snapshot));
            pending.extend(le_bytes(average));
        }
        let outer = self
            .outer
            .as_ref()
            .map(OuterState::to_bytes)
            .unwrap_or_default();
        let mut out = Vec::with_capacity(
            56 + meta.len() + params.len() + self.optimizer.len() + pending.len() + outer.len(),
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        for part in [&meta, &params, &self.optimizer, &pending, &outer] {
            out.extend_from_slice(&(part.len() as u64).to_le_bytes());
            out.extend_from_slice(part);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    fn decode(path: &Path, bytes: &[u8]) -> Result<Self, CheckpointError> {
        let corrupt = |reason: &str| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        if bytes.len() < 12 || &bytes[..8] != MAGIC {
            return Err(corrupt("missing header"));
        }
        let format = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let names: &[&str] = match format {
            1 => &["metadata", "parameters", "optimizer"],
            2 => &["metadata", "parameters", "optimizer", "pending average"],
            3 | FORMAT => &[
                "metadata",
                "parameters",
                "optimizer",
                "pending average",
                "outer state",
            ],
            _ => return Err(corrupt(&format!("format {format}, expected 1 to {FORMAT}"))),
        };
        let body = if format >= 4 {
            let Some(split) = bytes.len().checked_sub(4).filter(|&n| n >= 12) else {
                return Err(corrupt("truncated before the checksum"));
            };
            let (body, crc) = bytes.split_at(split);
            let saved = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
            let actual = crc32fast::hash(body);
            if saved != actual {
                return Err(corrupt(&format!(
                    "checksum mismatch (saved {saved:08x}, computed {actual:08x}): the file was \
                     truncated or altered"
                )));
            }
            body
        } else {
            bytes
        };
        let mut rest = &body[12..];
        let mut parts = Vec::with_capacity(names.len());
        for &name in names {
            if rest.len() < 8 {
                return Err(corrupt(&format!("truncated before {name}")));
            }
            let mut len = [0u8; 8];
            len.copy_from_slice(&rest[..8]);
            let len = u64::from_le_bytes(len) as usize;
            rest = &rest[8..];
            if rest.len() < len {
                return Err(corrupt(&format!("truncated {name}")));
            }
            parts.push(&rest[..len]);
            rest = &rest[len..];
        }
        if !rest.is_empty() {
            return Err(corrupt(&format!(
                "{} bytes after the last part",
                rest.len()
            )));
        }
        let meta: RankMeta =
            serde_json::from_slice(parts[0]).map_err(|e| corrupt(&e.to_string()))?;
        let params = from_le_bytes(&meta.param_dtype, parts[1])
            .ok_or_else(|| corrupt(&format!("unknown parameter dtype {}", meta.param_dtype)))?;
        let pending = match (&meta.pending, parts.get(3)) {
            (None, None) => None,
            (None, Some(&[])) => None,
            (Some(p), Some(bytes)) => {
                let both = from_le_bytes(&p.dtype, bytes)
                    .ok_or_else(|| corrupt(&format!("unknown pending dtype {}", p.dtype)))?;
                if both.len() != 2 * p.len {
                    return Err(corrupt(&format!(
                        "the pending average has {} elements, expected 2 x {}",
                        both.len(),
                        p.len
                    )));
                }
                Some(split_halves(both))
            }
            _ => return Err(corrupt("pending average metadata and data do not match")),
        };
        let outer = match parts.get(4) {
            None | Some(&[]) => None,
            Some(bytes) => Some(
                OuterState::from_bytes(bytes).map_err(|e| corrupt(&format!("outer state: {e}")))?,
            ),
        };
        Ok(Self {
            meta,
            params,
            pending,
            outer,
            optimizer: parts[2].to_vec(),
        })
    }
}

/// The `checkpoints/` directory of a run.
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    root: PathBuf,
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    atomic::write_synced(path, bytes).map_err(io(path))
}

fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    atomic::sync_dir(path).map_err(io(path))
}

impl CheckpointDir {
    /// `run_dir/checkpoints`.
    pub fn new(run_dir: &Path) -> Self {
        Self {
            root: run_dir.join("checkpoints"),
        }
    }

    fn step_name(iterations_done: u64) -> String {
        format!("step-{iterations_done:08}")
    }

    /// The directory of the sealed checkpoint of `iterations_done` iterations
    /// (`checkpoints/step-N`).
    pub fn step(&self, iterations_done: u64) -> PathBuf {
        self.root.join(Self::step_name(iterations_done))
    }

    /// Staging directory for a checkpoint in progress (ranks write their files here).
    pub fn staging(&self, iterations_done: u64) -> PathBuf {
        self.root
            .join(format!("{}.tmp", Self::step_name(iterations_done)))
    }

    /// Prepare the staging directory (call on one rank before the others write).
    pub fn begin(&self, iterations_done: u64) -> Result<PathBuf, CheckpointError> {
        let staging = self.staging(iterations_done);
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(io(&staging))?;
        }
        fs::create_dir_all(&staging).map_err(io(&staging))?;
        Ok(staging)
    }

    /// Write one rank's file into the staging directory.
    pub fn write_rank(
        &self,
        iterations_done: u64,
        ckpt: &RankCheckpoint,
    ) -> Result<(), CheckpointError> {
        let path = self
            .staging(iterations_done)
            .join(format!("rank-{}.ckpt", ckpt.meta.rank));
        write_synced(&path, &ckpt.encode()?)
    }

    /// Seal the checkpoint and publish it (call on one rank after every rank wrote): manifest,
    /// rename, `latest`. [`seal`](Self::seal) then [`publish`](Self::publish).
    pub fn commit(
        &self,
        iterations_done: u64,
        identity: &RunIdentity,
    ) -> Result<PathBuf, CheckpointError> {
        let dir = self.seal(iterations_done, identity)?;
        self.publish(iterations_done)?;
        Ok(dir)
    }

    /// Seal the checkpoint (call on one rank after every rank wrote): write its manifest and
    /// rename `step-N.tmp/` to `step-N/`. It is complete, but a resume still takes the one
    /// `latest` names until [`publish`](Self::publish): a caller can first make durable what
    /// must survive with it (the binary syncs the metrics rows up to it).
    pub fn seal(
        &self,
        iterations_done: u64,
        identity: &RunIdentity,
    ) -> Result<PathBuf, CheckpointError> {
        let staging = self.staging(iterations_done);
        let manifest = serde_json::json!({
            "format": FORMAT,
            "iterations_done": iterations_done,
            "identity": identity,
        });
        write_synced(
            &staging.join("manifest.json"),
            manifest.to_string().as_bytes(),
        )?;
        sync_dir(&staging)?;
        let final_dir = self.step(iterations_done);
        if final_dir.exists() {
            fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
        }
        fs::rename(&staging, &final_dir).map_err(io(&final_dir))?;
        sync_dir(&self.root)?;
        Ok(final_dir)
    }

    /// Point `latest` at the sealed checkpoint of `iterations_done` (replaced by rename, then
    /// the directory synced): from now on a resume continues from it.
    pub fn publish(&self, iterations_done: u64) -> Result<(), CheckpointError> {
        let name = Self::step_name(iterations_done);
        let sealed = self.root.join(&name).join("manifest.json");
        if !sealed.exists() {
            return Err(io(&sealed)(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "publishing a checkpoint that was not sealed",
            )));
        }
        let latest = self.root.join("latest");
        atomic::write_atomic(&latest, name.as_bytes()).map_err(io(&latest))?;
        sync_dir(&self.root)
    }

    /// Delete the sealed checkpoints older than the `keep` newest up to `latest` (0: keep
    /// every one). `latest` itself and anything newer (a checkpoint sealed and not yet
    /// published) are never deleted; nor are staging directories (`step-N.tmp`). Returns the
    /// iterations of the checkpoints deleted, oldest first. Call it on one rank, after
    /// [`publish`](Self::publish).
    pub fn prune(&self, keep: usize) -> Result<Vec<u64>, CheckpointError> {
        if keep == 0 {
            return Ok(Vec::new());
        }
        let latest = match self.latest_iterations() {
            Ok(i) => i,
            Err(CheckpointError::Missing(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut sealed: Vec<u64> = fs::read_dir(&self.root)
            .map_err(io(&self.root))?
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                let n: u64 = name.to_str()?.strip_prefix("step-")?.parse().ok()?;
                (n <= latest).then_some(n)
            })
            .collect();
        sealed.sort_unstable();
        let doomed = sealed.len().saturating_sub(keep);
        let mut deleted = Vec::new();
        for &n in &sealed[..doomed] {
            let dir = self.step(n);
            fs::remove_dir_all(&dir).map_err(io(&dir))?;
            deleted.push(n);
        }
        if !deleted.is_empty() {
            sync_dir(&self.root)?;
        }
        Ok(deleted)
    }

    /// The newest complete checkpoint directory.
    pub fn latest(&self) -> Result<PathBuf, CheckpointError> {
        let latest = self.root.join("latest");
        let name = match fs::read_to_string(&latest) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CheckpointError::Missing(self.root.clone()));
            }
            Err(e) => return Err(io(&latest)(e)),
        };
        Ok(self.root.join(name.trim()))
    }

    /// The latest checkpoint directory, after checking that its manifest belongs to a run with
    /// this identity (world size and algorithm). Reads only the manifest: the binary calls it
    /// before it writes anything into a run directory it is asked to resume.
    pub fn check_latest(&self, identity: &RunIdentity) -> Result<PathBuf, CheckpointError> {
        // The manifest first: a run with more ranks than the checkpoint has rank files must get
        // the world-size message on every rank, not "file not found" on the extra ranks.
        let (dir, saved) = self.latest_identity()?;
        check_identity(&dir, &saved, identity)?;
        Ok(dir)
    }

    /// The iterations the latest checkpoint holds (its manifest's `iterations_done`).
    pub fn latest_iterations(&self) -> Result<u64, CheckpointError> {
        let dir = self.latest()?;
        let manifest_path = dir.join("manifest.json");
        let manifest = fs::read(&manifest_path).map_err(io(&manifest_path))?;
        serde_json::from_slice::<serde_json::Value>(&manifest)
            .ok()
            .and_then(|m| m.get("iterations_done")?.as_u64())
            .ok_or_else(|| {
                CheckpointError::Incompatible(format!(
                    "{} is not a valid checkpoint manifest (no iterations_done)",
                    manifest_path.display()
                ))
            })
    }

    /// The latest checkpoint directory and the identity its manifest records (world size and
    /// algorithm settings), for tools that read a finished run (`localsgd export`).
    pub fn latest_identity(&self) -> Result<(PathBuf, RunIdentity), CheckpointError> {
        let dir = self.latest()?;
        let manifest_path = dir.join("manifest.json");
        let manifest = fs::read(&manifest_path).map_err(io(&manifest_path))?;
        let saved: RunIdentity = serde_json::from_slice::<serde_json::Value>(&manifest)
            .ok()
            .and_then(|m| serde_json::from_value(m.get("identity")?.clone()).ok())
            .ok_or_else(|| {
                CheckpointError::Incompatible(format!(
                    "{} is not a valid checkpoint manifest (no run identity)",
                    manifest_path.display()
                ))
            })?;
        Ok((dir, saved))
    }

    /// The metadata of saved rank `rank`'s file of the latest checkpoint (iterations done, data
    /// position, the identity it records), unchecked: what a tool needs to say how far a run
    /// got before it resumes it.
    pub fn latest_rank_meta(&self, rank: usize) -> Result<RankMeta, CheckpointError> {
        let dir = self.latest()?;
        let path = dir.join(format!("rank-{rank}.ckpt"));
        let bytes = fs::read(&path).map_err(io(&path))?;
        Ok(RankCheckpoint::decode(&path, &bytes)?.meta)
    }

    /// Load `rank`'s file from the latest checkpoint and check it belongs to a run with the same
    /// identity (world size and algorithm).
    pub fn load_rank(
        &self,
        rank: usize,
        identity: &RunIdentity,
    ) -> Result<RankCheckpoint, CheckpointError> {
        let dir = self.check_latest(identity)?;
        let path = dir.join(format!("rank-{rank}.ckpt"));
        let bytes = fs::read(&path).map_err(io(&path))?;
        let ckpt = RankCheckpoint::decode(&path, &bytes)?;
        check_identity(&dir, &ckpt.meta.identity, identity)?;
        Ok(ckpt)
    }

    /// Load saved rank `saved_rank`'s file from the latest checkpoint for a run on another
    /// number of ranks: the world size may differ, the algorithm settings must be `spec`'s on
    /// the saving world ([`AlgorithmSpec::for_world`]), and `saved_rank` must be one of the
    /// saving run's ranks. Returns the file and the saving run's identity (its world size and
    /// members).
    pub fn load_rank_resized(
        &self,
        saved_rank: usize,
        spec: &AlgorithmSpec,
    ) -> Result<(RankCheckpoint, RunIdentity), CheckpointError> {
        let (dir, saved, expected) = self.check_latest_resized(spec, &[saved_rank])?;
        let path = dir.join(format!("rank-{saved_rank}.ckpt"));
        let bytes = fs::read(&path).map_err(io(&path))?;
        let ckpt = RankCheckpoint::decode(&path, &bytes)?;
        check_identity(&dir, &ckpt.meta.identity, &expected)?;
        Ok((ckpt, saved))
    }

    /// The bytes of saved rank `saved_rank`'s file of the latest checkpoint, checked as
    /// [`load_rank_resized`](Self::load_rank_resized) checks it: what a live rank sends a
    /// replacement, which continues from them with [`Checkpoints::resume_received`]. Returns
    /// the bytes and the iterations the checkpoint holds.
    pub fn latest_rank_bytes(
        &self,
        saved_rank: usize,
        spec: &AlgorithmSpec,
    ) -> Result<(Vec<u8>, u64), CheckpointError> {
        let (dir, _, expected) = self.check_latest_resized(spec, &[saved_rank])?;
        let path = dir.join(format!("rank-{saved_rank}.ckpt"));
        let bytes = fs::read(&path).map_err(io(&path))?;
        let ckpt = RankCheckpoint::decode(&path, &bytes)?;
        check_identity(&dir, &ckpt.meta.identity, &expected)?;
        Ok((bytes, ckpt.meta.iterations_done))
    }

    /// Check, from the manifest alone, that a run of `spec` can continue the latest checkpoint
    /// on another number of ranks from `saved_ranks` (the settings match on the saving world,
    /// every saved rank exists). Returns the checkpoint's directory, the saving run's identity,
    /// and the identity its files must carry.
    pub fn check_latest_resized(
        &self,
        spec: &AlgorithmSpec,
        saved_ranks: &[usize],
    ) -> Result<(PathBuf, RunIdentity, RunIdentity), CheckpointError> {
        let (dir, saved) = self.latest_identity()?;
        let expected = RunIdentity::from_spec(&spec.for_world(saved.world_size), saved.world_size);
        check_identity(&dir, &saved, &expected)?;
        if let Some(bad) = saved_ranks.iter().find(|&&r| r >= saved.world_size) {
            return Err(CheckpointError::Incompatible(format!(
                "saved rank {bad} does not exist: the checkpoint in {} was written by {} \
                 workers (ranks 0..{})",
                dir.display(),
                saved.world_size,
                saved.world_size
            )));
        }
        Ok((dir, saved, expected))
    }
}

/// Refuse a checkpoint written by a run with another world size or algorithm settings.
fn check_identity(
    dir: &Path,
    saved: &RunIdentity,
    identity: &RunIdentity,
) -> Result<(), CheckpointError> {
    if saved.world_size != identity.world_size {
        return Err(CheckpointError::Incompatible(format!(
            "the checkpoint in {} was written by {} workers, this run has {} (use `workers = {}`, \
             or `resume-ranks` to continue it on another number of workers)",
            dir.display(),
            saved.world_size,
            identity.world_size,
            saved.world_size
        )));
    }
    if saved.algorithm != identity.algorithm {
        return Err(CheckpointError::Incompatible(format!(
            "the checkpoint in {} was written with algorithm settings [{}], this run has [{}]",
            dir.display(),
            saved.algorithm,
            identity.algorithm
        )));
    }
    Ok(())
}

fn dtype_name(buffer: &FlatBuffer) -> &'static str {
    match buffer {
        FlatBuffer::F32(_) => "f32",
        FlatBuffer::F64(_) => "f64",
    }
}

fn le_bytes(buffer: &FlatBuffer) -> Vec<u8> {
    match buffer {
        FlatBuffer::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        FlatBuffer::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn from_le_bytes(dtype: &str, bytes: &[u8]) -> Option<FlatBuffer> {
    match dtype {
        "f32" => Some(FlatBuffer::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )),
        "f64" => Some(FlatBuffer::F64(
            bytes
                .chunks_exact(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    f64::from_le_bytes(b)
                })
                .collect(),
        )),
        _ => None,
    }
}

/// The first and second half of a buffer.
fn split_halves(buffer: FlatBuffer) -> (FlatBuffer, FlatBuffer) {
    match buffer {
        FlatBuffer::F32(mut v) => {
            let second = v.split_off(v.len() / 2);
            (FlatBuffer::F32(v), FlatBuffer::F32(second))
        }
        FlatBuffer::F64(mut v) => {
            let second = v.split_off(v.len() / 2);
            (FlatBuffer::F64(v), FlatBuffer::F64(second))
        }
    }
}
