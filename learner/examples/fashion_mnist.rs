//! A small CNN with batch normalization on Fashion-MNIST, trained through burn-train's
//! `SupervisedTraining` with post-local SGD (or any other algorithm) on 2 thread ranks: the model, loaders, metrics,
//! checkpointers and early stopping are burn-train's; only the strategy is ours.
//!
//! The data is the Debian package `dataset-fashion-mnist` (MIT license):
//!
//! ```text
//! apt-get install dataset-fashion-mnist      # IDX files in /usr/share/datasets/fashion-mnist/
//! cargo run --release -p localsgd-learner --example fashion_mnist -- --epochs 2
//! ```
//!
//! Flags: `--data-dir DIR` (default `/usr/share/datasets/fashion-mnist`), `--epochs N` (2),
//! `--workers W` (2), `--algorithm ddp|local-sgd|post-local-sgd|hierarchical|diloco|
//! streaming-diloco|slowmo` (post-local-sgd; hierarchical averages pairs every period and all
//! ranks every two, streaming-diloco syncs 2 fragments), `--warmup N` (100 optimizer steps),
//! `--period N` (4; DiLoCo's H), `--items N` (train on the first N images; default
//! all 60,000), `--out DIR` (runs/fashion-mnist-learner), `--device cpu|libtorch|libtorch-cuda`
//! (cpu: burn's own backend; the LibTorch ones need the feature `libtorch` and PyTorch
//! installed, book: Performance), `--on-rank-failure abort|continue|replace` (abort),
//! `--fail-at R:S` (rehearse a failure: rank R's thread panics in its S-th optimizer step, once;
//! a replacement does not).
//!
//! It prints the training's wall time (`training took S s`); after a failure the run
//! directory's `membership.csv` holds the recovery (`bench/learner-rank-failure` reads both).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use burn::lr_scheduler::{LrScheduler, LrSchedulerRecord};

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLoss;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_train::checkpoint::KeepLastNCheckpoints;
use burn_train::metric::{AccuracyMetric, LossMetric};
use burn_train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
    TrainingStrategy,
};
use localsgd_learner::{
    AlgorithmKind, AlgorithmSpec, ConsoleRenderer, LocalSgdStrategy, OnRankFailure, StrategyConfig,
};
use localsgd_models::cnn::{Cnn, CnnConfig};
use localsgd_pipeline::optim::FusedSgdConfig;
use localsgd_trainer::config::DeviceKind;
use localsgd_trainer::run;

#[derive(Clone, Debug)]
struct Image {
    pixels: Vec<f32>,
    label: u32,
}

#[derive(Clone, Debug)]
struct ImageBatch {
    images: Tensor<2>,
    labels: Tensor<1, Int>,
}

#[derive(Clone, Debug)]
struct ImageBatcher;

impl Batcher<Image, ImageBatch> for ImageBatcher {
    fn batch(&self, items: Vec<Image>, device: &Device) -> ImageBatch {
        let pixels: Vec<f32> = items
            .iter()
            .flat_map(|i| i.pixels.iter().copied())
            .collect();
        let labels: Vec<i64> = items.iter().map(|i| i.label as i64).collect();
        ImageBatch {
            images: Tensor::from_data(TensorData::new(pixels, [items.len(), 784]), device),
            labels: Tensor::from_data(TensorData::new(labels, [items.len()]), device),
        }
    }
}

/// The model: localsgd's CNN (conv 3x3 -> BatchNorm -> ReLU -> max-pool, twice, then Linear).
#[derive(Module, Debug)]
struct Model {
    cnn: Cnn,
}

impl Model {
    fn classify(&self, batch: ImageBatch) -> ClassificationOutput {
        let logits = self.cnn.forward(batch.images);
        let loss = CrossEntropyLoss::new(None, &logits.device())
            .forward(logits.clone(), batch.labels.clone());
        ClassificationOutput::new(loss, logits, batch.labels)
    }
}

impl TrainStep for Model {
    type Input = ImageBatch;
    type Output = ClassificationOutput;
    fn step(&self, batch: ImageBatch) -> TrainOutput<ClassificationOutput> {
        let out = self.classify(batch);
        TrainOutput::new(self, out.loss.backward(), out)
    }
}

impl InferenceStep for Model {
    type Input = ImageBatch;
    type Output = ClassificationOutput;
    fn step(&self, batch: ImageBatch) -> ClassificationOutput {
        self.classify(batch)
    }
}

struct Args {
    data_dir: PathBuf,
    epochs: usize,
    workers: usize,
    algorithm: AlgorithmKind,
    warmup: u64,
    period: u64,
    items: Option<usize>,
    out: PathBuf,
    device: DeviceKind,
    on_rank_failure: OnRankFailure,
    /// The rank whose thread panics, and in which of its optimizer steps.
    fail_at: Option<(usize, usize)>,
}

/// The learning rate 0.05; rank `fail_at.0`'s thread panics in its `fail_at.1`-th step (once:
/// the clones of the learner share the counters, and a replacement runs on a thread of the
/// same name).
#[derive(Clone)]
struct FailAt {
    fail_at: Option<(usize, usize)>,
    steps: Arc<AtomicUsize>,
    fired: Arc<AtomicBool>,
}

impl LrScheduler for FailAt {
    fn step(&mut self) -> f64 {
        if let Some((rank, step)) = self.fail_at
            && std::thread::current().name() == Some(format!("localsgd-rank-{rank}").as_str())
            && self.steps.fetch_add(1, Ordering::SeqCst) + 1 == step
            && !self.fired.swap(true, Ordering::SeqCst)
        {
            panic!("rank {rank} fails on purpose in its optimizer step {step} (--fail-at)");
        }
        0.05
    }

    fn to_record(&self) -> LrSchedulerRecord {
        LrSchedulerRecord::new()
    }

    fn load_record(&mut self, _: LrSchedulerRecord) {}
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        data_dir: PathBuf::from("/usr/share/datasets/fashion-mnist"),
        epochs: 2,
        workers: 2,
        algorithm: AlgorithmKind::PostLocalSgd,
        warmup: 100,
        period: 4,
        items: None,
        out: PathBuf::from("runs/fashion-mnist-learner"),
        device: DeviceKind::Cpu,
        on_rank_failure: OnRankFailure::Abort,
        fail_at: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} {v:?}: expected a non-negative integer"))
        };
        match flag.as_str() {
            "--data-dir" => args.data_dir = PathBuf::from(value),
            "--epochs" => args.epochs = number(&value)? as usize,
            "--workers" => args.workers = number(&value)? as usize,
            "--warmup" => args.warmup = number(&value)?,
            "--period" => args.period = number(&value)?,
            "--items" => args.items = Some(number(&value)? as usize),
            "--out" => args.out = PathBuf::from(value),
            "--device" => args.device = DeviceKind::from_name(&value)?,
            "--on-rank-failure" => {
                args.on_rank_failure = value.parse::<OnRankFailure>().map_err(|e| e.to_string())?
            }
            "--fail-at" => {
                let parsed = value
                    .split_once(':')
                    .and_then(|(r, s)| Some((r.parse().ok()?, s.parse().ok()?)));
                args.fail_at = Some(parsed.ok_or_else(|| {
                    format!("--fail-at {value:?}: expected RANK:STEP, e.g. 1:20")
                })?);
            }
            "--algorithm" => {
                args.algorithm = AlgorithmKind::from_name(&value).map_err(|e| e.to_string())?;
            }
            other => return Err(format!("unknown flag {other}; see the example's docs")),
        }
    }
    Ok(args)
}

fn images(data: &localsgd_models::data::Dataset, limit: Option<usize>) -> Vec<Image> {
    let n = limit.map_or(data.len(), |l| l.min(data.len()));
    (0..n)
        .filter_map(|i| {
            data.row(i).map(|row| Image {
                pixels: row.to_vec(),
                label: data.labels()[i],
            })
        })
        .collect()
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let data = localsgd_models::data::idx::load_dir(&args.data_dir).map_err(|e| {
        format!(
            "{e}\nFashion-MNIST is not in {}: `apt-get install dataset-fashion-mnist` puts it in \
             /usr/share/datasets/fashion-mnist, or pass --data-dir with the four IDX files",
            args.data_dir.display()
        )
    })?;
    if data.train.dim() != 784 {
        return Err(format!(
            "{}: images of {} pixels; this example's CNN takes 28x28",
            args.data_dir.display(),
            data.train.dim()
        ));
    }
    let train = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(64)
        .shuffle(42)
        .build(InMemDataset::new(images(&data.train, args.items)));
    let valid = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(256)
        .build(InMemDataset::new(images(&data.test, None)));

    let config = StrategyConfig::new(AlgorithmSpec::of(
        args.algorithm,
        args.warmup,
        args.period,
        args.workers,
    ))
    .with_workers(args.workers)
    .with_on_rank_failure(args.on_rank_failure);
    // Every rank on this one device (LibTorch's threads shared out among the ranks).
    let device = run::device_on_host(args.device, 0, args.workers).map_err(|e| e.to_string())?;
    let strategy = Arc::new(
        LocalSgdStrategy::new(config, device.clone())
            .map_err(|e| e.to_string())?
            .with_directory(&args.out),
    );
    let model = Model {
        cnn: CnnConfig {
            side: 28,
            channels: vec![8, 16],
            classes: 10,
        }
        .init(0, &device)
        .map_err(|e| e.to_string())?,
    };
    // PyTorch's SGD with momentum 0.9, fused.
    let optimizer = FusedSgdConfig {
        momentum: 0.9,
        ..FusedSgdConfig::default()
    }
    .init()
    .map_err(|e| e.to_string())?;
    let lr = FailAt {
        fail_at: args.fail_at,
        steps: Arc::default(),
        fired: Arc::default(),
    };
    let started = Instant::now();
    let result = SupervisedTraining::new(&args.out, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        // Loss and accuracy as plain lines (burn-train's TUI is not built in this workspace).
        .renderer(Box::new(ConsoleRenderer::new()))
        .with_default_checkpointers()
        .with_checkpointing_strategy(KeepLastNCheckpoints::new(2))
        .with_training_strategy(TrainingStrategy::Custom(strategy.clone()))
        .num_epochs(args.epochs)
        .summary()
        .launch(Learner::new(model, optimizer, lr));
    let took = started.elapsed().as_secs_f64();
    if let Some(e) = &result.error {
        return Err(e.to_string());
    }
    println!("training took {took:.3} s");
    let traffic = strategy.report().map(|r| r.traffic()).unwrap_or_default();
    println!(
        "trained {} epochs of {} on {} ranks ({} collectives, {} bytes sent, all ranks); \
         run directory {}",
        args.epochs,
        args.algorithm.name(),
        args.workers,
        traffic.collectives,
        traffic.bytes,
        args.out.display()
    );
    Ok(())
}
