//! Exporting a run's trained model for PyTorch: `localsgd export RUN_DIR FILE` and
//! `localsgd train --export FILE`.
//!
//! The file is safetensors with the PyTorch twin's `state_dict` names and layout (see
//! [`pytorch`](localsgd_models::pytorch): `fc1.weight` `[out, in]`, `fc1.bias`, ...; the CNN's
//! `convs.{i}`, `norms.{i}` with running statistics, `head`), all F32, so
//! `model.load_state_dict(safetensors.torch.load_file(FILE))` loads it into the twin.
//!
//! What is exported:
//! - [`ExportChoice::WorldAverage`] (the default): the average of every rank's final model,
//!   divided by the world size and then summed in rank order (semantics §1), as the thread
//!   backend computes it at the end of `localsgd train`. After local steps the ranks' models
//!   differ; this is the model `summary.json`'s `test_accuracy` describes.
//! - [`ExportChoice::Rank`]: one rank's own final model (`summary.json`'s `ranks[r]`).
//!
//! [`export_run`] reads the run directory's `config.toml` (for the model's shape; the data set
//! is loaded to learn its input width and classes) and its latest checkpoint, which holds every
//! rank's parameters. An overlapped average still pending in that checkpoint is applied first,
//! as the end of training does. A run whose latest checkpoint is its final state (every
//! finished run) exports the same bytes as `--export` on the thread backend; under MPI or NCCL
//! the in-run average's summation order is the backend's, so the two may differ in the last
//! bit of some elements. A run that was stopped exports its latest checkpoint's state, and the
//! report says at which iteration.
//!
//! ```no_run
//! use localsgd_trainer::export::{ExportChoice, export_run};
//! use std::path::Path;
//!
//! let done = export_run(Path::new("runs/latest"), Path::new("model.safetensors"), ExportChoice::WorldAverage)?;
//! println!("exported iteration {} of {} ranks", done.iterations, done.world_size);
//! # Ok::<(), localsgd_trainer::export::ExportError>(())
//! ```

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use localsgd_averagers::AveragerError;
use localsgd_comm::params::{FlatBuffer, FlatParams, ParamSelection, flatten_params, write_params};
use localsgd_comm::{CommError, GroupExt, ThreadWorld, WorkerPanicked};

use crate::config::{ConfigError, TrainConfig, check_export_path};
use localsgd_models::data::DataError;
use localsgd_models::mlp::ModelError;
use localsgd_models::network::{ModelSpec, Network};
use localsgd_models::pytorch::{WeightsError, save_pytorch_safetensors};
use localsgd_pipeline::checkpoint::{CheckpointDir, CheckpointError, RunIdentity};

/// Which model to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportChoice {
    /// The average of every rank's final model.
    WorldAverage,
    /// This rank's own final model.
    Rank(usize),
}

impl std::fmt::Display for ExportChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportChoice::WorldAverage => write!(f, "the world-averaged model"),
            ExportChoice::Rank(r) => write!(f, "rank {r}'s own model"),
        }
    }
}

/// What [`export_run`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// The model exported.
    pub choice: ExportChoice,
    /// Iterations the exported state had trained (its checkpoint's).
    pub iterations: u64,
    /// Ranks of the run.
    pub world_size: usize,
    /// The checkpoint directory read.
    pub checkpoint: PathBuf,
}

/// Everything that can go wrong exporting a run's model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The run directory has no readable `config.toml`.
    #[error(
        "{path}: {reason} (point at a run directory that `localsgd train` wrote: it holds config.toml and checkpoints/)"
    )]
    RunConfig {
        /// The `config.toml` path.
        path: PathBuf,
        /// Why it could not be read.
        reason: String,
    },
    /// A setting (the output file, or the run's saved configuration) is invalid.
    #[error(transparent)]
    Setting(#[from] ConfigError),
    /// The run's data set (read for the model's input width and classes) did not load.
    #[error("loading the run's data set (for the model's shape): {0}")]
    Data(#[from] DataError),
    /// The run's model configuration is invalid.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The checkpoint is missing, damaged or does not fit the configuration.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The chosen rank is not one of the run's.
    #[error("invalid rank {rank}: the run has {world_size} ranks, 0 to {}", world_size - 1)]
    Rank {
        /// The rank asked for.
        rank: usize,
        /// Ranks of the run.
        world_size: usize,
    },
    /// The checkpoint's pending overlapped average does not fit its parameters.
    #[error("rank {rank}: applying the checkpoint's pending average: {source}")]
    Pending {
        /// The rank whose checkpoint it is.
        rank: usize,
        /// What did not fit.
        #[source]
        source: AveragerError,
    },
    /// Averaging the ranks' parameters failed.
    #[error("averaging the ranks' models: {0}")]
    Average(#[from] CommError),
    /// A thread averaging the ranks' models panicked.
    #[error("averaging the ranks' models: {0}")]
    Panicked(#[from] WorkerPanicked),
    /// The file could not be written.
    #[error(transparent)]
    Write(#[from] WeightsError),
}

/// Export `choice` of the run in `run_dir` to `out` (see the module docs). Nothing is written
/// unless every rank's checkpoint reads and fits; the file is written atomically.
pub fn export_run(
    run_dir: &Path,
    out: &Path,
    choice: ExportChoice,
) -> Result<Exported, ExportError> {
    check_export_path(out)?;
    let config_path = run_dir.join("config.toml");
    if !config_path.is_file() {
        return Err(ExportError::RunConfig {
            path: config_path,
            reason: "not found".into(),
        });
    }
    let cfg =
        TrainConfig::from_toml_file(&config_path).map_err(|reason| ExportError::RunConfig {
            path: config_path.clone(),
            reason,
        })?;
    let data = crate::run::load_data(&cfg)?;
    let spec = crate::run::model_config(&cfg, &data.train)?;
    let checkpoints = CheckpointDir::new(run_dir);
    let (dir, identity) = checkpoints.latest_identity()?;
    let world_size = identity.world_size;
    if world_size == 0 {
        return Err(CheckpointError::Incompatible(format!(
            "the checkpoint manifest in {} records a run of 0 ranks",
            dir.display()
        ))
        .into());
    }
    let device = Device::flex();
    let final_model = |rank: usize| final_model(&checkpoints, &identity, &spec, rank, &device);
    let (model, iterations) = match choice {
        ExportChoice::Rank(rank) => {
            if rank >= world_size {
                return Err(ExportError::Rank { rank, world_size });
            }
            final_model(rank)?
        }
        ExportChoice::WorldAverage => {
            // Rank 0's model carries the result; the others contribute their buffers.
            let (first, iterations) = final_model(0)?;
            let flat = flatten_params(&first, &ParamSelection::All)?;
            let layout = flat.layout;
            let mut buffers = vec![flat.buffer];
            for rank in 1..world_size {
                let (model, _) = final_model(rank)?;
                buffers.push(flatten_params(&model, &ParamSelection::All)?.buffer);
            }
            let buffer = average_in_rank_order(buffers)?;
            (
                write_params(first, &FlatParams { layout, buffer })?,
                iterations,
            )
        }
    };
    save_pytorch_safetensors(&model, out)?;
    Ok(Exported {
        choice,
        iterations,
        world_size,
        checkpoint: dir,
    })
}

/// Rank `rank`'s final model from the latest checkpoint: its parameters, with a pending
/// overlapped average applied. Also the iterations it had trained.
fn final_model(
    checkpoints: &CheckpointDir,
    identity: &RunIdentity,
    spec: &ModelSpec,
    rank: usize,
    device: &Device,
) -> Result<(Network, u64), ExportError> {
    let ckpt = checkpoints.load_rank(rank, identity)?;
    let model = ckpt.restore_params(spec.init(0, device)?)?;
    let model = match ckpt.pending_average() {
        Some(pending) => pending
            .apply(model)
            .map_err(|source| ExportError::Pending { rank, source })?,
        None => model,
    };
    Ok((model, ckpt.meta.iterations_done))
}

/// The ranks' buffers averaged as a thread-backend run averages them at its end (divide by the
/// world size, then sum in rank order: [`GroupExt::average_slice`] on a thread world).
fn average_in_rank_order(buffers: Vec<FlatBuffer>) -> Result<FlatBuffer, ExportError> {
    let world = ThreadWorld::new(buffers.len())?;
    let mut results = world.run(|group| {
        let mut mine = buffers
            .get(group.rank())
            .cloned()
            .ok_or_else(|| CommError::InvalidConfig("a rank without a buffer".into()))?;
        match &mut mine {
            FlatBuffer::F32(v) => group.average_slice(v)?,
            FlatBuffer::F64(v) => group.average_slice(v)?,
        }
        Ok::<_, CommError>(mine)
    })?;
    if results.is_empty() {
        return Err(CommError::InvalidConfig("no ranks to average".into()).into());
    }
    Ok(results.swap_remove(0)?)
}
