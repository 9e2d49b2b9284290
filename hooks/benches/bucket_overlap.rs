//! Does pipelining pay on the thread backend? Compares, on 2 thread-backend ranks and an
//! MLP-sized gradient set (784-2048-2048-2048-10, ~10.4M f32 gradients, 3 buckets at the
//! default 1 MiB / 25 MiB caps), the library's two paths of `GradientReducer::reduce`:
//!
//! - `blocking`: flatten all gradients once, average each bucket in place, unflatten once;
//! - `pipelined`: `pipelined(true)`: read each bucket on its own and start its average on the
//!   non-blocking group's helper thread at once, so bucket `i + 1` is read while bucket `i` is
//!   averaged; then unflatten.
//!
//! On the thread backend a collective is a memory copy between the ranks' threads, so there is
//! no wire time to hide and the helper's hand-offs add to it; this is why the binary's
//! `pipeline-buckets = "auto"` leaves threads blocking (2026-12-01, quiet machine, one run:
//! blocking 53.0 ms, pipelined 94.9 ms per reduce). Run with
//! `cargo bench --workspace --bench bucket_overlap`.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use criterion::{Criterion, black_box};
use localsgd_comm::ThreadWorld;
use localsgd_hooks::{AllReduceHook, BucketCaps, GradientReducer};
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

fn time(iters: u64, pipelined: bool) -> Duration {
    ThreadWorld::new(WORKERS)
        .expect("workers > 0")
        .run(|world| {
            let device = Device::flex().autodiff();
            let model = mlp(&device);
            let mut reducer = GradientReducer::new(BucketCaps::default()).pipelined(pipelined);
            let mut hook = AllReduceHook::new(world.clone());
            world.barrier().expect("barrier");
            let start = Instant::now();
            for _ in 0..iters {
                let g = grads(&model);
                black_box(reducer.reduce(&model, g, &mut hook).expect("reduce"));
            }
            let elapsed = start.elapsed();
            reducer.close().expect("nothing left pending");
            elapsed
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
    g.bench_function("blocking", |b| b.iter_custom(|n| time(n, false)));
    g.bench_function("pipelined", |b| b.iter_custom(|n| time(n, true)));
    g.finish();
    c.final_summary();
}
