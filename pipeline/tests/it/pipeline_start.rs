//! What a DDP user expects before and between iterations: the start broadcast of rank 0's
//! parameters and buffers (PyTorch's `DistributedDataParallel(model)`), and the buffer policies
//! (`broadcast_buffers=True`, averaging buffers with the parameters, or keeping them local), on 2
//! thread workers.

use burn::module::Module;
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, Relu};
use burn::tensor::{Device, Int, Tensor, TensorData};
use localsgd_averagers::PeriodicModelAverager;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params, write_params};
use localsgd_comm::{Group, ThreadWorld};
use localsgd_hooks::{AllReduceHook, GradientReducer};
use localsgd_models::mlp::{Mlp, MlpConfig};
use localsgd_models::network::loss;
use localsgd_pipeline::pipeline::{BufferPolicy, IterSource, Outcome, Pipeline, PipelineOptions};

type Batch = (Tensor<2>, Tensor<1, Int>);

fn batches(rank: usize, count: usize, dim: usize, device: &Device) -> Vec<Batch> {
    (0..count)
        .map(|i| {
            let x: Vec<f32> = (0..4 * dim)
                .map(|j| (((rank * 131 + i * 17 + j) as f32) * 0.377).sin())
                .collect();
            let y: Vec<i64> = (0..4).map(|j| ((rank + i + j) % 3) as i64).collect();
            (
                Tensor::from_data(TensorData::new(x, [4, dim]), device),
                Tensor::from_data(TensorData::new(y, [4]), device),
            )
        })
        .collect()
}

fn flat(m: &impl Module, selection: &ParamSelection) -> Vec<f32> {
    match flatten_params(m, selection).unwrap().buffer {
        FlatBuffer::F32(v) => v,
        other => panic!("f32 model flattened to {other:?}"),
    }
}

fn ddp_pipeline<M: Module>(world: &Group, options: PipelineOptions) -> Pipeline<M> {
    Pipeline::new(world.clone(), burn::optim::SgdConfig::new().init(), options).with_gradient_sync(
        Box::new(AllReduceHook::new(world.clone())),
        GradientReducer::default(),
    )
}

/// DDP from MLPs initialised with a different seed on each rank: with the start broadcast the
/// ranks end identical, and bit for bit where both ranks started from rank 0's weights; without
/// it they never agree.
#[test]
fn start_broadcast_makes_differently_initialised_replicas_equal() {
    let cfg = MlpConfig {
        input: 5,
        hidden: vec![6],
        classes: 3,
    };
    let run = |seed_of: fn(usize) -> u64, broadcast_start: bool| {
        ThreadWorld::new(2)
            .unwrap()
            .run(|world| {
                let device = Device::flex().autodiff();
                let options = PipelineOptions {
                    broadcast_start,
                    ..Default::default()
                };
                let mut p: Pipeline<Mlp> = ddp_pipeline(&world, options);
                let mut m = cfg.init(seed_of(world.rank()), &device).unwrap();
                let mut src = IterSource(batches(world.rank(), 3, 5, &device).into_iter());
                for _ in 0..3 {
                    match p.run_iteration(m, &mut src, &loss).unwrap() {
                        Outcome::Trained(next, _) => m = next,
                        Outcome::EndOfData(_) => panic!("data ran out"),
                    }
                }
                flat(&m, &ParamSelection::All)
            })
            .unwrap()
    };
    let per_rank_seed = |rank: usize| 10 + rank as u64;
    let broadcast = run(per_rank_seed, true);
    assert_eq!(
        broadcast[0], broadcast[1],
        "replicas differ after the start broadcast"
    );
    // The reference: both ranks start from rank 0's weights (seed 10); no broadcast needed.
    let reference = run(|_| 10, false);
    assert_eq!(broadcast[0], reference[0]);
    let unsynced = run(per_rank_seed, false);
    assert_ne!(
        unsynced[0], unsynced[1],
        "without the broadcast the replicas disagree"
    );
}

#[derive(Module, Debug)]
struct BnNet {
    fc: Linear,
    bn: BatchNorm,
    act: Relu,
    out: Linear,
}

fn bn_net(device: &Device) -> BnNet {
    let m = BnNet {
        fc: LinearConfig::new(5, 4).init(device),
        bn: BatchNormConfig::new(4).init(device),
        act: Relu::new(),
        out: LinearConfig::new(4, 3).init(device),
    };
    // Deterministic parameters, the same on every rank.
    let mut params = flatten_params(&m, &ParamSelection::All).unwrap();
    let buffers = ParamSelection::buffers(&m);
    let layout = params.layout.clone();
    let FlatBuffer::F32(v) = &mut params.buffer else {
        panic!("f32 model")
    };
    for e in &layout.entries {
        if buffers.contains(&e.id) {
            continue; // running mean 0, running variance 1, as initialised
        }
        for (i, x) in v.iter_mut().enumerate().skip(e.offset).take(e.len) {
            *x = ((i as f32) * 0.613).cos() * 0.5;
        }
    }
    write_params(m, &params).unwrap()
}

/// Add `offset` to every buffer (BatchNorm's running mean and variance).
fn shift_buffers(m: BnNet, offset: f32) -> BnNet {
    let buffers = ParamSelection::buffers(&m);
    let mut flat = flatten_params(&m, &buffers).unwrap();
    let FlatBuffer::F32(v) = &mut flat.buffer else {
        panic!("f32 model")
    };
    for x in v.iter_mut() {
        *x += offset;
    }
    write_params(m, &flat).unwrap()
}

fn bn_loss(m: &BnNet, (x, y): &Batch) -> Tensor<1> {
    let logits = m
        .out
        .forward(m.act.forward(m.bn.forward(m.fc.forward(x.clone()))));
    CrossEntropyLoss::new(None, &logits.device()).forward(logits, y.clone())
}

/// One iteration with rank 1's buffers shifted by +5 beforehand (and no start broadcast), under
/// each policy; returns each rank's buffers after the iteration. `averaged`: local SGD averaging
/// every step from step 0 instead of DDP.
fn one_iteration(policy: BufferPolicy, averaged: bool) -> Vec<Vec<f32>> {
    ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            let device = Device::flex().autodiff();
            let options = PipelineOptions {
                broadcast_start: false,
                buffers: policy,
                ..Default::default()
            };
            let mut p: Pipeline<BnNet> = if averaged {
                Pipeline::new(world.clone(), burn::optim::SgdConfig::new().init(), options)
                    .with_averager(Box::new(
                        PeriodicModelAverager::new(1, 0, world.clone()).unwrap(),
                    ))
            } else {
                ddp_pipeline(&world, options)
            };
            let mut m = bn_net(&device);
            if world.rank() == 1 {
                m = shift_buffers(m, 5.0);
            }
            let mut src = IterSource(batches(world.rank(), 1, 5, &device).into_iter());
            let m = match p.run_iteration(m, &mut src, &bn_loss).unwrap() {
                Outcome::Trained(next, _) => next,
                Outcome::EndOfData(_) => panic!("data ran out"),
            };
            // `finish` makes the last forward's pending BatchNorm update visible.
            let m = p.finish(m).unwrap();
            flat(&m, &ParamSelection::buffers(&m))
        })
        .unwrap()
}

/// BatchNorm updates `running = 0.9 * running + 0.1 * batch statistic` in the forward pass.
/// `broadcast` (DDP's default) gives rank 1 rank 0's buffers before that forward, so rank 1 ends
/// exactly `0.9 * 5` below where `local` leaves it; rank 0 is the same under both.
#[test]
fn broadcast_buffers_gives_every_rank_rank_0s_buffers_before_the_forward() {
    let local = one_iteration(BufferPolicy::Local, false);
    let broadcast = one_iteration(BufferPolicy::Broadcast, false);
    assert_eq!(local[0].len(), 8, "running mean and variance of 4 features");
    assert_eq!(local[0], broadcast[0]);
    for (i, (l, b)) in local[1].iter().zip(&broadcast[1]).enumerate() {
        assert!(
            (l - b - 4.5).abs() < 1e-5,
            "buffer element {i}: local {l}, broadcast {b}, expected a difference of 4.5"
        );
    }
}

/// `average`: at an averaging step the buffers are averaged over the averaging group after the
/// forward updated them locally: both ranks end with the mean of what `local` leaves on each.
#[test]
fn average_buffers_averages_them_at_averaging_steps() {
    let local = one_iteration(BufferPolicy::Local, true);
    let averaged = one_iteration(BufferPolicy::Average, true);
    assert_ne!(local[0], local[1]);
    assert_eq!(averaged[0], averaged[1]);
    for (i, ((a, l0), l1)) in averaged[0].iter().zip(&local[0]).zip(&local[1]).enumerate() {
        let mean = (l0 + l1) / 2.0;
        assert!(
            (a - mean).abs() < 1e-5,
            "buffer element {i}: averaged {a}, mean of local values {mean}"
        );
    }
}
