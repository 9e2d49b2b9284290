//! The outer-optimizer test vectors and equivalences E1-E10 (the book's semantics §10):
//! R = 4 replicas, scalar `w`, loss `(w − r)²/2`, inner SGD lr 0.1, `w0 = 1`, sync after steps
//! 3, 6, 9, 12. Values are the reference's (a float64 numpy oracle, cross-checked with torchft, fairscale
//! and `torch.optim.SGD`).

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::DType;
use localsgd_averagers::comm::ThreadWorld;
use localsgd_averagers::comm::params::{FlatBuffer, ParamSelection, flatten_params, write_params};
use localsgd_averagers::{
    AverageParameters, AveragerError, HierarchicalModelAverager, ModelAverager, OuterAverager,
    OuterOptimizer, OuterSgdConfig, OuterState, PeriodicModelAverager, PseudoGradient,
};

#[derive(Module, Debug)]
pub(crate) struct Scalar {
    w: Param<Tensor<1>>,
}

pub(crate) fn scalar(value: f64, dtype: DType) -> Scalar {
    let device = Device::flex();
    let t = Tensor::<1>::from_data(TensorData::from([value]), (&device, DType::F64));
    Scalar {
        w: Param::from_tensor(if dtype == DType::F64 {
            t
        } else {
            t.cast(dtype)
        }),
    }
}

pub(crate) fn get(m: &Scalar) -> f64 {
    match flatten_params(m, &ParamSelection::All).map(|f| f.buffer) {
        Ok(FlatBuffer::F64(v)) => v[0],
        Ok(FlatBuffer::F32(v)) => v[0] as f64,
        Err(e) => panic!("{e}"),
    }
}

/// One inner SGD step on `(w − target)²/2`: `w ← w − lr·(w − target)`, in the model's type.
pub(crate) fn inner_step(m: Scalar, lr: f64, target: f64) -> Scalar {
    let mut flat = flatten_params(&m, &ParamSelection::All).expect("flatten");
    match &mut flat.buffer {
        FlatBuffer::F64(v) => v[0] -= lr * (v[0] - target),
        FlatBuffer::F32(v) => v[0] -= (lr as f32) * (v[0] - target as f32),
    }
    write_params(m, &flat).expect("write")
}

pub(crate) struct Run {
    /// `w` after every sync step, per rank.
    pub(crate) syncs: Vec<Vec<f64>>,
    /// The outer momentum after every sync (rank 0).
    pub(crate) momentum: Vec<Option<f64>>,
}

/// `steps` inner steps on 4 ranks with `make` building each rank's averager; the inner lr of
/// step `s` (1-based) is `lr(s)`. Records `w` after the steps where the averager synced.
pub(crate) fn run(
    steps: u64,
    dtype: DType,
    lr: fn(u64) -> f64,
    make: impl Fn(localsgd_averagers::Group) -> Result<Box<dyn ModelAverager>, AveragerError> + Sync,
) -> Run {
    let out = ThreadWorld::new(4)
        .expect("world")
        .run(|world| {
            let target = world.rank() as f64;
            let mut averager = make(world).expect("averager");
            let mut model = scalar(1.0, dtype);
            if let Some(outer) = averager.outer_mut() {
                outer
                    .reset_global(&model, &ParamSelection::All)
                    .expect("reset");
            }
            let mut syncs = Vec::new();
            let mut momentum = Vec::new();
            for s in 1..=steps {
                model = inner_step(model, lr(s), target);
                if let Some(outer) = averager.outer_mut() {
                    outer.set_inner_lr(lr(s));
                }
                let synced = averager.scheduled_group().is_some();
                model = averager
                    .average_parameters(model, &ParamSelection::All)
                    .expect("average");
                if synced {
                    syncs.push(get(&model));
                    momentum.push(averager.outer().and_then(|o| match o.outer_momentum() {
                        Some(FlatBuffer::F64(v)) => Some(v[0]),
                        Some(FlatBuffer::F32(v)) => Some(v[0] as f64),
                        None => None,
                    }));
                }
            }
            (syncs, momentum)
        })
        .expect("run");
    let momentum = out[0].1.clone();
    let per_rank: Vec<Vec<f64>> = out.into_iter().map(|(s, _)| s).collect();
    let syncs = (0..per_rank[0].len())
        .map(|i| per_rank.iter().map(|r| r[i]).collect())
        .collect();
    Run { syncs, momentum }
}

pub(crate) fn lr01(_: u64) -> f64 {
    0.1
}

fn diloco(
    opt: OuterOptimizer,
    reduce: PseudoGradient,
) -> impl Fn(localsgd_averagers::Group) -> Result<Box<dyn ModelAverager>, AveragerError> + Sync {
    move |world| {
        Ok(Box::new(
            OuterAverager::periodic(3, 0, opt, world)?.with_reduce(reduce)?,
        ))
    }
}

/// Every rank ends every sync with the same `w`, equal to `expected` within `rtol`.
pub(crate) fn assert_syncs(run: &Run, expected: &[f64], rtol: f64) {
    assert_eq!(run.syncs.len(), expected.len(), "number of syncs");
    for (i, (got, &want)) in run.syncs.iter().zip(expected).enumerate() {
        for &g in got {
            assert!(
                (g - want).abs() <= rtol * want.abs(),
                "sync {}: got {g}, expected {want} (all ranks: {got:?})",
                i + 1
            );
        }
    }
}

const V1: [f64; 4] = [1.1355, 1.2342795, 1.3062897555, 1.3587852317595];
const V2_THETA: [f64; 4] = [
    1.180215,
    1.37230360755,
    1.5366120720257535,
    1.6494919958507008,
];
const V2_BUFFER: [f64; 4] = [
    -0.1355,
    -0.208611735,
    -0.22235628385394995,
    -0.1901987839495758,
];
const V4: [f64; 4] = [1.09485, 1.257071955, 1.4491551646365, 1.631675318577806];

#[test]
fn v1_periodic_and_e1_diloco_sgd_lr1_is_periodic_averaging() {
    let periodic = run(12, DType::F64, lr01, |w| {
        Ok(Box::new(PeriodicModelAverager::new(3, 2, w)?))
    });
    assert_syncs(&periodic, &V1, 1e-12);
    for reduce in [PseudoGradient::MeanOfDeltas, PseudoGradient::DeltaOfMean] {
        let r = run(
            12,
            DType::F64,
            lr01,
            diloco(OuterSgdConfig::sgd(1.0).into(), reduce),
        );
        assert_syncs(&r, &V1, 1e-12);
        // m = 0: torch keeps no momentum buffer.
        assert!(r.momentum.iter().all(Option::is_none));
    }
}

#[test]
fn v2_diloco_nesterov_theta_and_momentum_buffer() {
    for reduce in [PseudoGradient::MeanOfDeltas, PseudoGradient::DeltaOfMean] {
        let r = run(
            12,
            DType::F64,
            lr01,
            diloco(OuterSgdConfig::diloco().into(), reduce),
        );
        assert_syncs(&r, &V2_THETA, 1e-12);
        for (got, want) in r.momentum.iter().zip(V2_BUFFER) {
            let got = got.expect("a momentum buffer after every outer step");
            assert!((got - want).abs() <= 1e-12 * want.abs(), "{got} vs {want}");
        }
    }
    // f32 within the reference's 1e-6.
    let r = run(
        12,
        DType::F32,
        lr01,
        diloco(
            OuterSgdConfig::diloco().into(),
            PseudoGradient::MeanOfDeltas,
        ),
    );
    assert_syncs(&r, &V2_THETA, 1e-6);
}

#[test]
fn e3_momentum_is_not_periodic_averaging_v4_heavy_ball_equals_v5d_slowmo() {
    let heavy = OuterSgdConfig::sgd(0.7).with_momentum(0.9);
    let r = run(
        12,
        DType::F64,
        lr01,
        diloco(heavy.into(), PseudoGradient::MeanOfDeltas),
    );
    assert_syncs(&r, &V4, 1e-12);
    assert!((r.syncs[0][0] - V1[0]).abs() > 1e-3, "E3: not periodic");
    // E5: SlowMo(α 0.7, β 0.9) at constant inner lr 0.1 is the same heavy ball (V5d).
    let slow = OuterOptimizer::SlowMo {
        lr: 0.7,
        momentum: 0.9,
    };
    let s = run(
        12,
        DType::F64,
        lr01,
        diloco(slow, PseudoGradient::DeltaOfMean),
    );
    assert_syncs(&s, &V4, 1e-12);
    let s32 = run(
        12,
        DType::F32,
        lr01,
        diloco(slow, PseudoGradient::DeltaOfMean),
    );
    assert_syncs(&s32, &V4, 1e-6);
}

#[test]
fn v5_slowmo_fairscale_default_and_the_disabled_shortcut() {
    // (α 1, β 0.5): fairscale's defaults.
    let s = run(
        12,
        DType::F64,
        lr01,
        diloco(
            OuterOptimizer::SlowMo {
                lr: 1.0,
                momentum: 0.5,
            },
            PseudoGradient::DeltaOfMean,
        ),
    );
    assert_syncs(
        &s,
        &[
            1.1355,
            1.3020294999999997,
            1.4389442554999996,
            1.5239477400094996,
        ],
        1e-12,
    );
    // E4: (1, 0) skips the slow step: bitwise the plain periodic average (V5a), also in f32.
    for dtype in [DType::F64, DType::F32] {
        let off = run(
            12,
            dtype,
            lr01,
            diloco(
                OuterOptimizer::SlowMo {
                    lr: 1.0,
                    momentum: 0.0,
                },
                PseudoGradient::DeltaOfMean,
            ),
        );
        let periodic = run(12, dtype, lr01, |w| {
            Ok(Box::new(PeriodicModelAverager::new(3, 2, w)?))
        });
        assert_eq!(off.syncs, periodic.syncs);
    }
}

fn lr_change(s: u64) -> f64 {
    if s <= 6 { 0.1 } else { 0.05 }
}

#[test]
fn v6_e6_inner_lr_change_separates_slowmo_from_heavy_ball() {
    let slow = run(
        12,
        DType::F64,
        lr_change,
        diloco(
            OuterOptimizer::SlowMo {
                lr: 0.7,
                momentum: 0.9,
            },
            PseudoGradient::DeltaOfMean,
        ),
    );
    assert_syncs(
        &slow,
        &[1.09485, 1.257071955, 1.3543251634426876, 1.456396862535897],
        1e-12,
    );
    let heavy = run(
        12,
        DType::F64,
        lr_change,
        diloco(
            OuterSgdConfig::sgd(0.7).with_momentum(0.9).into(),
            PseudoGradient::MeanOfDeltas,
        ),
    );
    assert_syncs(
        &heavy,
        &[1.09485, 1.257071955, 1.4273250431926876, 1.5878085085663565],
        1e-12,
    );
}

#[test]
fn v7_lazy_initialisation_is_not_reproduced() {
    // fairscale without `_init_global_momentum_buffers` takes θ after inner step 1 (V7a
    // 1.06485, ...). θ is taken eagerly here, so the run is V5d's, never V7a's.
    let s = run(
        12,
        DType::F64,
        lr01,
        diloco(
            OuterOptimizer::SlowMo {
                lr: 0.7,
                momentum: 0.9,
            },
            PseudoGradient::DeltaOfMean,
        ),
    );
    assert!((s.syncs[0][0] - 1.06485).abs() > 1e-3);
    assert_syncs(&s, &V4, 1e-12);
}

fn lr_quarter(_: u64) -> f64 {
    0.25
}

#[test]
fn v9_e10_dyadic_data_is_bitwise_periodic_in_both_reductions() {
    let expected = [1.21875, 1.341796875, 1.4110107421875, 1.4499435424804688];
    for dtype in [DType::F64, DType::F32] {
        let periodic = run(8, dtype, lr_quarter, |w| {
            Ok(Box::new(PeriodicModelAverager::new(2, 1, w)?))
        });
        for (got, want) in periodic.syncs.iter().zip(expected) {
            assert!(got.iter().all(|&g| g == want), "{got:?} vs {want}");
        }
        for reduce in [PseudoGradient::MeanOfDeltas, PseudoGradient::DeltaOfMean] {
            let r = run(8, dtype, lr_quarter, move |w| {
                Ok(Box::new(
                    OuterAverager::periodic(2, 0, OuterSgdConfig::sgd(1.0).into(), w)?
                        .with_reduce(reduce)?,
                ))
            });
            assert_eq!(r.syncs, periodic.syncs, "{dtype:?} {reduce:?}");
        }
    }
}

#[test]
fn e2_outer_sgd_without_momentum_interpolates() {
    // θ' = (1 − η)θ + η·x̄ with η = 0.5: after round 1, 0.5 + 0.5·1.1355.
    let r = run(
        3,
        DType::F64,
        lr01,
        diloco(
            OuterSgdConfig::sgd(0.5).into(),
            PseudoGradient::MeanOfDeltas,
        ),
    );
    assert_syncs(&r, &[0.5 + 0.5 * 1.1355], 1e-12);
}

#[test]
fn hierarchical_lower_levels_average_and_the_top_level_takes_the_outer_step() {
    // Pairs every step, everyone every 2 steps; with outer SGD(1, 0) on dyadic data this is
    // bitwise the plain hierarchical averager.
    let plain = run(8, DType::F64, lr_quarter, |w| {
        Ok(Box::new(HierarchicalModelAverager::new(
            &[(1, 2), (2, 4)],
            0,
            w,
        )?))
    });
    let outer = run(8, DType::F64, lr_quarter, |w| {
        let h = HierarchicalModelAverager::new(&[(1, 2), (2, 4)], 0, w.clone())?;
        Ok(Box::new(OuterAverager::new(
            Box::new(h),
            OuterSgdConfig::sgd(1.0).into(),
            w,
        )?))
    });
    assert_eq!(plain.syncs, outer.syncs);
    // With Nesterov the top level differs (pairs still agree within themselves).
    let nesterov = run(8, DType::F64, lr_quarter, |w| {
        let h = HierarchicalModelAverager::new(&[(1, 2), (2, 4)], 0, w.clone())?;
        Ok(Box::new(OuterAverager::new(
            Box::new(h),
            OuterSgdConfig::diloco().into(),
            w,
        )?))
    });
    assert_ne!(plain.syncs, nesterov.syncs);
    for s in &nesterov.syncs {
        assert_eq!(s[0], s[1]);
        assert_eq!(s[2], s[3]);
    }
}

#[test]
fn theta_is_refreshed_at_the_end_of_the_warmup() {
    // Two synchronous warm-up steps towards the consensus 1.5 (what DDP would do on the mean
    // loss), then DiLoCo(3) with Nesterov. Reference, semantics §8.1: θ = w after the warm-up.
    let out = ThreadWorld::new(4)
        .expect("world")
        .run(|world| {
            let target = world.rank() as f64;
            let mut a = OuterAverager::periodic(3, 2, OuterSgdConfig::diloco().into(), world)
                .expect("averager");
            let mut model = scalar(1.0, DType::F64);
            a.reset_global(&model, &ParamSelection::All).expect("reset");
            for s in 0..5 {
                model = inner_step(model, 0.1, if s < 2 { 1.5 } else { target });
                model = a
                    .average_parameters(model, &ParamSelection::All)
                    .expect("average");
            }
            get(&model)
        })
        .expect("run");
    // Warm-up: 1 → 1.05 → 1.095. Three local steps from 1.095 on targets 0..3, then one
    // Nesterov(0.7, 0.9) step from θ = 1.095 with Δ = θ − mean(x).
    let mut theta = 1.0f64;
    for _ in 0..2 {
        theta -= 0.1 * (theta - 1.5);
    }
    let mean = (0..4)
        .map(|r| {
            let mut w = theta;
            for _ in 0..3 {
                w -= 0.1 * (w - r as f64);
            }
            w
        })
        .sum::<f64>()
        / 4.0;
    let delta = theta - mean;
    let expected = theta - 0.7 * (delta + 0.9 * delta);
    for w in out {
        assert!((w - expected).abs() < 1e-12, "{w} vs {expected}");
    }
}

#[test]
fn state_round_trip_resumes_bitwise() {
    let make =
        |w| OuterAverager::periodic(3, 0, OuterSgdConfig::diloco().into(), w).expect("averager");
    let out = ThreadWorld::new(4)
        .expect("world")
        .run(|world| {
            let target = world.rank() as f64;
            let mut a = make(world.clone());
            let mut model = scalar(1.0, DType::F32);
            a.reset_global(&model, &ParamSelection::All).expect("reset");
            let mut saved = None;
            for s in 0..12 {
                model = inner_step(model, 0.1, target);
                model = a
                    .average_parameters(model, &ParamSelection::All)
                    .expect("average");
                if s == 5 {
                    let bytes = a
                        .global_state()
                        .expect("settled")
                        .expect("θ taken")
                        .to_bytes();
                    saved = Some((a.state(), bytes, get(&model)));
                }
            }
            let uninterrupted = get(&model);
            // Resume from the round boundary after step 6 in a fresh averager.
            let (state, bytes, w) = saved.expect("saved");
            let mut b = make(world);
            b.load_state(&state).expect("load state");
            b.load_global_state(&OuterState::from_bytes(&bytes).expect("decode"))
                .expect("load θ");
            let mut model = scalar(w, DType::F32);
            for _ in 6..12 {
                model = inner_step(model, 0.1, target);
                model = b
                    .average_parameters(model, &ParamSelection::All)
                    .expect("average");
            }
            (uninterrupted, get(&model), b.outer_steps())
        })
        .expect("run");
    for (a, b, steps) in out {
        assert_eq!(a.to_bits(), b.to_bits());
        assert_eq!(steps, 4);
    }
}

#[test]
fn refusals_name_the_bad_setting() {
    let out = ThreadWorld::new(2)
        .expect("world")
        .run(|world| {
            let mut errors = Vec::new();
            // No θ: an error, never a lazy snapshot.
            let mut a =
                OuterAverager::periodic(1, 0, OuterSgdConfig::diloco().into(), world.clone())
                    .expect("averager");
            let model = scalar(1.0, DType::F64);
            errors.push(
                a.average_parameters(model, &ParamSelection::All)
                    .map(|_| ())
                    .unwrap_err()
                    .to_string(),
            );
            // SlowMo without the inner lr.
            let mut s = OuterAverager::periodic(
                1,
                0,
                OuterOptimizer::SlowMo {
                    lr: 0.7,
                    momentum: 0.5,
                },
                world.clone(),
            )
            .expect("averager");
            let model = scalar(1.0, DType::F64);
            s.reset_global(&model, &ParamSelection::All).expect("reset");
            errors.push(
                s.average_parameters(model, &ParamSelection::All)
                    .map(|_| ())
                    .unwrap_err()
                    .to_string(),
            );
            errors.push(
                OuterAverager::periodic(
                    2,
                    0,
                    OuterOptimizer::SlowMo {
                        lr: 1.0,
                        momentum: 0.5,
                    },
                    world.clone(),
                )
                .and_then(|a| a.with_reduce(PseudoGradient::MeanOfDeltas))
                .map(|_| ())
                .unwrap_err()
                .to_string(),
            );
            let overlapped = PeriodicModelAverager::new(4, 0, world.clone())
                .and_then(|p| p.with_overlap(2))
                .expect("overlap");
            errors.push(
                OuterAverager::new(Box::new(overlapped), OuterSgdConfig::diloco().into(), world)
                    .map(|_| ())
                    .unwrap_err()
                    .to_string(),
            );
            errors
        })
        .expect("run");
    let e = &out[0];
    assert!(e[0].contains("reset_global"), "{}", e[0]);
    assert!(
        e[1].contains("not set") && e[1].contains("set_inner_lr"),
        "{}",
        e[1]
    );
    assert!(e[2].contains("delta-of-mean"), "{}", e[2]);
    assert!(e[3].contains("overlap"), "{}", e[3]);
    let nesterov = OuterSgdConfig::sgd(0.7).with_nesterov(true).validate();
    assert!(
        nesterov
            .unwrap_err()
            .to_string()
            .contains("Nesterov momentum requires a momentum and zero dampening")
    );
    let negative = OuterSgdConfig::sgd(-0.1)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        negative.contains("-0.1") && negative.contains(">= 0"),
        "{negative}"
    );
}

#[test]
fn torch_first_step_buffer_rule_with_dampening() {
    // torch: the first buffer is the gradient itself (no dampening), later ones
    // m·buf + (1 − d)·g. Gradients 1 then 1, m 0.5, d 0.5: buffers 1, then 0.5 + 0.5 = 1.
    let mut sgd = localsgd_averagers::OuterSgd::new(
        OuterSgdConfig::sgd(1.0)
            .with_momentum(0.5)
            .with_dampening(0.5),
    )
    .expect("sgd");
    let mut p = FlatBuffer::F64(vec![0.0]);
    let g = FlatBuffer::F64(vec![1.0]);
    sgd.step(&mut p, &g).expect("step");
    assert_eq!(sgd.momentum_buffer(), Some(&FlatBuffer::F64(vec![1.0])));
    assert_eq!(p, FlatBuffer::F64(vec![-1.0]));
    sgd.step(&mut p, &g).expect("step");
    assert_eq!(sgd.momentum_buffer(), Some(&FlatBuffer::F64(vec![1.0])));
    assert_eq!(p, FlatBuffer::F64(vec![-2.0]));
    // Weight decay adds wd·p to the gradient: p = −2, g = 1 + 0.5·(−2) = 0 → p stays.
    let mut wd = localsgd_averagers::OuterSgd::new(OuterSgdConfig::sgd(1.0).with_weight_decay(0.5))
        .expect("sgd");
    wd.step(&mut p, &g).expect("step");
    assert_eq!(p, FlatBuffer::F64(vec![-2.0]));
}

/// The V2 problem (DiLoCo, Nesterov 0.7/0.9, f64) with the pseudo-gradients sent in half
/// precision. Reference from the definition: each rank's `θ − x_r` rounded to the half type
/// once, divided by 4 there, summed there in rank order (IEEE half additions), back to f64
/// exactly; then torch's SGD step on `θ`.
fn compressed_reference(bf16: bool) -> Vec<f64> {
    use half::{bf16 as B, f16 as H};
    let round = |v: f32| -> f64 {
        if bf16 {
            B::from_f32(v).to_f64()
        } else {
            H::from_f32(v).to_f64()
        }
    };
    let to_half = |v: f64| -> f64 {
        if bf16 {
            B::from_f64(v).to_f64()
        } else {
            H::from_f64(v).to_f64()
        }
    };
    let (mut theta, mut buf): (f64, Option<f64>) = (1.0, None);
    let mut x = [1.0f64; 4];
    let mut out = Vec::new();
    for _ in 0..4 {
        for _ in 0..3 {
            for (r, xr) in x.iter_mut().enumerate() {
                *xr -= 0.1 * (*xr - r as f64);
            }
        }
        // Halves are exact in f32, so f32 arithmetic rounded once is IEEE half arithmetic.
        let parts: Vec<f64> = x
            .iter()
            .map(|&xr| round(to_half(theta - xr) as f32 / 4.0))
            .collect();
        let delta = parts[1..]
            .iter()
            .fold(parts[0], |acc, &p| round((acc as f32) + (p as f32)));
        let b = match buf {
            None => delta,
            Some(b) => 0.9 * b + delta,
        };
        buf = Some(b);
        theta -= 0.7 * (delta + 0.9 * b);
        x = [theta; 4];
        out.push(theta);
    }
    out
}

#[test]
fn compressed_pseudo_gradients_round_once_and_average_in_half_precision() {
    for (precision, bf16) in [
        (localsgd_averagers::comm::Precision::Fp16, false),
        (localsgd_averagers::comm::Precision::Bf16, true),
    ] {
        let expected = compressed_reference(bf16);
        let r = run(12, DType::F64, lr01, move |w| {
            Ok(Box::new(
                OuterAverager::periodic(3, 0, OuterSgdConfig::diloco().into(), w)?
                    .with_compression(Some(precision.into()))?,
            ))
        });
        for (k, (got, want)) in r.syncs.iter().zip(&expected).enumerate() {
            assert!(
                got.iter().all(|g| g == want),
                "{precision} sync {}: {got:?}, reference {want}",
                k + 1
            );
        }
        // The rounding is visible: not the full-precision V2.
        assert!(
            (r.syncs[0][0] - V2_THETA[0]).abs() > 1e-6,
            "{precision}: {}",
            r.syncs[0][0]
        );
        assert!((r.syncs[3][0] - V2_THETA[3]).abs() < 1e-2);
    }
}

#[test]
fn compression_halves_the_bytes_of_a_sync_and_needs_mean_of_deltas() {
    let bytes = |precision: Option<localsgd_averagers::comm::Precision>| {
        ThreadWorld::new(2)
            .expect("world")
            .run(|world| {
                let mut a =
                    OuterAverager::periodic(1, 0, OuterSgdConfig::diloco().into(), world.clone())
                        .expect("averager")
                        .with_compression(precision.map(Into::into))
                        .expect("compression");
                let model = scalar(1.0, DType::F32);
                a.reset_global(&model, &ParamSelection::All).expect("reset");
                let before = world.traffic();
                a.average_parameters(
                    inner_step(model, 0.1, world.rank() as f64),
                    &ParamSelection::All,
                )
                .expect("sync");
                (world.traffic() - before).data_bytes
            })
            .expect("run")[0]
    };
    // One f32 parameter: 4 bytes of pseudo-gradient, 2 in half precision.
    assert_eq!(bytes(None), 4);
    assert_eq!(bytes(Some(localsgd_averagers::comm::Precision::Fp16)), 2);
    assert_eq!(bytes(Some(localsgd_averagers::comm::Precision::Bf16)), 2);

    let world = ThreadWorld::new(1).expect("world");
    let err = world
        .run(|g| {
            OuterAverager::periodic(
                3,
                0,
                OuterOptimizer::SlowMo {
                    lr: 1.0,
                    momentum: 0.5,
                },
                g,
            )
            .and_then(|a| {
                a.with_compression(Some(localsgd_averagers::comm::Precision::Fp16.into()))
            })
            .map(|_| ())
        })
        .expect("run")
        .remove(0)
        .expect_err("SlowMo averages parameters: no compression");
    assert!(err.to_string().contains("fp16 compression"), "{err}");
    let err = world
        .run(|g| {
            OuterAverager::periodic(3, 0, OuterSgdConfig::diloco().into(), g)
                .and_then(|a| {
                    a.with_compression(Some(localsgd_averagers::comm::Precision::Bf16.into()))
                })
                .and_then(|a| a.with_reduce(PseudoGradient::DeltaOfMean))
                .map(|_| ())
        })
        .expect("run")
        .remove(0)
        .expect_err("delta of mean after compression");
    assert!(err.to_string().contains("mean-of-deltas"), "{err}");
}
