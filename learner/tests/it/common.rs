//! A burn-train model, data and runs shared by the strategy's tests: the binary's digits MLP
//! (64-64-10) as a `TrainStep` / `InferenceStep`, the bundled digits as a burn `DataLoader`,
//! and the same run through `SupervisedTraining` + `LocalSgdStrategy` and through the
//! localsgd `Pipeline`.

use std::path::Path;
use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLoss;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_train::checkpoint::KeepLastNCheckpoints;
use burn_train::{
    ClassificationOutput, InferenceStep, Learner, LearningResult, SupervisedTraining, TrainOutput,
    TrainStep, TrainingStrategy,
};
use localsgd_comm::ThreadWorld;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_learner::{LocalSgdStrategy, StrategyConfig};
use localsgd_trainer::algorithm;
use localsgd_trainer::config::TrainConfig;
use localsgd_trainer::model::{Mlp, MlpConfig};
use localsgd_trainer::pipeline::{IterSource, Outcome, Pipeline, PipelineOptions};

pub const LR: f64 = 0.1;
pub const BATCH: usize = 32;

#[derive(Clone, Debug)]
pub struct Item {
    pub x: Vec<f32>,
    pub y: u32,
}

#[derive(Clone, Debug)]
pub struct Batch {
    pub x: Tensor<2>,
    pub y: Tensor<1, Int>,
}

#[derive(Clone, Debug, Default)]
pub struct DigitsBatcher;

impl Batcher<Item, Batch> for DigitsBatcher {
    fn batch(&self, items: Vec<Item>, device: &Device) -> Batch {
        let dim = items[0].x.len();
        let x: Vec<f32> = items.iter().flat_map(|i| i.x.iter().copied()).collect();
        let y: Vec<i64> = items.iter().map(|i| i.y as i64).collect();
        Batch {
            x: Tensor::from_data(TensorData::new(x, [items.len(), dim]), device),
            y: Tensor::from_data(TensorData::new(y, [items.len()]), device),
        }
    }
}

#[derive(Module, Debug)]
pub struct Net {
    pub mlp: Mlp,
}

impl Net {
    pub fn new(device: &Device) -> Self {
        let config = MlpConfig {
            input: 64,
            hidden: vec![64],
            classes: 10,
        };
        Net {
            mlp: config.init(7, device).unwrap(),
        }
    }

    pub fn classify(&self, batch: Batch) -> ClassificationOutput {
        let logits = self.mlp.forward(batch.x);
        let loss =
            CrossEntropyLoss::new(None, &logits.device()).forward(logits.clone(), batch.y.clone());
        ClassificationOutput::new(loss, logits, batch.y)
    }
}

impl TrainStep for Net {
    type Input = Batch;
    type Output = ClassificationOutput;
    fn step(&self, batch: Batch) -> TrainOutput<ClassificationOutput> {
        let out = self.classify(batch);
        TrainOutput::new(self, out.loss.backward(), out)
    }
}

impl InferenceStep for Net {
    type Input = Batch;
    type Output = ClassificationOutput;
    fn step(&self, batch: Batch) -> ClassificationOutput {
        self.classify(batch)
    }
}

pub type Loader = Arc<dyn DataLoader<Batch>>;

/// The digits' training and test splits as loaders of 32 (file order, no shuffling).
pub fn loaders() -> (Loader, Loader) {
    let data = localsgd_trainer::data::digits::load().unwrap();
    let items = |d: &localsgd_trainer::data::Dataset| -> Vec<Item> {
        (0..d.len())
            .map(|i| Item {
                x: d.row(i).unwrap().to_vec(),
                y: d.labels()[i],
            })
            .collect()
    };
    let train = DataLoaderBuilder::new(DigitsBatcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(items(&data.train)));
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
}

/// `epochs` epochs through `SupervisedTraining` with the strategy; rank 0's final model.
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
    let (train, valid) = loaders();
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

/// The same run through the localsgd `Pipeline`: 2 thread ranks, each on its contiguous half
/// of the items, `epochs` epochs; rank 0's final parameters.
pub fn run_pipeline(config: &StrategyConfig, epochs: usize) -> Vec<f32> {
    run_pipeline_accumulating(config, epochs, 1)
}

/// [`run_pipeline`] with `accumulate` micro-batches per optimizer step.
pub fn run_pipeline_accumulating(
    config: &StrategyConfig,
    epochs: usize,
    accumulate: usize,
) -> Vec<f32> {
    let (train, _) = loaders();
    let world = ThreadWorld::new(config.workers).unwrap();
    let spec = TrainConfig {
        algorithm: config.algorithm,
        workers: config.workers,
        warmup: config.warmup,
        period: config.period.unwrap_or(1),
        ..TrainConfig::default()
    }
    .algorithm_spec()
    .unwrap();
    let results = world
        .run(|group| {
            let parts = algorithm::build(&spec, &group).unwrap();
            let options = PipelineOptions {
                lr: LR,
                accumulate,
                ..PipelineOptions::default()
            };
            let mut pipeline = Pipeline::new(group.clone(), optimizer(), options);
            if let Some((hook, reducer)) = parts.sync {
                pipeline = pipeline.with_gradient_sync(hook, reducer);
            }
            if let Some(averager) = parts.averager {
                pipeline = pipeline.with_averager(averager);
            }
            let (r, w) = (group.rank(), group.size());
            let n = train.num_items();
            let shard = train.slice(r * n / w, (r + 1) * n / w).to_device(&device());
            let loss = |m: &Net, b: &Batch| m.classify(b.clone()).loss;
            let mut model = Net::new(&device());
            for _ in 0..epochs {
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
            let model = pipeline.finish(model).unwrap();
            params(&model)
        })
        .unwrap();
    results.into_iter().next().unwrap()
}

/// Every float of a model, in visiting order.
pub fn params<M: Module>(model: &M) -> Vec<f32> {
    match flatten_params(model, &ParamSelection::All).unwrap().buffer {
        FlatBuffer::F32(v) => v,
        FlatBuffer::F64(v) => v.into_iter().map(|x| x as f32).collect(),
    }
}
