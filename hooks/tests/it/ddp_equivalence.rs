//! DDP equivalence: 4 workers with `AllReduceHook`, each on a quarter of a batch, end with the
//! same parameters as one worker on the whole batch (mean loss), for a real burn MLP, 3 SGD steps.

use burn::module::Module;
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params, write_params};
use localsgd_comm::{Group, ThreadWorld};
use localsgd_hooks::{AllReduceHook, BucketCaps, GradientReducer};

#[derive(Module, Debug)]
struct Mlp {
    fc1: Linear,
    act: Relu,
    fc2: Linear,
}

const BATCH: usize = 8;
const STEPS: usize = 3;
const LR: f64 = 0.1;

/// The same deterministic initial parameters on every worker.
fn model(device: &Device) -> Mlp {
    let m = Mlp {
        fc1: LinearConfig::new(8, 16).init(device),
        act: Relu::new(),
        fc2: LinearConfig::new(16, 4).init(device),
    };
    let mut flat = flatten_params(&m, &ParamSelection::All).unwrap();
    let FlatBuffer::F32(v) = &mut flat.buffer else {
        panic!("f32 model")
    };
    for (i, x) in v.iter_mut().enumerate() {
        *x = ((i as f32) * 0.731).sin() * 0.4;
    }
    write_params(m, &flat).unwrap()
}

/// Rows `rows` of the batch (inputs, targets) for step `step`.
fn batch(
    step: usize,
    rows: std::ops::Range<usize>,
    device: &Device,
) -> (Tensor<2>, Tensor<1, Int>) {
    let n = rows.len();
    let x: Vec<f32> = rows
        .clone()
        .flat_map(|r| (0..8).map(move |j| (((step * 97 + r * 8 + j) as f32) * 0.513).cos()))
        .collect();
    let y: Vec<i64> = rows.map(|r| ((r + step) % 4) as i64).collect();
    (
        Tensor::from_data(TensorData::new(x, [n, 8]), device),
        Tensor::from_data(TensorData::new(y, [n]), device),
    )
}

fn grads_of(m: &Mlp, x: Tensor<2>, y: Tensor<1, Int>, device: &Device) -> GradientsParams {
    let logits = m.fc2.forward(m.act.forward(m.fc1.forward(x)));
    let loss = CrossEntropyLoss::new(None, device).forward(logits, y);
    GradientsParams::from_grads(loss.backward(), m)
}

fn params(m: &Mlp) -> Vec<f32> {
    match flatten_params(m, &ParamSelection::All).unwrap().buffer {
        FlatBuffer::F32(v) => v,
        other => panic!("f32 model flattened to {other:?}"),
    }
}

#[test]
fn four_workers_with_allreduce_match_one_worker_on_the_whole_batch() {
    let device = Device::flex().autodiff();
    let mut single = model(&device);
    let mut optim = SgdConfig::new().init();
    for step in 0..STEPS {
        let (x, y) = batch(step, 0..BATCH, &device);
        let grads = grads_of(&single, x, y, &device);
        single = optim.step(LR, single, grads);
    }
    let want = params(&single);

    let workers = 4;
    let shard = BATCH / workers;
    let out = ThreadWorld::new(workers)
        .unwrap()
        .run(|world: Group| {
            let device = Device::flex().autodiff();
            let mut m = model(&device);
            let mut optim = SgdConfig::new().init();
            // Small caps: several buckets per step.
            let mut reducer = GradientReducer::new(BucketCaps {
                first_bytes: 64,
                rest_bytes: 256,
            });
            let mut hook = AllReduceHook::new(world.clone());
            let rows = world.rank() * shard..(world.rank() + 1) * shard;
            for step in 0..STEPS {
                let (x, y) = batch(step, rows.clone(), &device);
                let grads = grads_of(&m, x, y, &device);
                let grads = reducer.reduce(&m, grads, &mut hook).unwrap();
                m = optim.step(LR, m, grads);
            }
            (reducer.plan(&m).len(), params(&m))
        })
        .unwrap();
    let before = params(&model(&device));
    assert!(
        want.iter().zip(&before).any(|(a, b)| (a - b).abs() > 1e-3),
        "training must move the parameters"
    );
    for (rank, (buckets, got)) in out.into_iter().enumerate() {
        assert!(buckets >= 3, "rank {rank}: {buckets} buckets");
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5,
                "rank {rank} param element {i}: {g} vs {w}"
            );
        }
    }
}
