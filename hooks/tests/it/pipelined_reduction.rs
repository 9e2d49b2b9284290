//! Pipelined gradient sync (non-blocking bucket averages, the optimizer stepped bucket by bucket)
//! gives the blocking path's parameters to the bit, and both match one worker on the whole batch
//! (DDP's definition). Also: the post-local SGD hook's schedule across the switch, the fallback
//! for hooks that are not a plain mean, and a collective left pending.

use burn::module::Module;
use burn::nn::loss::CrossEntropyLoss;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{
    AdamWConfig, GradientsParams, ModuleOptimizer, SgdConfig, momentum::MomentumConfig,
};
use burn::prelude::*;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params, write_params};
use localsgd_comm::{CommError, Group, ThreadWorld};
use localsgd_hooks::{
    AllReduceHook, BucketCaps, CommHook, CompressHook, GradientReducer, HookError,
    PostLocalSgdHook, Precision,
};

#[derive(Module, Debug)]
struct Mlp {
    fc1: Linear,
    act: Relu,
    fc2: Linear,
    fc3: Linear,
}

const BATCH: usize = 8;
const STEPS: usize = 4;
const LR: f64 = 0.05;
/// Small caps: several buckets per step.
const CAPS: BucketCaps = BucketCaps {
    first_bytes: 64,
    rest_bytes: 256,
};

/// The same deterministic initial parameters on every worker.
fn model(device: &Device) -> Mlp {
    let m = Mlp {
        fc1: LinearConfig::new(8, 16).init(device),
        act: Relu::new(),
        fc2: LinearConfig::new(16, 12).init(device),
        fc3: LinearConfig::new(12, 4).init(device),
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
    let logits = m.fc3.forward(
        m.act
            .forward(m.fc2.forward(m.act.forward(m.fc1.forward(x)))),
    );
    let loss = CrossEntropyLoss::new(None, device).forward(logits, y);
    GradientsParams::from_grads(loss.backward(), m)
}

fn params(m: &Mlp) -> Vec<f32> {
    match flatten_params(m, &ParamSelection::All).unwrap().buffer {
        FlatBuffer::F32(v) => v,
        other => panic!("f32 model flattened to {other:?}"),
    }
}

#[derive(Clone, Copy, Debug)]
enum Optim {
    /// SGD with PyTorch's momentum (dampening 0) and weight decay.
    Momentum,
    AdamW,
}

fn optimizer(kind: Optim) -> ModuleOptimizer {
    match kind {
        Optim::Momentum => SgdConfig::new()
            .with_momentum(Some(MomentumConfig {
                momentum: 0.9,
                dampening: 0.0,
                nesterov: false,
            }))
            .with_weight_decay(Some(burn::optim::decay::WeightDecayConfig::new(1e-2)))
            .init(),
        Optim::AdamW => AdamWConfig::new().with_weight_decay(1e-2).init(),
    }
}

/// One worker's DDP run; `pipelined` steps the optimizer bucket by bucket as averages arrive.
fn ddp_run(world: &Group, kind: Optim, pipelined: bool, shard: usize) -> (usize, usize, Vec<f32>) {
    let device = Device::flex().autodiff();
    let mut m = model(&device);
    let mut optim = optimizer(kind);
    let mut reducer = GradientReducer::new(CAPS).pipelined(pipelined);
    let mut hook = AllReduceHook::new(world.clone());
    let rows = world.rank() * shard..(world.rank() + 1) * shard;
    let mut parts_seen = 0;
    for step in 0..STEPS {
        let (x, y) = batch(step, rows.clone(), &device);
        let grads = grads_of(&m, x, y, &device);
        let mut parts = reducer.start(&m, grads, &mut hook).unwrap();
        assert_eq!(parts.is_pipelined(), pipelined);
        while let Some(g) = parts.next_part(&m).unwrap() {
            parts_seen += 1;
            m = optim.step(LR, m, g);
        }
    }
    reducer.close().unwrap();
    (reducer.plan(&m).len(), parts_seen, params(&m))
}

#[test]
fn pipelined_ddp_equals_blocking_to_the_bit_and_one_worker_on_the_whole_batch() {
    for kind in [Optim::Momentum, Optim::AdamW] {
        // One worker on the whole batch: the reference DDP must reproduce.
        let device = Device::flex().autodiff();
        let mut single = model(&device);
        let mut optim = optimizer(kind);
        for step in 0..STEPS {
            let (x, y) = batch(step, 0..BATCH, &device);
            let grads = grads_of(&single, x, y, &device);
            single = optim.step(LR, single, grads);
        }
        let want = params(&single);
        let before = params(&model(&device));
        assert!(
            want.iter().zip(&before).any(|(a, b)| (a - b).abs() > 1e-3),
            "training must move the parameters"
        );

        for workers in [2, 4] {
            let shard = BATCH / workers;
            let out = ThreadWorld::new(workers)
                .unwrap()
                .run(|world: Group| {
                    let blocking = ddp_run(&world, kind, false, shard);
                    let pipelined = ddp_run(&world, kind, true, shard);
                    (blocking, pipelined)
                })
                .unwrap();
            for (rank, ((buckets, blocking_parts, blocking), (_, pipelined_parts, pipelined))) in
                out.into_iter().enumerate()
            {
                assert!(buckets >= 3, "{buckets} buckets");
                assert_eq!(blocking_parts, STEPS, "blocking: one part per step");
                assert_eq!(
                    pipelined_parts,
                    buckets * STEPS,
                    "pipelined: one part per bucket"
                );
                assert_eq!(
                    blocking, pipelined,
                    "{kind:?}, {workers} workers, rank {rank}: pipelined differs from blocking"
                );
                for (i, (g, w)) in pipelined.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5,
                        "{kind:?}, {workers} workers, rank {rank}, element {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// Post-local SGD with gradient averaging in pairs after a warmup of 2 iterations: pipelined and
/// blocking agree on the parameters and on the hook's `iter` at every step, across the switch
/// from the world to the subgroup.
#[test]
fn post_local_hook_schedule_is_the_same_pipelined() {
    let run = |world: &Group, pipelined: bool| -> (Vec<u64>, Vec<f32>) {
        let device = Device::flex().autodiff();
        let mut m = model(&device);
        let mut optim = optimizer(Optim::Momentum);
        let mut reducer = GradientReducer::new(CAPS).pipelined(pipelined);
        let pairs = world.new_subgroups(2).unwrap();
        let mut hook = PostLocalSgdHook::new(world.clone(), Some(pairs), 2, true);
        let rows = world.rank() * 2..world.rank() * 2 + 2;
        let mut iters = Vec::new();
        for step in 0..STEPS {
            let (x, y) = batch(step, rows.clone(), &device);
            let grads = grads_of(&m, x, y, &device);
            let mut parts = reducer.start(&m, grads, &mut hook).unwrap();
            iters.push(hook.iter());
            while let Some(g) = parts.next_part(&m).unwrap() {
                m = optim.step(LR, m, g);
            }
        }
        reducer.close().unwrap();
        (iters, params(&m))
    };
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| (run(&world, false), run(&world, true)))
        .unwrap();
    for (rank, (blocking, pipelined)) in out.iter().enumerate() {
        // The reference counts warmup iterations up to start_local_sgd_iter and stops there.
        assert_eq!(blocking.0, vec![1, 2, 2, 2], "rank {rank}");
        assert_eq!(pipelined.0, blocking.0, "rank {rank}");
        assert_eq!(pipelined.1, blocking.1, "rank {rank}");
    }
    // After the switch the pairs (0, 1) and (2, 3) averaged separately: pairs agree, and the
    // two pairs differ.
    assert_eq!(out[0].1.1, out[1].1.1);
    assert_eq!(out[2].1.1, out[3].1.1);
    assert_ne!(out[0].1.1, out[2].1.1);
}

/// A hook that is not a plain mean (fp16 compression) is run bucket by bucket, even with
/// pipelining on, and gives the blocking result.
#[test]
fn compression_falls_back_to_the_blocking_path() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world: Group| {
            let device = Device::flex().autodiff();
            let m = model(&device);
            let (x, y) = batch(0, world.rank() * 4..world.rank() * 4 + 4, &device);
            let mut values = Vec::new();
            for pipelined in [false, true] {
                let grads = grads_of(&m, x.clone(), y.clone(), &device);
                let mut hook: Box<dyn CommHook> = Box::new(CompressHook::new(
                    Precision::Fp16,
                    AllReduceHook::new(world.clone()),
                ));
                let mut reducer = GradientReducer::new(CAPS).pipelined(pipelined);
                let parts = reducer.start(&m, grads, &mut hook).unwrap();
                assert!(!parts.is_pipelined());
                let g = parts.wait_all(&m).unwrap();
                let w: Tensor<2> = g.get(m.fc1.weight.id).unwrap();
                values.push(w.into_data().try_into_vec::<f32>().unwrap());
            }
            values
        })
        .unwrap();
    for v in &out {
        assert_eq!(v[0], v[1]);
    }
    assert_eq!(out[0], out[1]);
}

/// `reduce` with pipelining on returns every bucket reduced, like the blocking path.
#[test]
fn reduce_waits_for_every_bucket() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world: Group| {
            let device = Device::flex().autodiff();
            let m = model(&device);
            let (x, y) = batch(1, world.rank() * 4..world.rank() * 4 + 4, &device);
            let mut hook = AllReduceHook::new(world.clone());
            let mut all = Vec::new();
            for pipelined in [false, true] {
                let grads = grads_of(&m, x.clone(), y.clone(), &device);
                let mut reducer = GradientReducer::new(CAPS).pipelined(pipelined);
                let g = reducer.reduce(&m, grads, &mut hook).unwrap();
                let mut flat = Vec::new();
                let w1: Tensor<2> = g.get(m.fc1.weight.id).unwrap();
                let w3: Tensor<2> = g.get(m.fc3.weight.id).unwrap();
                let b2: Tensor<1> = g.get(m.fc2.bias.as_ref().unwrap().id).unwrap();
                flat.extend(w1.into_data().try_into_vec::<f32>().unwrap());
                flat.extend(w3.into_data().try_into_vec::<f32>().unwrap());
                flat.extend(b2.into_data().try_into_vec::<f32>().unwrap());
                assert_eq!(g.len(), 6);
                reducer.close().unwrap();
                all.push(flat);
            }
            all
        })
        .unwrap();
    assert_eq!(out[0][0], out[0][1]);
    assert_eq!(out[0], out[1]);
}

/// Buckets started and never waited for are reported when the reducer is closed, on every rank
/// (the collectives themselves ran, so no rank hangs).
#[test]
fn a_bucket_left_pending_is_an_error_at_close() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world: Group| {
            let device = Device::flex().autodiff();
            let m = model(&device);
            let (x, y) = batch(0, world.rank() * 4..world.rank() * 4 + 4, &device);
            let grads = grads_of(&m, x, y, &device);
            let mut hook = AllReduceHook::new(world.clone());
            let mut reducer = GradientReducer::new(CAPS).pipelined(true);
            let buckets = reducer.plan(&m).len() as u64;
            let mut parts = reducer.start(&m, grads, &mut hook).unwrap();
            assert_eq!(parts.remaining() as u64, buckets);
            // Take one bucket, drop the others.
            parts.next_part(&m).unwrap().unwrap();
            drop(parts);
            (buckets, reducer.close())
        })
        .unwrap();
    for (buckets, r) in out {
        assert!(buckets >= 3);
        assert_eq!(
            r,
            Err(HookError::Comm(CommError::LeftPending {
                count: buckets - 1,
                started: buckets
            }))
        );
    }
}

/// One bucket (the default caps on this small model) has nothing to overlap: the pipelined
/// reducer averages it blocking, in place, with the blocking path's numbers to the bit, and the
/// post-local SGD hook still counts the iteration once.
#[test]
fn one_bucket_is_averaged_blocking_with_the_same_numbers() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world: Group| {
            let device = Device::flex().autodiff();
            let m = model(&device);
            let (x, y) = batch(2, world.rank() * 4..world.rank() * 4 + 4, &device);
            let mut all = Vec::new();
            for pipelined in [false, true] {
                let grads = grads_of(&m, x.clone(), y.clone(), &device);
                let mut hook = PostLocalSgdHook::new(world.clone(), None, 5, false);
                let mut reducer = GradientReducer::new(BucketCaps::default()).pipelined(pipelined);
                assert_eq!(reducer.plan(&m).len(), 1);
                let parts = reducer.start(&m, grads, &mut hook).unwrap();
                assert!(!parts.is_pipelined());
                let g = parts.wait_all(&m).unwrap();
                let w: Tensor<2> = g.get(m.fc1.weight.id).unwrap();
                reducer.close().unwrap();
                all.push((hook.iter(), w.into_data().try_into_vec::<f32>().unwrap()));
            }
            all
        })
        .unwrap();
    for runs in &out {
        assert_eq!(runs[0].0, 1);
        assert_eq!(runs[0], runs[1]);
    }
    assert_eq!(out[0], out[1]);
}
