//! Does overlapping pay? Compares, on 2 thread-backend ranks and an MLP-sized gradient set
//! (784-2048-2048-2048-10, ~10.4M f32 gradients, 3 buckets at the default 1 MiB / 25 MiB caps):
//!
//! - `sequential`: the library's `GradientReducer::reduce` (flatten all gradients once, copy each
//!   bucket out, all-reduce it, copy it back, unflatten once);
//! - `overlapped`: the alternative: flatten bucket `i + 1` (its own `flatten_grads` call) on the
//!   rank's thread while a helper thread all-reduces bucket `i`, then unflatten once.
//!
//! Measured on the 2-core dev machine (busy with parallel builds, load ~4-5), overlapped /
//! sequential time ratios over six runs: 1.03, 0.99, 1.04, 0.81, 0.99, 1.20 (mean ~1.01; two
//! earlier runs against a sequential variant with per-parameter copies gave 0.89 and 0.87).
//! Overlap does not pay here, so the library keeps the simple sequential path. Run with
//! `cargo bench -p localsgd-hooks`.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use criterion::{Criterion, black_box};
use localsgd_comm::ThreadWorld;
use localsgd_comm::params::{
    FlatBuffer, FlatLayout, FlatParams, ParamSelection, flatten_grads, grads_from_flat,
};
use localsgd_hooks::{
    AllReduceHook, BucketCaps, BucketData, CommHook, GradBucket, GradientReducer, HookError,
};
use std::time::{Duration, Instant};

const WORKERS: usize = 2;

#[derive(Module, Debug)]
struct Mlp {
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
    fc4: Linear,
}

fn mlp(device: &Device) -> Mlp {
    Mlp {
        fc1: LinearConfig::new(784, 2048).init(device),
        fc2: LinearConfig::new(2048, 2048).init(device),
        fc3: LinearConfig::new(2048, 2048).init(device),
        fc4: LinearConfig::new(2048, 10).init(device),
    }
}

/// Stand-in gradients: every parameter's value.
fn grads(model: &Mlp) -> GradientsParams {
    struct V(GradientsParams);
    impl ModuleVisitor for V {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.0.register::<D>(p.id, p.val().detach());
        }
    }
    let mut v = V(GradientsParams::new());
    model.visit(&mut v);
    v.0
}

/// The alternative: per-bucket flattening overlapped with the previous bucket's all-reduce.
fn reduce_overlapped(
    reducer: &mut GradientReducer,
    model: &Mlp,
    grads: &GradientsParams,
    hook: &mut dyn CommHook,
) -> Result<GradientsParams, HookError> {
    let all = FlatLayout::of(model, &ParamSelection::All);
    let plan = reducer.plan(model).clone();
    let selections: Vec<ParamSelection> = plan
        .buckets
        .iter()
        .map(|b| ParamSelection::ids(b.params.iter().map(|p| all.entries[p.index].id)))
        .collect();
    let count = plan.buckets.len();
    let prepare = |i: usize| -> Result<GradBucket, HookError> {
        let FlatBuffer::F32(data) = flatten_grads(model, grads, &selections[i])?.buffer else {
            unreachable!("f32 model")
        };
        Ok(GradBucket::new(i, i + 1 == count, BucketData::F32(data)))
    };
    let mut out = vec![0.0f32; all.total];
    let mut bucket = prepare(0)?;
    for (i, spec) in plan.buckets.iter().enumerate() {
        let next = std::thread::scope(|s| {
            let comm = s.spawn(|| hook.run(&mut bucket));
            let next = (i + 1 < count).then(|| prepare(i + 1)).transpose();
            comm.join().expect("hook thread")?;
            next
        })?;
        let BucketData::F32(done) = bucket.into_data() else {
            unreachable!("f32 hook")
        };
        out[spec.flat_offset..spec.flat_offset + spec.len].copy_from_slice(&done);
        match next {
            Some(b) => bucket = b,
            None => break,
        }
    }
    let flat = FlatParams {
        layout: all,
        buffer: FlatBuffer::F32(out),
    };
    Ok(grads_from_flat(model, &flat)?)
}

fn time(iters: u64, overlapped: bool) -> Duration {
    ThreadWorld::new(WORKERS)
        .expect("workers > 0")
        .run(|world| {
            let device = Device::flex().autodiff();
            let model = mlp(&device);
            let mut reducer = GradientReducer::new(BucketCaps::default());
            let mut hook = AllReduceHook::new(world.clone());
            world.barrier().expect("barrier");
            let start = Instant::now();
            for _ in 0..iters {
                let g = grads(&model);
                let out = if overlapped {
                    reduce_overlapped(&mut reducer, &model, &g, &mut hook)
                } else {
                    reducer.reduce(&model, g, &mut hook)
                };
                black_box(out.expect("reduce"));
            }
            start.elapsed()
        })
        .expect("no worker panics")
        .into_iter()
        .max()
        .unwrap_or_default()
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    let mut g = c.benchmark_group("reduce_10M_grads_2_ranks");
    g.bench_function("sequential", |b| b.iter_custom(|n| time(n, false)));
    g.bench_function("overlapped", |b| b.iter_custom(|n| time(n, true)));
    g.finish();
    c.final_summary();
}
