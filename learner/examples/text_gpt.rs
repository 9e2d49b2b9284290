//! A byte-level GPT language model trained through burn-train's `SupervisedTraining` with
//! DiLoCo (or any other algorithm) on 2 thread ranks: the model is localsgd's [`Gpt`], the
//! loaders, metrics and checkpointers are burn-train's; only the strategy is ours. Any text
//! file trains (bytes are the vocabulary); the repository ships one:
//!
//! ```text
//! cargo run --release --example text_gpt -- --text data/text/localsgd-docs.txt --epochs 1
//! ```
//!
//! Flags: `--text FILE` (default `data/text/localsgd-docs.txt`), `--epochs N` (1), `--workers W`
//! (2), `--algorithm ddp|local-sgd|post-local-sgd|hierarchical|diloco|streaming-diloco|slowmo`
//! (diloco), `--warmup N` (20 optimizer steps), `--period N` (DiLoCo's H; default the
//! algorithm's own: 50 for DiLoCo), `--context N` (64), `--out DIR` (runs/text-gpt-learner), `--device
//! cpu|libtorch|libtorch-cuda` (cpu: burn's own backend; the LibTorch ones need the feature
//! `libtorch` and PyTorch installed, book: Performance). The loss
//! and accuracy burn-train reports are per predicted byte: loss in nats per byte, accuracy the
//! share of next bytes predicted right.

use std::path::PathBuf;
use std::sync::Arc;

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use burn_train::checkpoint::KeepLastNCheckpoints;
use burn_train::metric::{AccuracyMetric, LossMetric};
use burn_train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
    TrainingStrategy,
};
use localsgd_learner::{
    AlgorithmKind, AlgorithmSpec, ConsoleRenderer, LocalSgdStrategy, StrategyConfig,
};
use localsgd_models::data::text;
use localsgd_models::gpt::{Gpt, GptConfig};
use localsgd_pipeline::optim::FusedAdamConfig;
use localsgd_trainer::config::DeviceKind;
use localsgd_trainer::run;

/// One window of `context + 1` bytes (inputs and the next byte of each).
#[derive(Clone, Debug)]
struct Window(Vec<f32>);

#[derive(Clone, Debug)]
struct WindowBatcher;

impl Batcher<Window, Tensor<2>> for WindowBatcher {
    fn batch(&self, items: Vec<Window>, device: &Device) -> Tensor<2> {
        let width = items.first().map_or(0, |w| w.0.len());
        let values: Vec<f32> = items.iter().flat_map(|w| w.0.iter().copied()).collect();
        Tensor::from_data(TensorData::new(values, [items.len(), width]), device)
    }
}

/// The model: localsgd's GPT, scored on every predicted byte.
#[derive(Module, Debug)]
struct Model {
    gpt: Gpt,
}

impl Model {
    /// Logits `[B·T, 256]` and targets `[B·T]` of a batch of windows, as burn-train's
    /// classification metrics take them.
    fn predict(&self, windows: Tensor<2>) -> ClassificationOutput {
        // The windows come from `text::load` with the model's own context, so they fit.
        let (logits, targets) = match self.gpt.window_logits_and_targets(windows) {
            Ok(pair) => pair,
            Err(e) => unreachable!("a window that does not fit the model: {e}"),
        };
        let loss = Gpt::loss(logits.clone(), targets.clone());
        let [b, t, v] = logits.dims();
        ClassificationOutput::new(loss, logits.reshape([b * t, v]), targets.reshape([b * t]))
    }
}

impl TrainStep for Model {
    type Input = Tensor<2>;
    type Output = ClassificationOutput;
    fn step(&self, windows: Tensor<2>) -> TrainOutput<ClassificationOutput> {
        let out = self.predict(windows);
        TrainOutput::new(self, out.loss.backward(), out)
    }
}

impl InferenceStep for Model {
    type Input = Tensor<2>;
    type Output = ClassificationOutput;
    fn step(&self, windows: Tensor<2>) -> ClassificationOutput {
        self.predict(windows)
    }
}

struct Args {
    text: PathBuf,
    epochs: usize,
    workers: usize,
    algorithm: AlgorithmKind,
    warmup: u64,
    period: Option<u64>,
    context: usize,
    out: PathBuf,
    device: DeviceKind,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        text: PathBuf::from("data/text/localsgd-docs.txt"),
        epochs: 1,
        workers: 2,
        algorithm: AlgorithmKind::Diloco,
        warmup: 20,
        period: None,
        context: 64,
        out: PathBuf::from("runs/text-gpt-learner"),
        device: DeviceKind::Cpu,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} {v:?}: expected a non-negative integer"))
        };
        match flag.as_str() {
            "--text" => args.text = PathBuf::from(value),
            "--epochs" => args.epochs = number(&value)? as usize,
            "--workers" => args.workers = number(&value)? as usize,
            "--warmup" => args.warmup = number(&value)?,
            "--period" => args.period = Some(number(&value)?),
            "--context" => args.context = number(&value)? as usize,
            "--out" => args.out = PathBuf::from(value),
            "--device" => args.device = DeviceKind::from_name(&value)?,
            "--algorithm" => {
                args.algorithm = AlgorithmKind::from_name(&value).map_err(|e| e.to_string())?;
            }
            other => return Err(format!("unknown flag {other}; see the example's docs")),
        }
    }
    Ok(args)
}

fn windows(data: &localsgd_models::data::Dataset) -> Vec<Window> {
    (0..data.len())
        .filter_map(|i| data.row(i).map(|row| Window(row.to_vec())))
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
    let data = text::load(&args.text, args.context, text::DEFAULT_VALID_FRACTION)
        .map_err(|e| e.to_string())?;
    let train = DataLoaderBuilder::new(WindowBatcher)
        .batch_size(32)
        .shuffle(42)
        .build(InMemDataset::new(windows(&data.train)));
    let valid = DataLoaderBuilder::new(WindowBatcher)
        .batch_size(64)
        .build(InMemDataset::new(windows(&data.test)));

    let period = args.period.or(args.algorithm.default_period()).unwrap_or(4);
    let config = StrategyConfig::new(AlgorithmSpec::of(
        args.algorithm,
        args.warmup,
        period,
        args.workers,
    ))
    .with_workers(args.workers);
    // Every rank on this one device (LibTorch's threads shared out among the ranks).
    let device = run::device_on_host(args.device, 0, args.workers).map_err(|e| e.to_string())?;
    let strategy = Arc::new(
        LocalSgdStrategy::new(config, device.clone())
            .map_err(|e| e.to_string())?
            .with_directory(&args.out),
    );
    let gpt = GptConfig {
        context: args.context,
        ..GptConfig::small()
    }
    .init(0, &device)
    .map_err(|e| e.to_string())?;
    // PyTorch's AdamW, fused (burn's own AdamW defaults to epsilon 1e-5, weight decay 1e-4).
    let adamw = FusedAdamConfig::adamw().init().map_err(|e| e.to_string())?;
    let result = SupervisedTraining::new(&args.out, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        // Loss and accuracy as plain lines (burn-train's TUI is not built in this workspace).
        .renderer(Box::new(ConsoleRenderer::new()))
        .with_default_checkpointers()
        .with_checkpointing_strategy(KeepLastNCheckpoints::new(2))
        .with_training_strategy(TrainingStrategy::Custom(strategy.clone()))
        .num_epochs(args.epochs)
        .summary()
        .launch(Learner::new(Model { gpt }, adamw, 1e-3));
    if let Some(e) = &result.error {
        return Err(e.to_string());
    }
    let traffic = strategy.report().map(|r| r.traffic()).unwrap_or_default();
    println!(
        "trained {} epoch(s) of {} on {} ranks ({} collectives, {} bytes sent, all ranks); \
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
