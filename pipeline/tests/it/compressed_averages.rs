//! The averages of `local-sgd`, `post-local-sgd` and `hierarchical` sent through
//! `average-compression` (semantics §11.2) follow the plain averagers' schedule: with the lossless
//! codec `topk:1` (every value kept, in f32) each average `θ − mean_r(θ − x_r)` equals the plain
//! average `mean_r(x_r)` of the same run to rounding, at the same iterations, on every rank
//! alike. The plain runs are the reference (their averages are checked against PyTorch's
//! `PeriodicModelAverager`/`HierarchicalModelAverager` elsewhere); a wrong cadence, or a `θ`
//! taken where the replicas already differ, moves the models by far more than rounding. Where
//! `θ` starts is also checked directly: after the warmup (post-local SGD, hierarchical) or at
//! the start (local SGD). Which level hierarchical averaging compresses is checked by its bytes
//! (`cli.rs`, `plan_payload_matches_the_metrics_of_a_real_run_exactly`).

use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor, TensorData};
use localsgd_averagers::{AverageCompression, Level};
use localsgd_comm::ThreadWorld;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_pipeline::algorithm::{AlgorithmSpec, build};
use localsgd_pipeline::pipeline::{IterSource, Outcome, Pipeline, PipelineOptions};
use localsgd_pipeline::settings::{
    AlgorithmKind, GradientCompression, OuterSettings, PipelineBuckets,
};

const N: usize = 16;
const WORLD: usize = 4;
const STEPS: usize = 14;

#[derive(Module, Debug)]
struct Vector {
    w: Param<Tensor<1>>,
}

fn values(m: &Vector) -> Vec<f32> {
    match flatten_params(m, &ParamSelection::All).unwrap().buffer {
        FlatBuffer::F32(v) => v,
        other => panic!("expected f32, got {other:?}"),
    }
}

/// `½‖w − t‖²`, `t` rank `r`'s target (each rank pulls its replica elsewhere).
fn loss(m: &Vector, target: &[f32]) -> Tensor<1> {
    let t = Tensor::<1>::from_data(TensorData::new(target.to_vec(), [N]), &m.w.val().device());
    let d = m.w.val() - t;
    (d.clone() * d).sum() * 0.5
}

fn spec(
    kind: AlgorithmKind,
    levels: Vec<Level>,
    outer: Option<AverageCompression>,
) -> AlgorithmSpec {
    AlgorithmSpec {
        kind,
        warmup: 2,
        period: (kind != AlgorithmKind::Hierarchical).then_some(3),
        overlap: 0,
        levels,
        subgroup_size: None,
        post_local_allreduce: false,
        pipeline_buckets: PipelineBuckets::Off,
        caps: localsgd_hooks::BucketCaps {
            first_bytes: 1 << 20,
            rest_bytes: 1 << 20,
        },
        compression: GradientCompression::None,
        outer: outer.map(OuterSettings::averaging),
    }
}

fn start() -> Vec<f32> {
    (0..N).map(|i| (i as f32 * 0.3).cos()).collect()
}

/// One rank's parameters after each iteration, and the outer averager's `θ` (`None` without one).
type Trace = Vec<(Vec<f32>, Option<Vec<f32>>)>;

/// Every rank's trace.
fn run(spec: AlgorithmSpec) -> Vec<Trace> {
    spec.validate(WORLD).unwrap();
    ThreadWorld::new(WORLD)
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
            let r = g.rank();
            let target: Vec<f32> = (0..N)
                .map(|i| ((i * (r + 2)) as f32 * 0.7).sin() * (1.0 + r as f32))
                .collect();
            let mut src = IterSource(std::iter::repeat_n(target, STEPS));
            let mut m = Vector {
                w: Param::from_tensor(Tensor::from_data(TensorData::new(start(), [N]), &device)),
            };
            let mut trace = Vec::new();
            for _ in 0..STEPS {
                m = match p
                    .run_iteration(m, &mut src, &|m: &Vector, t: &Vec<f32>| loss(m, t))
                    .unwrap()
                {
                    Outcome::Trained(m, _) => m,
                    Outcome::EndOfData(_) => panic!("data ran out"),
                };
                let theta = p
                    .averager()
                    .and_then(|a| a.outer())
                    .and_then(|o| o.global_params())
                    .map(|t| match t {
                        FlatBuffer::F32(v) => v.clone(),
                        other => panic!("expected f32, got {other:?}"),
                    });
                trace.push((values(&m), theta));
            }
            trace
        })
        .unwrap()
}

/// Iterations after which every rank of `traces` holds the same parameters.
fn agreed(traces: &[Trace]) -> Vec<usize> {
    (0..STEPS)
        .filter(|&i| traces.iter().all(|t| t[i].0 == traces[0][i].0))
        .collect()
}

/// With compression, `θ` after the last warmup iteration (1) is the model there when
/// `theta_after_warmup`, else the starting model; without, there is no `θ`.
fn assert_compressed_equals_plain(
    kind: AlgorithmKind,
    levels: Vec<Level>,
    agree: &[usize],
    theta_after_warmup: bool,
) {
    let lossless = AverageCompression::lossy("topk:1".parse().unwrap());
    let plain = run(spec(kind, levels.clone(), None));
    let compressed = run(spec(kind, levels, Some(lossless)));
    assert_eq!(agreed(&plain), agree, "{kind:?}: plain averages");
    assert_eq!(agreed(&compressed), agree, "{kind:?}: compressed averages");
    for (rank, (p, c)) in plain.iter().zip(&compressed).enumerate() {
        assert_eq!(
            p[1].1, None,
            "{kind:?} rank {rank}: a θ without compression"
        );
        let want = if theta_after_warmup {
            c[1].0.clone()
        } else {
            start()
        };
        assert_eq!(
            c[1].1,
            Some(want),
            "{kind:?} rank {rank}: θ after the warmup"
        );
        for (i, ((p, _), (c, _))) in p.iter().zip(c).enumerate() {
            for (j, (a, b)) in p.iter().zip(c).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                    "{kind:?} rank {rank} iteration {i} element {j}: compressed {b}, plain {a}"
                );
            }
        }
    }
}

#[test]
fn post_local_sgd_averages_at_the_plain_iterations() {
    // Warmup iterations 0, 1 (gradients all-reduced: every rank equal), then averages at 2, 5,
    // 8, 11 (PeriodicModelAverager(3, 2)).
    assert_compressed_equals_plain(
        AlgorithmKind::PostLocalSgd,
        Vec::new(),
        &[0, 1, 2, 5, 8, 11],
        true,
    );
}

#[test]
fn local_sgd_takes_its_reference_model_before_the_first_step() {
    // No gradient all-reduce in the warmup: the replicas part at iteration 0, and the first
    // average (iteration 2) must measure each delta from the common starting model.
    assert_compressed_equals_plain(AlgorithmKind::LocalSgd, Vec::new(), &[2, 5, 8, 11], false);
}

#[test]
fn hierarchical_averages_at_the_plain_iterations() {
    // Pairs average every 2 iterations, the world every 6 (from iteration 2, after the warmup):
    // the world at 6 and 12, the pairs in between; only the world's averages agree everywhere.
    let levels = vec![
        Level {
            period: 2,
            group_size: 2,
        },
        Level {
            period: 6,
            group_size: 4,
        },
    ];
    assert_compressed_equals_plain(AlgorithmKind::Hierarchical, levels, &[0, 1, 6, 12], true);
}
