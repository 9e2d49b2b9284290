//! The run of `mpi_digits`, shared with the test that compares it with thread ranks
//! (`learner/tests/it/mpi.rs` includes this file): the bundled digits as burn `DataLoader`s, a
//! 64-64-10 MLP as a burn-train `TrainStep` / `InferenceStep`, the optimizer, every algorithm by
//! its `--algorithm` name, one `SupervisedTraining` run with a strategy, and the files a rank
//! writes. Both runs go through these functions, so they differ only in where the ranks live.

// The example and the test each use a part.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLoss;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_train::{
    ClassificationOutput, InferenceStep, Learner, LearningResult, SupervisedTraining, TrainOutput,
    TrainStep, TrainingStrategy,
};
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_learner::{
    AlgorithmKind, AlgorithmSpec, ConsoleRenderer, LocalSgdStrategy, StrategyReport,
};
use localsgd_models::mlp::{Mlp, MlpConfig};
use localsgd_pipeline::optim::FusedSgdConfig;

/// Learning rate of the SGD optimizer.
pub const LR: f64 = 0.1;
/// Items per batch, on every rank.
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

/// The `localsgd` binary's digits MLP (64 inputs, one hidden layer of 64, 10 classes), seeded,
/// so every process starts from the same weights.
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
            mlp: config.init(7, device).expect("a valid MLP"),
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

/// The digits' training and test splits as loaders of [`BATCH`] (file order, no shuffling).
/// Every process builds the whole loaders; the strategy gives rank `r` its share.
pub fn loaders() -> Result<(Loader, Loader), String> {
    let data = localsgd_models::data::digits::load().map_err(|e| e.to_string())?;
    let items = |d: &localsgd_models::data::Dataset| -> Vec<Item> {
        (0..d.len())
            .filter_map(|i| {
                d.row(i).map(|x| Item {
                    x: x.to_vec(),
                    y: d.labels()[i],
                })
            })
            .collect()
    };
    let train = DataLoaderBuilder::new(DigitsBatcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(items(&data.train)));
    let test = DataLoaderBuilder::new(DigitsBatcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(items(&data.test)));
    Ok((train, test))
}

/// burn's CPU backend with autodiff.
pub fn device() -> Device {
    Device::flex().autodiff()
}

/// PyTorch's SGD with momentum 0.9 (no dampening, not Nesterov), fused.
pub fn optimizer() -> Result<burn::optim::ModuleOptimizer, String> {
    FusedSgdConfig {
        momentum: 0.9,
        ..FusedSgdConfig::default()
    }
    .init()
    .map_err(|e| e.to_string())
}

/// The settings of `--algorithm name` with `--warmup` and `--period` on `world` ranks (the
/// library's [`AlgorithmSpec::of`]).
pub fn spec(name: &str, world: usize, warmup: u64, period: u64) -> Result<AlgorithmSpec, String> {
    let kind = AlgorithmKind::from_name(name).map_err(|e| e.to_string())?;
    Ok(AlgorithmSpec::of(kind, warmup, period, world))
}

/// `epochs` epochs of the digits through burn-train's `SupervisedTraining` with `strategy`, in
/// the burn-train directory `dir`; the result holds the world-averaged model.
pub fn train(
    dir: &Path,
    strategy: Arc<LocalSgdStrategy>,
    epochs: usize,
) -> Result<LearningResult<Net>, String> {
    train_scheduled(dir, strategy, epochs, LR)
}

/// [`train`] with the learning-rate scheduler `lr`.
pub fn train_scheduled(
    dir: &Path,
    strategy: Arc<LocalSgdStrategy>,
    epochs: usize,
    lr: impl burn::lr_scheduler::LrScheduler + 'static,
) -> Result<LearningResult<Net>, String> {
    let (train, valid) = loaders()?;
    Ok(SupervisedTraining::new(dir, train, valid)
        .with_training_strategy(TrainingStrategy::Custom(strategy))
        .with_application_logger(None)
        // One line per epoch (rank 0 feeds burn-train's events), not burn-train's default
        // renderer, which prints every progress snapshot's debug form without a terminal UI.
        .renderer(Box::new(ConsoleRenderer::new()))
        .num_epochs(epochs)
        .launch(Learner::new(Net::new(&device()), optimizer()?, lr)))
}

/// The share of the test split `model` classifies correctly.
pub fn accuracy(model: &Net) -> Result<f64, String> {
    let (_, test) = loaders()?;
    let (mut right, mut all) = (0usize, 0usize);
    for batch in test.iter() {
        let batch = batch.map_err(|e| format!("{e:?}"))?;
        let n = batch.y.dims()[0];
        let ints = |t: Tensor<1, Int>| {
            t.into_data()
                .try_into_vec_as::<i64>()
                .map_err(|e| format!("{e:?}"))
        };
        let predicted = ints(model.mlp.forward(batch.x).argmax(1).reshape([n]))?;
        let labels = ints(batch.y)?;
        right += predicted
            .iter()
            .zip(&labels)
            .filter(|(p, y)| p == y)
            .count();
        all += n;
    }
    Ok(right as f64 / all.max(1) as f64)
}

/// Every float of a model, in burn's visiting order (the order the strategy averages in).
pub fn params<M: Module>(model: &M) -> Vec<f32> {
    match flatten_params(model, &ParamSelection::All)
        .expect("flatten the parameters")
        .buffer
    {
        FlatBuffer::F32(v) => v,
        FlatBuffer::F64(v) => v.into_iter().map(|x| x as f32).collect(),
    }
}

/// Rank `rank`'s own final parameters in `out`.
pub fn own_file(out: &Path, rank: usize) -> std::path::PathBuf {
    out.join(format!("rank-{rank}.own.f32"))
}

/// The world-averaged parameters rank `rank` returned, in `out`.
pub fn averaged_file(out: &Path, rank: usize) -> std::path::PathBuf {
    out.join(format!("rank-{rank}.averaged.f32"))
}

/// The traffic report rank `rank` holds (every rank's counters), in `out`.
pub fn report_file(out: &Path, rank: usize) -> std::path::PathBuf {
    out.join(format!("rank-{rank}.report.json"))
}

/// `values` as little-endian f32, 4 bytes each.
pub fn write_f32(path: &Path, values: &[f32]) -> std::io::Result<()> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes)
}

/// A file [`write_f32`] wrote.
pub fn read_f32(path: &Path) -> std::io::Result<Vec<f32>> {
    let bytes = std::fs::read(path)?;
    if !bytes.len().is_multiple_of(4) {
        return Err(std::io::Error::other(format!(
            "{}: {} bytes, not a whole number of f32",
            path.display(),
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The report as JSON: per rank its optimizer steps, skipped steps and traffic.
pub fn report_json(report: &StrategyReport) -> serde_json::Value {
    let ranks: Vec<serde_json::Value> = report
        .ranks
        .iter()
        .map(|r| {
            serde_json::json!({
                "rank": r.rank,
                "iterations": r.iterations,
                "skipped_steps": r.skipped_steps,
                "collectives": r.traffic.collectives,
                "bytes": r.traffic.bytes,
                "data_bytes": r.traffic.data_bytes,
            })
        })
        .collect();
    serde_json::json!({ "ranks": ranks })
}
