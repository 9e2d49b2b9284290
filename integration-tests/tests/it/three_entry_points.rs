//! One loop, three entry points: the `localsgd` binary's library path (`run::train_threads`), a
//! user's own loop over the localsgd `Pipeline`, and burn-train's `Learner` with the
//! `LocalSgdStrategy` end with bit-identical parameters on every rank, for every algorithm, on
//! the same data order, initial weights, loss, optimizer and algorithm settings (one
//! `TrainConfig`; its `algorithm_spec()` is the spec of the other two).
//!
//! The binary shards with PyTorch's `DistributedSampler` rule (rank r takes positions r, r + W,
//! … of the padded order) and the strategy gives rank r the contiguous slice
//! `[r·n/W, (r+1)·n/W)` of the burn `DataLoader`'s items: the learner's items are the binary's
//! shards laid end to end (rank 0's sampler indices, then rank 1's, …; the padding included), so
//! each rank sees the same samples in the same batches. The training set (403 rows) is not a
//! multiple of the world size (the sampler pads) nor of the batch size (each epoch ends with a
//! smaller batch), which both sides batch alike.

use std::path::Path;
use std::sync::Arc;

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
    TrainingStrategy,
};
use localsgd_comm::ThreadWorld;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_learner::{LocalSgdStrategy, StrategyConfig};
use localsgd_models::data::{Dataset, ShardSampler, TrainTest};
use localsgd_models::mlp::{Mlp, MlpConfig};
use localsgd_models::network::Classify;
use localsgd_pipeline::algorithm::{self, AlgorithmSpec};
use localsgd_pipeline::pipeline::{IterSource, Outcome, Pipeline, PipelineOptions};
use localsgd_trainer::config::{AlgorithmKind, DatasetKind, TrainConfig};
use localsgd_trainer::run;

const EPOCHS: u64 = 3;

/// 2 thread ranks, the synthetic data (403 training rows of 16 features, 4 classes), an MLP
/// 16-16-4, batches of 32 in file order, 3 epochs of SGD (lr 0.1, momentum 0.9), no logging.
fn config(algorithm: AlgorithmKind) -> TrainConfig {
    TrainConfig {
        workers: 2,
        algorithm,
        warmup: 0,
        period: None,
        dataset: DatasetKind::Synthetic,
        synthetic_samples: 503,
        synthetic_dim: 16,
        synthetic_classes: 4,
        hidden: vec![16],
        batch_size: 32,
        shuffle: false,
        seed: 3,
        lr: 0.1,
        momentum: 0.9,
        epochs: EPOCHS,
        steps: None,
        log_every: 0,
        eval_every: 0,
        checkpoint_every: 0,
        progress: false,
        timeout_secs: 60,
        ..TrainConfig::default()
    }
}

#[derive(Clone, Debug)]
struct Item {
    x: Vec<f32>,
    y: u32,
}

#[derive(Clone, Debug)]
struct Batch {
    x: Tensor<2>,
    y: Tensor<1, Int>,
}

#[derive(Clone, Debug, Default)]
struct RowBatcher;

impl Batcher<Item, Batch> for RowBatcher {
    fn batch(&self, items: Vec<Item>, device: &Device) -> Batch {
        let dim = items[0].x.len();
        let x: Vec<f32> = items.iter().flat_map(|i| i.x.iter().copied()).collect();
        let y: Vec<i64> = items.iter().map(|i| i64::from(i.y)).collect();
        Batch {
            x: Tensor::from_data(TensorData::new(x, [items.len(), dim]), device),
            y: Tensor::from_data(TensorData::new(y, [items.len()]), device),
        }
    }
}

/// A user's model: the binary's MLP as a burn-train `TrainStep` / `InferenceStep`, and as a
/// [`Classify`] for the binary's loss ([`run::loss`]) in the user's pipeline loop.
#[derive(Module, Debug)]
struct Net {
    mlp: Mlp,
}

impl Net {
    fn new(cfg: &TrainConfig, data: &TrainTest, device: &Device) -> Self {
        let config = MlpConfig {
            input: data.train.dim(),
            hidden: cfg.hidden.clone(),
            classes: data.train.num_classes(),
        };
        Net {
            mlp: config.init(cfg.seed, device).unwrap(),
        }
    }

    fn classify(&self, batch: Batch) -> ClassificationOutput {
        let loss = localsgd_models::network::loss(self, &(batch.x.clone(), batch.y.clone()));
        let logits = self.logits(batch.x);
        ClassificationOutput::new(loss, logits, batch.y)
    }
}

impl Classify for Net {
    fn logits(&self, x: Tensor<2>) -> Tensor<2> {
        self.mlp.forward(x)
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

fn device() -> Device {
    Device::flex().autodiff()
}

/// Every float of a model, in traversal order.
fn params<M: Module>(model: &M) -> Vec<f32> {
    f32s(flatten_params(model, &ParamSelection::All).unwrap().buffer)
}

fn f32s(buffer: FlatBuffer) -> Vec<f32> {
    match buffer {
        FlatBuffer::F32(v) => v,
        FlatBuffer::F64(v) => panic!("f64 parameters ({} of them)", v.len()),
    }
}

/// Rank `rank`'s batches of one epoch, as the binary's sampler cuts them (the same every
/// epoch: no shuffling).
fn shard_batches(cfg: &TrainConfig, data: &Dataset, rank: usize) -> Vec<Vec<usize>> {
    ShardSampler::new(data.len(), cfg.workers, rank)
        .unwrap()
        .batches(0, cfg.batch_size)
        .unwrap()
}

/// The binary's library path: each rank's own final parameters.
fn binary(cfg: &TrainConfig, data: &TrainTest) -> Vec<Vec<f32>> {
    run::train_threads(cfg, data, None, None)
        .unwrap()
        .into_iter()
        .map(|outcome| f32s(outcome.result.params))
        .collect()
}

/// A user's loop over the `Pipeline`, built as the binary builds its own: `run::optimizer`,
/// the algorithm's hook and averager, the learning rate and accumulation of `cfg`; each rank
/// on its sampler's batches, `EPOCHS` epochs.
fn pipeline_loop(cfg: &TrainConfig, spec: &AlgorithmSpec, data: &TrainTest) -> Vec<Vec<f32>> {
    let world = ThreadWorld::new(cfg.workers).unwrap();
    world
        .run(|group| {
            let device = device();
            let parts = algorithm::build(spec, &group).unwrap();
            let options = PipelineOptions {
                lr: cfg.lr,
                accumulate: cfg.accumulate,
                accumulation: cfg.accumulation,
                broadcast_start: cfg.broadcast_start,
                buffers: cfg.buffers,
                ..PipelineOptions::default()
            };
            let mut pipeline = Pipeline::new(group.clone(), run::optimizer(cfg).unwrap(), options);
            if let Some((hook, reducer)) = parts.sync {
                pipeline = pipeline.with_gradient_sync(hook, reducer);
            }
            if let Some(averager) = parts.averager {
                pipeline = pipeline.with_averager(averager);
            }
            let batches = shard_batches(cfg, &data.train, group.rank());
            let loss =
                |m: &Net, b: &(Tensor<2>, Tensor<1, Int>)| localsgd_models::network::loss(m, b);
            let mut model = Net::new(cfg, data, &device);
            for _ in 0..EPOCHS {
                let mut source = IterSource(
                    batches
                        .iter()
                        .map(|b| data.train.batch_tensors(b, &device).unwrap()),
                );
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
            params(&pipeline.finish(model).unwrap())
        })
        .unwrap()
}

/// The training items in the order the strategy's contiguous slices give each rank its
/// sampler's shard: rank 0's indices, then rank 1's, …
fn learner_items(cfg: &TrainConfig, data: &Dataset) -> Vec<Item> {
    (0..cfg.workers)
        .flat_map(|rank| shard_batches(cfg, data, rank).into_iter().flatten())
        .map(|i| Item {
            x: data.row(i).unwrap().to_vec(),
            y: data.labels()[i],
        })
        .collect()
}

/// burn-train's `SupervisedTraining` + `Learner` with the strategy, `EPOCHS` epochs: each rank's
/// own final parameters.
fn learner(dir: &Path, cfg: &TrainConfig, spec: &AlgorithmSpec, data: &TrainTest) -> Vec<Vec<f32>> {
    let items = learner_items(cfg, &data.train);
    let n = items.len();
    // Each rank's slice is its shard, batched from its start as the sampler batches it.
    for rank in 0..cfg.workers {
        let slice: Vec<(Vec<u32>, u32)> = items
            [rank * n / cfg.workers..(rank + 1) * n / cfg.workers]
            .iter()
            .map(|i| (i.x.iter().map(|x| x.to_bits()).collect(), i.y))
            .collect();
        let shard: Vec<(Vec<u32>, u32)> = shard_batches(cfg, &data.train, rank)
            .into_iter()
            .flatten()
            .map(|i| {
                let x = data.train.row(i).unwrap();
                (
                    x.iter().map(|x| x.to_bits()).collect(),
                    data.train.labels()[i],
                )
            })
            .collect();
        assert_eq!(slice, shard, "rank {rank}'s slice of the learner's items");
    }
    let train = DataLoaderBuilder::new(RowBatcher)
        .batch_size(cfg.batch_size)
        .build(InMemDataset::new(items));
    let test: Vec<Item> = (0..data.test.len())
        .map(|i| Item {
            x: data.test.row(i).unwrap().to_vec(),
            y: data.test.labels()[i],
        })
        .collect();
    let valid = DataLoaderBuilder::new(RowBatcher)
        .batch_size(cfg.batch_size)
        .build(InMemDataset::new(test));
    let mut config = StrategyConfig::new(spec.clone()).with_workers(cfg.workers);
    config.broadcast_start = cfg.broadcast_start;
    config.buffers = cfg.buffers;
    let strategy = Arc::new(LocalSgdStrategy::new(config, device()).unwrap());
    let result = SupervisedTraining::new(dir, train, valid)
        .with_training_strategy(TrainingStrategy::Custom(strategy.clone()))
        .with_application_logger(None)
        .num_epochs(EPOCHS as usize)
        .launch(Learner::new(
            Net::new(cfg, data, &device()),
            run::optimizer(cfg).unwrap(),
            cfg.lr,
        ));
    assert!(result.error.is_none(), "{:?}", result.error);
    strategy
        .rank_models::<Net>()
        .expect("the ranks' models")
        .iter()
        .map(params)
        .collect()
}

fn check(cfg: TrainConfig) {
    cfg.validate().unwrap();
    // Accumulating one batch per step, the binary's streamed steps and the learner's epoch-end
    // rule cut the same steps.
    assert_eq!(cfg.accumulate, 1);
    let spec = cfg.algorithm_spec().unwrap();
    let data = run::load_data(&cfg).unwrap();
    let device = device();

    // The same initial weights on every side: the binary's model from `cfg.seed` and the
    // user's `Net`.
    let spec_model = run::model_config(&cfg, &data.train).unwrap();
    let initial = params(&spec_model.init(cfg.seed, &device).unwrap());
    assert_eq!(initial, params(&Net::new(&cfg, &data, &device)));

    let dir = tempfile::tempdir().unwrap();
    let binary = binary(&cfg, &data);
    let pipeline = pipeline_loop(&cfg, &spec, &data);
    let learner = learner(dir.path(), &cfg, &spec, &data);
    assert_eq!(binary.len(), cfg.workers);
    assert_eq!(pipeline.len(), cfg.workers);
    assert_eq!(learner.len(), cfg.workers);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for rank in 0..cfg.workers {
        let (b, p, l) = (&binary[rank], &pipeline[rank], &learner[rank]);
        assert_eq!(b.len(), initial.len(), "rank {rank}: parameter count");
        assert_ne!(bits(b), bits(&initial), "rank {rank} did not train");
        assert_eq!(
            bits(b),
            bits(p),
            "{:?} rank {rank}: the binary and the pipeline loop differ",
            cfg.algorithm
        );
        assert_eq!(
            bits(b),
            bits(l),
            "{:?} rank {rank}: the binary and the learner differ",
            cfg.algorithm
        );
    }
}

#[test]
fn ddp() {
    check(config(AlgorithmKind::Ddp));
}

#[test]
fn local_sgd() {
    check(TrainConfig {
        period: Some(3),
        ..config(AlgorithmKind::LocalSgd)
    });
}

#[test]
fn post_local_sgd() {
    check(TrainConfig {
        warmup: 5,
        period: Some(4),
        ..config(AlgorithmKind::PostLocalSgd)
    });
}

#[test]
fn hierarchical() {
    check(TrainConfig {
        workers: 4,
        warmup: 2,
        levels: "2:2,4:4".parse().unwrap(),
        ..config(AlgorithmKind::Hierarchical)
    });
}

#[test]
fn diloco() {
    check(TrainConfig {
        warmup: 2,
        period: Some(4),
        ..config(AlgorithmKind::Diloco)
    });
}

#[test]
fn streaming_diloco() {
    check(TrainConfig {
        period: Some(6),
        fragments: Some(2),
        ..config(AlgorithmKind::StreamingDiloco)
    });
}

/// Plain averages every 2 steps, the slow momentum step every 6.
#[test]
fn slowmo() {
    check(TrainConfig {
        period: Some(2),
        slowmo_frequency: Some(6),
        ..config(AlgorithmKind::Slowmo)
    });
}
