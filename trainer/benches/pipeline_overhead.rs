//! What the pipeline costs on top of burn, at three model sizes: the digits MLP 64-64-10 (4,810
//! parameters), the Fashion-MNIST MLP 784-256-128-10 (235,146) and the wide MLP 784-2048-512-10
//! (2,661,898), batch 32, plain SGD, one worker, in this process.
//!
//! - `bare`: the same forward/backward/optimizer step written as a bare burn loop (the loss read
//!   back, as the pipeline does).
//! - `local`: one local-SGD iteration through `Pipeline::run_iteration` (next averaging far
//!   away). Target: <= 1.05x bare.
//! - `ddp1`: one DDP iteration with one worker (the gradient all-reduce hook over buckets:
//!   flatten, hook, write back). Target: <= 1.10x bare.
//! - `flatten + write-back`: `flatten_params` and `write_params` of the whole model, as bytes per
//!   second of the model's f32 size, against a `memcpy` of the same bytes in the same run.
//!   Target: >= 0.5x memcpy (each way counted once: the round trip moves the bytes twice).
//!
//! Ratios come from interleaved rounds (bare, local, ddp1, flatten, memcpy, repeated): each ratio
//! is the median over rounds of that round's ratio, so a slow moment of the machine, which hits
//! both bodies of a round, cancels out; the us/it columns are medians of their own rounds.
//! Criterion times the same bodies for the digits model (`--bench` filters as usual).
//!
//! `cargo bench --workspace --bench pipeline_overhead` (add `-- --quick` for 3 rounds instead of
//! 9; `BENCH_ROUNDS=N` sets the number of rounds).

use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use criterion::Criterion;
use localsgd_averagers::PeriodicModelAverager;
use localsgd_comm::params::{ParamSelection, flatten_params, write_params};
use localsgd_comm::{Group, ThreadWorld};
use localsgd_hooks::{AllReduceHook, BucketCaps, GradientReducer};
use localsgd_models::mlp::{Mlp, MlpConfig};
use localsgd_models::network::loss;
use localsgd_pipeline::pipeline::{BatchSource, Outcome, Pipeline, PipelineOptions, SourceError};
use std::hint::black_box;
use std::time::{Duration, Instant};

type Batch = (Tensor<2>, Tensor<1, Int>);

const BATCH: usize = 32;

/// A model of the benchmark.
struct Size {
    name: &'static str,
    config: MlpConfig,
    /// Iterations per timed round (about 50-100 ms of work on one core).
    iters: u64,
}

fn sizes() -> Vec<Size> {
    let mlp = |input, hidden: &[usize]| MlpConfig {
        input,
        hidden: hidden.to_vec(),
        classes: 10,
    };
    vec![
        Size {
            name: "digits 64-64-10",
            config: mlp(64, &[64]),
            iters: 400,
        },
        Size {
            name: "fmnist 784-256-128-10",
            config: mlp(784, &[256, 128]),
            iters: 60,
        },
        Size {
            name: "wide 784-2048-512-10",
            config: mlp(784, &[2048, 512]),
            iters: 6,
        },
    ]
}

struct Endless(Batch);
impl BatchSource<Batch> for Endless {
    fn next_batch(&mut self) -> Result<Option<Batch>, SourceError> {
        Ok(Some(self.0.clone()))
    }
}

/// A fixed batch: inputs in [0, 1) from a cheap deterministic sequence (the values do not
/// matter for the timing, only that they are ordinary floats), labels 0..9 in turn.
fn batch(input: usize, device: &Device) -> Batch {
    let mut state = 0x2545_f491_u32;
    let x: Vec<f32> = (0..BATCH * input)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32
        })
        .collect();
    let y: Vec<i64> = (0..BATCH as i64).map(|k| k % 10).collect();
    (
        Tensor::from_data(TensorData::new(x, [BATCH, input]), device),
        Tensor::from_data(TensorData::new(y, [BATCH]), device),
    )
}

fn setup(size: &Size, device: &Device) -> (Mlp, Batch) {
    let model = size.config.init(0, device).expect("a valid MLP config");
    (model, batch(size.config.input, device))
}

fn bare(size: &Size, iters: u64) -> Duration {
    let device = Device::flex().autodiff();
    let (mut model, batch) = setup(size, &device);
    let mut optim = SgdConfig::new().init();
    let start = Instant::now();
    for _ in 0..iters {
        let l = loss(&model, &batch);
        let _value = l.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(0.01, model, grads);
    }
    start.elapsed()
}

#[derive(Clone, Copy)]
enum Kind {
    Local,
    Ddp,
}

fn pipelined(size: &Size, iters: u64, kind: Kind) -> Duration {
    let out = ThreadWorld::new(1)
        .expect("a one-rank world")
        .run(|g: Group| {
            let device = Device::flex().autodiff();
            let (mut model, batch) = setup(size, &device);
            let options = PipelineOptions {
                lr: 0.01,
                ..PipelineOptions::default()
            };
            let mut p = Pipeline::new(g.clone(), SgdConfig::new().init(), options);
            p = match kind {
                Kind::Local => {
                    let averager = PeriodicModelAverager::new(1 << 40, 0, g).expect("averager");
                    p.with_averager(Box::new(averager))
                }
                Kind::Ddp => p.with_gradient_sync(
                    Box::new(AllReduceHook::new(g)),
                    GradientReducer::new(BucketCaps::default()),
                ),
            };
            let mut src = Endless(batch);
            // The first iteration plans buckets (DDP) or averages (local, warmup 0): untimed.
            if let Ok(Outcome::Trained(m, _)) = p.run_iteration(model.clone(), &mut src, &loss) {
                model = m;
            }
            let start = Instant::now();
            for _ in 0..iters {
                match p.run_iteration(model, &mut src, &loss) {
                    Ok(Outcome::Trained(m, _)) => model = m,
                    other => panic!("unexpected {other:?}"),
                }
            }
            start.elapsed()
        })
        .expect("no panic");
    out[0]
}

/// `iters` round trips of the whole model through one flat f32 buffer.
fn flatten_write_back(size: &Size, iters: u64) -> Duration {
    let device = Device::flex();
    let mut model = size.config.init(0, &device).expect("a valid MLP config");
    let start = Instant::now();
    for _ in 0..iters {
        let flat = flatten_params(&model, &ParamSelection::All).expect("flatten");
        model = write_params(model, black_box(&flat)).expect("write back");
    }
    // Make the last write-back's tensors real before the clock stops.
    let _ = black_box(flatten_params(&model, &ParamSelection::All));
    start.elapsed()
}

/// `iters` round trips of the same number of bytes with `memcpy` (two copies per round trip,
/// like flatten + write-back).
fn memcpy(size: &Size, iters: u64) -> Duration {
    let n = size.config.num_params() as usize;
    let src = vec![1.0f32; n];
    let mut a = vec![0.0f32; n];
    let mut b = vec![0.0f32; n];
    let start = Instant::now();
    for _ in 0..iters {
        a.copy_from_slice(black_box(&src));
        b.copy_from_slice(black_box(&a));
        black_box(&mut b);
    }
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn median_f64(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn per_iter_us(d: Duration, iters: u64) -> f64 {
    d.as_secs_f64() * 1e6 / iters as f64
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .measurement_time(Duration::from_secs(if quick { 1 } else { 5 }));
    let small = &sizes()[0];
    let mut g = c.benchmark_group("local_iteration");
    g.bench_function("bare burn loop", |b| b.iter_custom(|n| bare(small, n)));
    g.bench_function("pipeline (local phase)", |b| {
        b.iter_custom(|n| pipelined(small, n, Kind::Local))
    });
    g.bench_function("pipeline (ddp, 1 worker)", |b| {
        b.iter_custom(|n| pipelined(small, n, Kind::Ddp))
    });
    g.finish();
    c.final_summary();

    let rounds = match std::env::var("BENCH_ROUNDS") {
        Ok(n) => match n.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("BENCH_ROUNDS must be a positive whole number, not {n:?}");
                std::process::exit(2);
            }
        },
        Err(_) if quick => 3,
        Err(_) => 9,
    };
    println!();
    println!(
        "| model | params | bare us/it | bare on a thread us/it | local us/it | local / bare | ddp1 us/it | ddp1 / bare | flatten+write-back GB/s | memcpy GB/s | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for size in &sizes() {
        let copy_iters = (20_000_000 / size.config.num_params().max(1)).clamp(4, 2000);
        let mut times: [Vec<Duration>; 6] = Default::default();
        for _ in 0..rounds {
            times[0].push(bare(size, size.iters));
            // The pipeline runs on a worker thread of its one-rank world: the same bare loop
            // on a spawned thread separates "another thread" from "the pipeline".
            times[5].push(std::thread::scope(|s| {
                s.spawn(|| bare(size, size.iters))
                    .join()
                    .expect("the bare loop does not panic")
            }));
            times[1].push(pipelined(size, size.iters, Kind::Local));
            times[2].push(pipelined(size, size.iters, Kind::Ddp));
            times[3].push(flatten_write_back(size, copy_iters));
            times[4].push(memcpy(size, copy_iters));
        }
        let ratio = |num: usize, den: usize| {
            median_f64(
                times[num]
                    .iter()
                    .zip(&times[den])
                    .map(|(n, d)| n.as_secs_f64() / d.as_secs_f64())
                    .collect(),
            )
        };
        let (local_ratio, ddp_ratio, copy_ratio) = (ratio(1, 0), ratio(2, 0), ratio(4, 3));
        let [b, l, d, f, m, bt] = times.map(median);
        let bytes = 2.0 * 4.0 * size.config.num_params() as f64 * copy_iters as f64;
        let (fg, mg) = (bytes / f.as_secs_f64() / 1e9, bytes / m.as_secs_f64() / 1e9);
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.1} | {:.3} | {:.2} | {:.2} | {:.2} |",
            size.name,
            size.config.num_params(),
            per_iter_us(b, size.iters),
            per_iter_us(bt, size.iters),
            per_iter_us(l, size.iters),
            local_ratio,
            per_iter_us(d, size.iters),
            ddp_ratio,
            fg,
            mg,
            copy_ratio
        );
    }
    println!(
        "\ntargets: local / bare <= 1.05, ddp1 / bare <= 1.10, flatten+write-back >= 0.5x memcpy"
    );
}
