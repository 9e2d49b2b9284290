//! Checkpoints of a user's own model through the library alone (`checkpoint::Checkpoints`): a
//! two-layer model defined here, 2 thread ranks, SGD with momentum, a batch source over fixed
//! synthetic batches that reports its position. A run is trained with a checkpoint every
//! `EVERY` iterations, dropped two iterations after a checkpoint (the "kill": nothing is saved
//! or finished), resumed into a fresh model and pipeline (fresh `ParamId`s, fresh optimizer)
//! and trained to the end: every rank's parameters equal an uninterrupted run's bit for bit,
//! before and after `Pipeline::finish`. DiLoCo covers `θ` and the outer momentum, post-local SGD
//! with overlap an average pending across the checkpoint.

use burn::module::{Module, Param};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{ModuleOptimizer, SgdConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor, TensorData};
use localsgd_averagers::{OuterOptimizer, OuterSgdConfig};
use localsgd_comm::ThreadWorld;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_pipeline::algorithm::{AlgorithmSpec, build};
use localsgd_pipeline::checkpoint::{CheckpointError, Checkpoints, Publish, RunIdentity};
use localsgd_pipeline::pipeline::{
    BatchSource, DataPosition, Outcome, Pipeline, PipelineOptions, SourceError,
};
use localsgd_pipeline::settings::{AlgorithmKind, OuterSettings, PipelineBuckets};
use std::path::{Path, PathBuf};

/// A checkpoint every this many iterations.
const EVERY: u64 = 4;
/// Iterations of a whole run (not a multiple of `EVERY`: the final state is saved on its own).
const TOTAL: u64 = 11;
/// Where the first attempt is dropped: two iterations after the checkpoint of `2 * EVERY`.
const KILLED_AT: u64 = 2 * EVERY + 2;
/// Batches per epoch and rank (epochs end inside the run and at a checkpoint: position 5 of 5).
const PER_EPOCH: u64 = 5;

/// A user's model: `relu(x W1 + b1) W2`.
#[derive(Module, Debug)]
struct TwoLayer {
    w1: Param<Tensor<2>>,
    b1: Param<Tensor<1>>,
    w2: Param<Tensor<2>>,
}

/// A deterministic value in [-1, 1] for index `i` of stream `seed`.
fn wave(seed: u64, i: u64) -> f32 {
    (seed as f32 * 0.913 + i as f32 * 1.127).sin()
}

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

impl TwoLayer {
    /// The same weights in every run (a fresh run must start where the interrupted one did;
    /// the pipeline's start broadcast gives every rank rank 0's).
    fn new(device: &Device) -> Self {
        let values = |seed, n| (0..n).map(|i| 0.5 * wave(seed, i)).collect::<Vec<_>>();
        Self {
            w1: Param::from_tensor(tensor(values(1, 12), [3, 4], device)),
            b1: Param::from_tensor(tensor(values(2, 4), [4], device)),
            w2: Param::from_tensor(tensor(values(3, 4), [4, 1], device)),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        relu(x.matmul(self.w1.val()) + self.b1.val().unsqueeze::<2>()).matmul(self.w2.val())
    }
}

/// Inputs `[4, 3]` and targets `[4, 1]`.
type Batch = (Tensor<2>, Tensor<2>);

/// Mean squared error.
fn loss(model: &TwoLayer, (x, y): &Batch) -> Tensor<1> {
    let d = model.forward(x.clone()) - y.clone();
    (d.clone() * d).mean()
}

/// Fixed synthetic batches per (rank, epoch, index), `PER_EPOCH` per epoch, with the position a
/// checkpoint saves.
struct Synthetic {
    rank: u64,
    position: DataPosition,
    device: Device,
}

impl Synthetic {
    fn next_epoch(&mut self) {
        self.position = DataPosition {
            epoch: self.position.epoch + 1,
            ..DataPosition::default()
        };
    }
}

impl BatchSource<Batch> for Synthetic {
    fn next_batch(&mut self) -> Result<Option<Batch>, SourceError> {
        let DataPosition {
            epoch, next_batch, ..
        } = self.position;
        if next_batch >= PER_EPOCH {
            return Ok(None);
        }
        self.position.next_batch += 1;
        let seed = 1000 * self.rank + 100 * epoch + 10 * next_batch;
        let x: Vec<f32> = (0..12).map(|i| wave(seed, i)).collect();
        let y: Vec<f32> = (0..4)
            .map(|r| {
                x[3 * r] - 0.5 * x[3 * r + 1] + 0.25 * x[3 * r + 2] + 0.1 * wave(seed + 7, r as u64)
            })
            .collect();
        Ok(Some((
            tensor(x, [4, 3], &self.device),
            tensor(y, [4, 1], &self.device),
        )))
    }

    fn position(&self) -> Option<DataPosition> {
        Some(self.position)
    }
}

/// SGD with momentum: its per-parameter state must re-attach on resume.
fn sgd() -> ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig {
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
        }))
        .init()
}

/// How one attempt starts and ends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Attempt {
    /// From scratch to `TOTAL`, saving the final state.
    Whole,
    /// From scratch, dropped at `KILLED_AT`.
    Killed,
    /// From the latest checkpoint to `TOTAL`, saving the final state.
    Resumed,
}

/// What one rank ends an attempt with.
#[derive(Debug)]
struct RankEnd {
    /// Parameters after the last iteration.
    params: FlatBuffer,
    /// Parameters after `Pipeline::finish` (a pending average applied).
    finished: FlatBuffer,
    /// The checkpoint's iteration, for a resumed attempt.
    resumed_at: Option<u64>,
    /// Where the final state was saved (`None`: not needed, or a killed attempt).
    saved: Option<PathBuf>,
}

fn flat(model: &TwoLayer) -> FlatBuffer {
    flatten_params(model, &ParamSelection::All).unwrap().buffer
}

/// One attempt of a run of `spec` in `run_dir`, on 2 thread ranks.
fn attempt(spec: &AlgorithmSpec, run_dir: &Path, how: Attempt) -> Vec<RankEnd> {
    ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            let device = Device::flex().autodiff();
            let rank = world.rank();
            let checkpoints = Checkpoints::new(run_dir, RunIdentity::from_spec(spec, world.size()));
            let parts = build(spec, &world).unwrap();
            let options = PipelineOptions {
                lr: 0.05,
                checkpoint_every: EVERY,
                ..Default::default()
            };
            let mut pipeline = Pipeline::new(world.clone(), sgd(), options)
                .with_parts(parts)
                .with_checkpointer(checkpoints.checkpointer(Publish::Now));

            let mut model = TwoLayer::new(&device);
            let mut position = DataPosition::default();
            let mut resumed_at = None;
            if how == Attempt::Resumed {
                // A fresh model (new ParamIds) and a fresh optimizer (the pipeline's), as a new
                // process has.
                let resumed = checkpoints.resume(model, &mut pipeline).unwrap();
                assert_eq!(pipeline.iteration(), resumed.iterations_done);
                model = resumed.model;
                position = resumed.data.expect("the source recorded its position");
                resumed_at = Some(resumed.iterations_done);
            }
            let mut source = Synthetic {
                rank: rank as u64,
                position,
                device: device.clone(),
            };
            let until = if how == Attempt::Killed {
                KILLED_AT
            } else {
                TOTAL
            };
            while pipeline.iteration() < until {
                model = match pipeline.run_iteration(model, &mut source, &loss).unwrap() {
                    Outcome::Trained(m, _) => m,
                    Outcome::EndOfData(m) => {
                        source.next_epoch();
                        m
                    }
                };
            }
            let params = flat(&model);
            if how == Attempt::Killed {
                // Dropped as a killed process would be: no final save, no finish.
                return RankEnd {
                    finished: params.clone(),
                    params,
                    resumed_at,
                    saved: None,
                };
            }
            let saved = checkpoints
                .save_final(&mut pipeline, &model, source.position())
                .unwrap();
            let model = pipeline.finish(model).unwrap();
            RankEnd {
                params,
                finished: flat(&model),
                resumed_at,
                saved,
            }
        })
        .unwrap()
}

/// The uninterrupted run and the killed-and-resumed one end with the same parameters on every
/// rank; returns the second run's directory for further checks.
fn killed_and_resumed_equals_uninterrupted(spec: &AlgorithmSpec) -> tempfile::TempDir {
    let whole_dir = tempfile::tempdir().unwrap();
    let whole = attempt(spec, whole_dir.path(), Attempt::Whole);

    let dir = tempfile::tempdir().unwrap();
    attempt(spec, dir.path(), Attempt::Killed);
    let resumed = attempt(spec, dir.path(), Attempt::Resumed);
    for (rank, (w, r)) in whole.iter().zip(&resumed).enumerate() {
        assert_eq!(r.resumed_at, Some(2 * EVERY), "rank {rank}");
        assert_eq!(
            r.params, w.params,
            "rank {rank}: the parameters after {TOTAL} iterations differ from the uninterrupted run's"
        );
        assert_eq!(
            r.finished, w.finished,
            "rank {rank}: the finished parameters differ from the uninterrupted run's"
        );
        // TOTAL is not a multiple of EVERY: both runs saved their final state themselves.
        let final_dir = dir
            .path()
            .join("checkpoints")
            .join(format!("step-{TOTAL:08}"));
        assert_eq!(r.saved.as_deref(), Some(final_dir.as_path()), "rank {rank}");
        assert!(w.saved.is_some(), "rank {rank}");
    }

    // Resuming the final checkpoint and training nothing gives the final parameters back, and
    // `save_final` does not save again.
    let again = attempt(spec, dir.path(), Attempt::Resumed);
    for (rank, (a, r)) in again.iter().zip(&resumed).enumerate() {
        assert_eq!(a.resumed_at, Some(TOTAL), "rank {rank}");
        assert_eq!(a.params, r.params, "rank {rank}");
        assert_eq!(a.finished, r.finished, "rank {rank}");
        assert_eq!(
            a.saved, None,
            "rank {rank}: nothing trained, nothing to save"
        );
    }
    dir
}

/// The files of the checkpoint of `iterations` in `run_dir`, both ranks.
fn rank_files(
    spec: &AlgorithmSpec,
    run_dir: &Path,
    iterations: u64,
) -> Vec<localsgd_pipeline::checkpoint::RankCheckpoint> {
    let checkpoints = Checkpoints::new(run_dir, RunIdentity::from_spec(spec, 2));
    // `latest` names the final checkpoint; read the one asked for by pointing `latest` at it.
    checkpoints.publish(iterations).unwrap();
    (0..2)
        .map(|rank| {
            checkpoints
                .dir()
                .load_rank(rank, checkpoints.identity())
                .unwrap()
        })
        .collect()
}

fn diloco() -> AlgorithmSpec {
    let optimizer: OuterOptimizer = OuterSgdConfig::diloco().into();
    AlgorithmSpec {
        kind: AlgorithmKind::Diloco,
        warmup: 2,
        period: Some(3),
        pipeline_buckets: PipelineBuckets::Off,
        outer: Some(OuterSettings {
            optimizer,
            reduce: optimizer.default_reduce(),
            compression: None,
            streaming: None,
            ..OuterSettings::diloco()
        }),
        ..AlgorithmSpec::default()
    }
}

fn post_local_sgd_overlapped() -> AlgorithmSpec {
    AlgorithmSpec {
        kind: AlgorithmKind::PostLocalSgd,
        // Averages start at steps 3, 7, 11 and are applied 2 steps later: the checkpoints of
        // 4 and 8 iterations hold one pending, and so does the end of the run.
        warmup: 3,
        period: Some(4),
        overlap: 2,
        pipeline_buckets: PipelineBuckets::Off,
        ..AlgorithmSpec::default()
    }
}

#[test]
fn diloco_killed_and_resumed_through_the_library_equals_an_uninterrupted_run() {
    let spec = diloco();
    let dir = killed_and_resumed_equals_uninterrupted(&spec);
    // The resumed checkpoint held θ and the outer momentum.
    for ckpt in rank_files(&spec, dir.path(), 2 * EVERY) {
        let outer = ckpt.outer.expect("an outer state in a DiLoCo checkpoint");
        assert!(outer.outer_steps > 0, "{}", outer.outer_steps);
        assert!(outer.fragments.iter().all(|f| f.momentum.is_some()));
    }
}

#[test]
fn overlapped_post_local_sgd_killed_and_resumed_through_the_library_equals_an_uninterrupted_run() {
    let spec = post_local_sgd_overlapped();
    let dir = killed_and_resumed_equals_uninterrupted(&spec);
    // The resumed checkpoint held an average started and not yet applied.
    for ckpt in rank_files(&spec, dir.path(), 2 * EVERY) {
        let pending = ckpt
            .pending_average()
            .expect("a pending average in the checkpoint");
        assert_eq!(pending.started_at, 7);
        assert_eq!(
            ckpt.meta.data,
            Some(DataPosition {
                epoch: 1,
                next_batch: 3,
                start: 0
            })
        );
    }
}

#[test]
fn resuming_is_refused_with_typed_errors() {
    let spec = post_local_sgd_overlapped();
    let dir = tempfile::tempdir().unwrap();
    // Resume a run of `spec` (with its parts, or on a bare pipeline); every rank's error.
    let resume_into = |spec: &AlgorithmSpec, with_parts: bool| -> Vec<CheckpointError> {
        ThreadWorld::new(2)
            .unwrap()
            .run(|world| {
                let device = Device::flex().autodiff();
                let mut pipeline = Pipeline::new(world.clone(), sgd(), PipelineOptions::default());
                if with_parts {
                    pipeline = pipeline.with_parts(build(spec, &world).unwrap());
                }
                let checkpoints =
                    Checkpoints::new(dir.path(), RunIdentity::from_spec(spec, world.size()));
                match checkpoints.resume(TwoLayer::new(&device), &mut pipeline) {
                    Ok(_) => panic!("resumed"),
                    Err(e) => e,
                }
            })
            .unwrap()
    };
    let resume_with = |spec: &AlgorithmSpec| resume_into(spec, true);
    // Nothing saved yet.
    for e in resume_with(&spec) {
        assert!(matches!(e, CheckpointError::Missing(_)), "{e}");
    }
    attempt(&spec, dir.path(), Attempt::Killed);
    // Other settings: refused by the identity check, naming both.
    let other = AlgorithmSpec {
        period: Some(5),
        ..spec.clone()
    };
    for e in resume_with(&other) {
        assert!(matches!(e, CheckpointError::Incompatible(_)), "{e}");
        assert!(e.to_string().contains("period=Some(4)"), "{e}");
    }
    // The run's identity on a pipeline without its hook and averager: the pipeline refuses
    // the saved states.
    for e in resume_into(&spec, false) {
        assert!(matches!(e, CheckpointError::Restore(_)), "{e}");
        assert!(e.to_string().contains("averager state"), "{e}");
    }
}
