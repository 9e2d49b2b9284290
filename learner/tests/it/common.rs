//! A burn-train model, data and runs shared by the strategy's tests: the binary's digits MLP
//! (64-64-10) as a `TrainStep` / `InferenceStep`, the bundled digits as a burn `DataLoader`,
//! and the same run through `SupervisedTraining` + `LocalSgdStrategy` and through the
//! localsgd `Pipeline`.

use std::path::Path;
use std::sync::Arc;

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::tensor::Device;
use burn_train::checkpoint::KeepLastNCheckpoints;
use burn_train::{Learner, LearningResult, SupervisedTraining, TrainingStrategy};
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_comm::{GroupExt, ThreadWorld};
use localsgd_learner::{AlgorithmSpec, LocalSgdStrategy, StrategyConfig};
use localsgd_pipeline::algorithm;
use localsgd_pipeline::checkpoint::{Checkpoints, RunIdentity};
use localsgd_pipeline::pipeline::{IterSource, Outcome, Pipeline, PipelineOptions};
use localsgd_trainer::config::TrainConfig;

// The model, items, batcher and constants are the `mpi_digits` example's (one definition for
// the example, its MPI test and these tests).
#[path = "../../examples/mpi_digits/digits.rs"]
pub mod digits;

pub use digits::{BATCH, Batch, DigitsBatcher, Item, LR, Loader, Net};

/// The digits' training and test splits as loaders of 32 (file order, no shuffling).
pub fn loaders() -> (Loader, Loader) {
    loaders_shuffled(None)
}

/// [`loaders`], the training loader shuffled with `seed` when given.
pub fn loaders_shuffled(seed: Option<u64>) -> (Loader, Loader) {
    let data = localsgd_models::data::digits::load().unwrap();
    let items = |d: &localsgd_models::data::Dataset| -> Vec<Item> {
        (0..d.len())
            .map(|i| Item {
                x: d.row(i).unwrap().to_vec(),
                y: d.labels()[i],
            })
            .collect()
    };
    let mut train = DataLoaderBuilder::new(DigitsBatcher).batch_size(BATCH);
    if let Some(seed) = seed {
        train = train.shuffle(seed);
    }
    let train = train.build(InMemDataset::new(items(&data.train)));
    let test = DataLoaderBuilder::new(DigitsBatcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(items(&data.test)));
    (train, test)
}

pub fn device() -> Device {
    Device::flex().autodiff()
}

pub fn optimizer() -> burn::optim::ModuleOptimizer {
    localsgd_trainer::run::optimizer(&TrainConfig {
        momentum: 0.9,
        ..TrainConfig::default()
    })
    .expect("valid optimizer settings")
}

/// `epochs` epochs through `SupervisedTraining` with `strategy` (kept by the caller, to read
/// its report and the ranks' own models).
pub fn run_with_strategy(
    dir: &Path,
    strategy: Arc<LocalSgdStrategy>,
    epochs: usize,
    lr: f64,
) -> LearningResult<Net> {
    run_with_strategy_on(dir, strategy, epochs, lr, loaders())
}

/// [`run_with_strategy`] on the given loaders.
pub fn run_with_strategy_on(
    dir: &Path,
    strategy: Arc<LocalSgdStrategy>,
    epochs: usize,
    lr: f64,
    (train, valid): (Loader, Loader),
) -> LearningResult<Net> {
    SupervisedTraining::new(dir, train, valid)
        .with_training_strategy(TrainingStrategy::Custom(strategy))
        .with_application_logger(None)
        .num_epochs(epochs)
        .launch(Learner::new(Net::new(&device()), optimizer(), lr))
}

/// `epochs` epochs through `SupervisedTraining` with the strategy; the world-averaged model.
pub fn run_strategy(
    dir: &Path,
    config: StrategyConfig,
    epochs: usize,
    resume_from: Option<usize>,
    customize: impl FnOnce(SupervisedTraining<Net>) -> SupervisedTraining<Net>,
) -> LearningResult<Net> {
    run_strategy_with_lr(dir, config, epochs, resume_from, LR, customize)
}

/// [`run_strategy`] with learning rate `lr`.
pub fn run_strategy_with_lr(
    dir: &Path,
    config: StrategyConfig,
    epochs: usize,
    resume_from: Option<usize>,
    lr: f64,
    customize: impl FnOnce(SupervisedTraining<Net>) -> SupervisedTraining<Net>,
) -> LearningResult<Net> {
    run_strategy_on(dir, config, epochs, resume_from, lr, loaders(), customize)
}

/// [`run_strategy_with_lr`] on the given loaders.
pub fn run_strategy_on(
    dir: &Path,
    config: StrategyConfig,
    epochs: usize,
    resume_from: Option<usize>,
    lr: f64,
    (train, valid): (Loader, Loader),
    customize: impl FnOnce(SupervisedTraining<Net>) -> SupervisedTraining<Net>,
) -> LearningResult<Net> {
    let strategy = LocalSgdStrategy::new(config, device())
        .unwrap()
        .with_directory(dir);
    let mut training = SupervisedTraining::new(dir, train, valid)
        .with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))
        .with_default_checkpointers()
        .with_checkpointing_strategy(KeepLastNCheckpoints::new(3))
        .with_application_logger(None)
        .num_epochs(epochs);
    if let Some(epoch) = resume_from {
        training = training.checkpoint(epoch);
    }
    training = customize(training);
    training.launch(Learner::new(Net::new(&device()), optimizer(), lr))
}

/// What a run through the localsgd `Pipeline` ends with.
pub struct PipelineRun {
    /// Each rank's own final parameters, in rank order.
    pub ranks: Vec<Vec<f32>>,
    /// The world average of the final parameters (as every rank computes it).
    pub averaged: Vec<f32>,
}

/// The same run through the localsgd `Pipeline`: `config.workers` thread ranks, each on its
/// contiguous share of the items, `epochs` epochs.
pub fn run_pipeline(config: &StrategyConfig, epochs: usize) -> PipelineRun {
    run_pipeline_accumulating(config, epochs, 1)
}

/// [`run_pipeline`] with `accumulate` micro-batches per optimizer step.
pub fn run_pipeline_accumulating(
    config: &StrategyConfig,
    epochs: usize,
    accumulate: usize,
) -> PipelineRun {
    run_pipeline_epochs(
        &config.algorithm,
        config.workers,
        accumulate,
        (1, epochs),
        None,
    )
}

/// The pipeline on `workers` thread ranks, each on its contiguous share of the items, for
/// epochs `from..=to`. With `checkpoints`, a run directory: `from > 1` resumes each rank from
/// its own saved rank's file of the latest checkpoint there (written by any number of ranks),
/// and the last epoch is saved there.
pub fn run_pipeline_epochs(
    spec: &AlgorithmSpec,
    workers: usize,
    accumulate: usize,
    (from, to): (usize, usize),
    checkpoints: Option<&Path>,
) -> PipelineRun {
    let (train, _) = loaders();
    let world = ThreadWorld::new(workers).unwrap();
    let results = world
        .run(|group| {
            let (r, w) = (group.rank(), group.size());
            let spec = spec.for_world(w);
            let checkpoints =
                checkpoints.map(|dir| Checkpoints::new(dir, RunIdentity::from_spec(&spec, w)));
            let options = PipelineOptions {
                lr: LR,
                accumulate,
                ..PipelineOptions::default()
            };
            let mut pipeline = Pipeline::new(group.clone(), optimizer(), options)
                .with_parts(algorithm::build(&spec, &group).unwrap());
            let mut model = Net::new(&device());
            if let (true, Some(c)) = (from > 1, &checkpoints) {
                model = c.resume_from(r, &spec, model, &mut pipeline).unwrap().model;
            }
            let n = train.num_items();
            let shard = train.slice(r * n / w, (r + 1) * n / w).to_device(&device());
            let loss = |m: &Net, b: &Batch| m.classify(b.clone()).loss;
            for _ in from..=to {
                let mut source = IterSource(shard.iter().map(|b| b.unwrap()));
                loop {
                    match pipeline.run_iteration(model, &mut source, &loss).unwrap() {
                        Outcome::Trained(m, _) => model = m,
                        Outcome::EndOfData(m) => {
                            model = m;
                            break;
                        }
                    }
                }
            }
            if let Some(c) = &checkpoints {
                c.save_final(&mut pipeline, &model, None).unwrap();
            }
            let model = pipeline.finish(model).unwrap();
            let own = params(&model);
            let mut averaged = own.clone();
            group.average_slice(&mut averaged).unwrap();
            (own, averaged)
        })
        .unwrap();
    let averaged = results[0].1.clone();
    PipelineRun {
        ranks: results.into_iter().map(|(own, _)| own).collect(),
        averaged,
    }
}

/// Every float of a model, in visiting order.
pub fn params<M: Module>(model: &M) -> Vec<f32> {
    match flatten_params(model, &ParamSelection::All).unwrap().buffer {
        FlatBuffer::F32(v) => v,
        FlatBuffer::F64(v) => v.into_iter().map(|x| x as f32).collect(),
    }
}
