//! DiLoCo and SlowMo through the whole pipeline (`algorithm::build`, the post-local SGD hook's
//! warmup, θ taken before the first optimizer step, SlowMo's inner learning rate from the
//! scheduler) on the scalar problem of the book's semantics §10: 4 ranks, `loss_r = ½(w − r)²`, inner SGD lr 0.1,
//! `w0 = 1`, a sync after every 3 local steps. Expected values are the vectors of
//! the outer-optimizer vectors V2, V5c and V6 (semantics §10), f64, rtol 1e-12.

use burn::module::{Module, Param};
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::tensor::{DType, Device, Tensor, TensorData};
use localsgd_averagers::{OuterOptimizer, OuterSgdConfig, PseudoGradient};
use localsgd_comm::ThreadWorld;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_pipeline::algorithm::{AlgorithmSpec, build};
use localsgd_pipeline::lr_schedule::LrSchedule;
use localsgd_pipeline::pipeline::{IterSource, Outcome, Pipeline, PipelineOptions};
use localsgd_pipeline::settings::{
    AlgorithmKind, GradientCompression, OuterSettings, PipelineBuckets,
};

#[derive(Module, Debug)]
struct Scalar {
    w: Param<Tensor<1>>,
}

fn scalar(device: &Device, w: f64) -> Scalar {
    let t = Tensor::<1>::from_data(TensorData::from([w]), (device, DType::F64));
    Scalar {
        w: Param::from_tensor(t),
    }
}

fn value(m: &Scalar) -> f64 {
    match flatten_params(m, &ParamSelection::All).unwrap().buffer {
        FlatBuffer::F64(v) => v[0],
        other => panic!("expected f64, got {other:?}"),
    }
}

fn first(b: &FlatBuffer) -> f64 {
    match b {
        FlatBuffer::F64(v) => v[0],
        other => panic!("expected f64, got {other:?}"),
    }
}

/// `½(w − r)²` with `r` the batch.
fn loss(m: &Scalar, target: &f64) -> Tensor<1> {
    let d = m.w.val() - *target;
    (d.clone() * d) * 0.5
}

fn spec(kind: AlgorithmKind, warmup: u64, outer: OuterOptimizer) -> AlgorithmSpec {
    AlgorithmSpec {
        kind,
        warmup,
        period: Some(3),
        overlap: 0,
        levels: Vec::new(),
        subgroup_size: None,
        post_local_allreduce: false,
        pipeline_buckets: PipelineBuckets::Off,
        caps: localsgd_hooks::BucketCaps {
            first_bytes: 1 << 20,
            rest_bytes: 1 << 20,
        },
        compression: GradientCompression::None,
        outer: Some(OuterSettings {
            optimizer: outer,
            reduce: outer.default_reduce(),
            compression: None,
            slowmo_frequency: None,
            streaming: None,
        }),
    }
}

/// Per rank, after every iteration: (w, θ, outer momentum).
type Trace = Vec<(f64, Option<f64>, Option<f64>)>;

fn run(spec: AlgorithmSpec, steps: usize, schedule: Option<LrSchedule>) -> Vec<Trace> {
    ThreadWorld::new(4)
        .unwrap()
        .run(|g| {
            let device = Device::flex().autodiff();
            let parts = build(&spec, &g).unwrap();
            assert!(parts.averager.is_some(), "an averager");
            let mut p = Pipeline::new(
                g.clone(),
                burn::optim::SgdConfig::new().init(),
                PipelineOptions {
                    lr: 0.1,
                    ..Default::default()
                },
            )
            .with_parts(parts);
            if let Some(s) = schedule.clone() {
                p = p.with_lr_scheduler(ModuleLrScheduler::new(s.scheduler()));
            }
            let target = g.rank() as f64;
            let mut src = IterSource(std::iter::repeat_n(target, steps));
            let mut m = scalar(&device, 1.0);
            let mut trace = Vec::new();
            for _ in 0..steps {
                m = match p.run_iteration(m, &mut src, &loss).unwrap() {
                    Outcome::Trained(m, _) => m,
                    Outcome::EndOfData(_) => panic!("data ran out"),
                };
                let outer = p.averager().and_then(|a| a.outer()).unwrap();
                trace.push((
                    value(&m),
                    outer.global_params().map(first),
                    outer.outer_momentum().map(first),
                ));
            }
            trace
        })
        .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

/// Every rank's `w` after 1-based steps 3, 6, 9, 12 equals `expected`.
fn assert_syncs(traces: &[Trace], expected: &[f64]) {
    for (rank, t) in traces.iter().enumerate() {
        for (k, want) in expected.iter().enumerate() {
            let (w, theta, _) = t[3 * k + 2];
            assert!(
                close(w, *want),
                "rank {rank} sync {}: w {w}, want {want}",
                k + 1
            );
            assert_eq!(theta, Some(w), "rank {rank} sync {}: θ = x", k + 1);
        }
    }
}

#[test]
fn diloco_in_the_pipeline_gives_vector_v2() {
    let traces = run(
        spec(AlgorithmKind::Diloco, 0, OuterSgdConfig::diloco().into()),
        12,
        None,
    );
    assert_syncs(
        &traces,
        &[
            1.180215,
            1.37230360755,
            1.5366120720257535,
            1.6494919958507008,
        ],
    );
    // θ was taken before the first step (w0 = 1) and stays until the first sync.
    assert_eq!(traces[0][0].1, Some(1.0));
    assert_eq!(traces[0][1].1, Some(1.0));
    // Local steps between syncs: rank 0 (target 0) moves by inner SGD alone.
    assert!(close(traces[0][0].0, 0.9));
    // The momentum buffer column of V2.
    let buffers = [
        -0.1355,
        -0.208611735,
        -0.22235628385394995,
        -0.1901987839495758,
    ];
    for (k, want) in buffers.iter().enumerate() {
        let got = traces[3][3 * k + 2].2.unwrap();
        assert!(
            close(got, *want),
            "sync {}: buffer {got}, want {want}",
            k + 1
        );
    }
}

#[test]
fn slowmo_in_the_pipeline_gives_vector_v5c_with_fairscale_defaults() {
    let traces = run(
        spec(
            AlgorithmKind::Slowmo,
            0,
            OuterOptimizer::SlowMo {
                lr: 1.0,
                momentum: 0.5,
            },
        ),
        12,
        None,
    );
    assert_syncs(
        &traces,
        &[
            1.1355,
            1.3020294999999997,
            1.4389442554999996,
            1.5239477400094996,
        ],
    );
}

/// V6: the inner learning rate is 0.1 for steps 1–6 and 0.05 for 7–12 (StepLR(6, 0.5)); the
/// pipeline hands each step's rate to SlowMo's slow step.
#[test]
fn slowmo_follows_the_scheduled_inner_learning_rate_vector_v6() {
    let schedule = LrSchedule::Step {
        base: 0.1,
        step_size: 6,
        gamma: 0.5,
    };
    let slowmo = OuterOptimizer::SlowMo {
        lr: 0.7,
        momentum: 0.9,
    };
    let traces = run(
        spec(AlgorithmKind::Slowmo, 0, slowmo),
        12,
        Some(schedule.clone()),
    );
    assert_syncs(
        &traces,
        &[1.09485, 1.257071955, 1.3543251634426876, 1.456396862535897],
    );
    // The same schedule under DiLoCo heavy-ball SGD(0.7, 0.9) is V6's other row (E6).
    let heavy_ball = OuterSgdConfig::sgd(0.7).with_momentum(0.9);
    let traces = run(
        spec(AlgorithmKind::Diloco, 0, heavy_ball.into()),
        12,
        Some(schedule),
    );
    assert_syncs(
        &traces,
        &[1.09485, 1.257071955, 1.4273250431926876, 1.5878085085663565],
    );
}

/// With a warmup of W steps of gradient all-reduce (the post-local SGD hook), θ is the model
/// after step W and the first sync comes H local steps later (semantics §8.1). Expected values
/// from the formulas of semantics §8: during the warmup every rank steps on the mean gradient
/// `w − 1.5`; then the V2 round from that point.
#[test]
fn diloco_takes_theta_at_the_end_of_the_warmup() {
    let warmup = 2usize;
    let traces = run(
        spec(
            AlgorithmKind::Diloco,
            warmup as u64,
            OuterSgdConfig::diloco().into(),
        ),
        2 + 6,
        None,
    );
    // Reference: scalar torch-SGD arithmetic of semantics §8.2-8.3 (mean of deltas, Nesterov 0.7/0.9).
    let mut w = 1.0f64;
    for _ in 0..warmup {
        w -= 0.1 * (w - 1.5);
    }
    let mut theta = w;
    let mut buf: Option<f64> = None;
    let mut expected = Vec::new();
    let mut x = [w; 4];
    for _round in 0..2 {
        for _ in 0..3 {
            for (r, xr) in x.iter_mut().enumerate() {
                *xr -= 0.1 * (*xr - r as f64);
            }
        }
        let delta = x.iter().map(|xr| theta - xr).sum::<f64>() / 4.0;
        let b = match buf {
            None => delta,
            Some(b) => 0.9 * b + delta,
        };
        buf = Some(b);
        theta -= 0.7 * (delta + 0.9 * b);
        x = [theta; 4];
        expected.push(theta);
    }
    for (rank, t) in traces.iter().enumerate() {
        // Warmup: every rank equal, θ refreshed after the last warmup step.
        assert!(close(t[1].0, w), "rank {rank}: warmup w {}", t[1].0);
        assert_eq!(t[1].1, Some(t[1].0), "rank {rank}: θ after the warmup");
        for (k, want) in expected.iter().enumerate() {
            let got = t[warmup + 3 * k + 2].0;
            assert!(
                (got - want).abs() <= 1e-12,
                "rank {rank} sync {}: {got}, want {want}",
                k + 1
            );
        }
    }
    // Mean of deltas is what the outer-optimizer reference (semantics §10) is built with.
    assert_eq!(
        OuterOptimizer::from(OuterSgdConfig::diloco()).default_reduce(),
        PseudoGradient::MeanOfDeltas
    );
}
