//! SlowMo with fairscale's two frequencies ([`OuterAverager::slowmo`]): per-step vectors from the
//! independent oracle (`tests/data/slowmo_frequencies.json`, written by
//! `tests/data/slowmo_frequencies.py` from `slowmo_fairscale` of the shared spec's
//! `outer_opt_sim.py`), equality with the single-frequency SlowMo when both frequencies are equal,
//! validation, and a checkpoint taken in the middle of a slow period.
//!
//! The toy problem is the outer-optimizer vectors' (see `outer_vectors`): 4 replicas, scalar `w`,
//! loss `(w − r)²/2`, inner SGD, `w0 = 1`.

use crate::common::solo_group;
use crate::outer_vectors::{Scalar, assert_syncs, get, inner_step, lr01, run, scalar};
use burn::tensor::DType;
use localsgd_averagers::comm::ThreadWorld;
use localsgd_averagers::comm::params::{FlatBuffer, ParamSelection};
use localsgd_averagers::{
    AverageParameters, AveragerConfig, AveragerError, AveragerState, Group, ModelAverager,
    OuterAverager, OuterOptimizer, OuterState, PseudoGradient, SlowMoConfig,
};

/// One oracle case of the JSON.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    lf: u64,
    sf: u64,
    alpha: f64,
    beta: f64,
    warmup: u64,
    warmup_target: f64,
    w0: f64,
    /// Inner lr of 1-based local step `s` at `[s − 1]`.
    lr: Vec<f64>,
    /// `w` of every replica after every local step.
    per_step: Vec<Vec<f64>>,
    /// 1-based local steps after which the replicas are identical (a world average).
    averaged: Vec<u64>,
    /// 1-based local steps with a slow step, and `θ` after each.
    slow_steps: Vec<u64>,
    after_slow: Vec<f64>,
}

impl Case {
    fn config(&self) -> SlowMoConfig {
        SlowMoConfig::new(self.lf, self.sf)
            .with_lr(self.alpha)
            .with_momentum(self.beta)
    }
}

fn cases() -> Vec<Case> {
    let json: serde_json::Value =
        serde_json::from_str(include_str!("../data/slowmo_frequencies.json")).expect("json");
    let f = |v: &serde_json::Value| v.as_f64().expect("number");
    let u = |v: &serde_json::Value| v.as_u64().expect("integer");
    let fs = |v: &serde_json::Value| v.as_array().expect("array").iter().map(f).collect();
    let us = |v: &serde_json::Value| v.as_array().expect("array").iter().map(u).collect();
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            assert_eq!(c["memory_efficient"], true);
            assert_eq!(c["init"], "eager");
            Case {
                name: c["name"].as_str().expect("name").to_string(),
                lf: u(&c["localsgd_frequency"]),
                sf: u(&c["slowmo_frequency"]),
                alpha: f(&c["slowmo_lr"]),
                beta: f(&c["slowmo_momentum"]),
                warmup: u(&c["warmup"]),
                warmup_target: f(&c["warmup_target"]),
                w0: f(&c["w0"]),
                lr: fs(&c["inner_lr"]),
                per_step: c["per_step"]
                    .as_array()
                    .expect("per_step")
                    .iter()
                    .map(fs)
                    .collect(),
                averaged: us(&c["averaged_steps"]),
                slow_steps: us(&c["slow_steps"]),
                after_slow: fs(&c["after_slow"]),
            }
        })
        .collect()
}

fn case(name: &str) -> Case {
    cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

/// What one rank saw at every local step.
#[derive(Debug, Clone, PartialEq)]
struct Step {
    /// `w` after the step's averaging.
    w: f64,
    /// Whether the schedule averaged at this step.
    scheduled: bool,
    /// Outer steps counted after the step.
    outer_steps: u64,
    /// `θ` and the slow momentum after the step (bit patterns, to compare exactly).
    theta: u64,
    momentum: Option<u64>,
}

fn first(b: Option<&FlatBuffer>) -> Option<f64> {
    match b? {
        FlatBuffer::F64(v) => Some(v[0]),
        FlatBuffer::F32(v) => Some(v[0] as f64),
    }
}

/// The warm-up (synchronous steps towards `warmup_target`, `θ` taken before it), then
/// `lr.len()` local steps on rank `rank`'s target; `save_after`: stop after that local step and
/// resume from a checkpoint (step counter, outer state, `w`) in a fresh averager from `make`.
fn trace(
    case: &Case,
    dtype: DType,
    world: Group,
    save_after: Option<u64>,
    make: &(dyn Fn(Group) -> Result<OuterAverager, AveragerError> + Sync),
) -> (f64, Vec<Step>) {
    let target = world.rank() as f64;
    let mut averager = make(world.clone()).expect("averager");
    let mut model = scalar(1.0, dtype);
    averager
        .reset_global(&model, &ParamSelection::All)
        .expect("reset");
    for _ in 0..case.warmup {
        model = inner_step(model, 0.1, case.warmup_target);
        averager.set_inner_lr(0.1);
        model = averager
            .average_parameters(model, &ParamSelection::All)
            .expect("warm-up step");
    }
    let after_warmup = get(&model);
    let mut steps = Vec::new();
    for (s, &lr) in (1u64..).zip(&case.lr) {
        model = inner_step(model, lr, target);
        averager.set_inner_lr(lr);
        let scheduled = averager.scheduled_group().is_some();
        model = averager
            .average_parameters(model, &ParamSelection::All)
            .expect("average");
        let bits = |v: Option<f64>| v.map(|x| x.to_bits());
        steps.push(Step {
            w: get(&model),
            scheduled,
            outer_steps: averager.outer_steps(),
            theta: bits(first(averager.global_params())).expect("θ"),
            momentum: bits(first(averager.outer_momentum())),
        });
        if save_after == Some(s) {
            let state = averager.state();
            let json = serde_json::to_string(&state).expect("state json");
            let outer = averager
                .global_state()
                .expect("settled")
                .expect("θ taken")
                .to_bytes();
            let w = get(&model);
            drop((averager, model));
            averager = make(world.clone()).expect("fresh averager");
            let state: AveragerState = serde_json::from_str(&json).expect("decode state");
            averager.load_state(&state).expect("load state");
            averager
                .load_global_state(&OuterState::from_bytes(&outer).expect("decode"))
                .expect("load θ");
            model = scalar(w, dtype);
        }
    }
    (after_warmup, steps)
}

/// [`trace`] on 4 ranks: per rank, `w` after the warm-up and the steps.
fn trace_world(
    case: &Case,
    dtype: DType,
    save_after: Option<u64>,
    make: impl Fn(Group) -> Result<OuterAverager, AveragerError> + Sync,
) -> Vec<(f64, Vec<Step>)> {
    ThreadWorld::new(4)
        .expect("world")
        .run(|world| trace(case, dtype, world, save_after, &make))
        .expect("run")
}

fn slowmo_of(case: &Case) -> impl Fn(Group) -> Result<OuterAverager, AveragerError> + Sync {
    let (config, warmup) = (case.config(), case.warmup);
    move |world| OuterAverager::slowmo(config, warmup, world)
}

/// Every replica's `w` after every step within `rtol` of the oracle; the schedule averages exactly
/// where the oracle's replicas end identical; the outer steps and `θ` follow the slow steps.
fn assert_case(case: &Case, ranks: &[(f64, Vec<Step>)], rtol: f64) {
    let name = &case.name;
    for (r, (after_warmup, steps)) in ranks.iter().enumerate() {
        assert!(
            (after_warmup - case.w0).abs() <= rtol * case.w0.abs(),
            "{name}: w after the warm-up {after_warmup}, oracle {}",
            case.w0
        );
        assert_eq!(steps.len(), case.per_step.len(), "{name}: steps");
        for (s, (got, want)) in (1u64..).zip(steps.iter().zip(&case.per_step)) {
            assert!(
                (got.w - want[r]).abs() <= rtol * want[r].abs(),
                "{name} step {s} replica {r}: {} vs the oracle's {}",
                got.w,
                want[r]
            );
        }
        let scheduled: Vec<u64> = (1u64..)
            .zip(steps)
            .filter(|(_, s)| s.scheduled)
            .map(|(s, _)| s)
            .collect();
        assert_eq!(scheduled, case.averaged, "{name}: averaging steps");
        let synced: Vec<u64> = (1u64..)
            .zip(steps)
            .scan(0, |prev, (s, step)| {
                let grew = step.outer_steps > *prev;
                *prev = step.outer_steps;
                Some((s, grew))
            })
            .filter(|&(_, grew)| grew)
            .map(|(s, _)| s)
            .collect();
        if case.config().slow_steps_enabled() {
            assert_eq!(synced, case.slow_steps, "{name}: slow steps");
            for (&s, &want) in case.slow_steps.iter().zip(&case.after_slow) {
                // f32 runs keep the f32 value widened to f64 (see `first`).
                let theta = f64::from_bits(steps[s as usize - 1].theta);
                assert!(
                    (theta - want).abs() <= rtol * want.abs(),
                    "{name}: θ after the slow step at {s}: {theta} vs {want}"
                );
            }
        } else {
            // fairscale's shortcut: no slow step; the averages are the syncs, as `periodic` counts.
            assert!(case.slow_steps.is_empty(), "{name}");
            assert_eq!(
                synced, case.averaged,
                "{name}: syncs of the disabled SlowMo"
            );
        }
    }
}

#[test]
fn oracle_vectors_per_step_f64() {
    let all = cases();
    assert!(all.len() >= 10, "{} cases", all.len());
    for case in &all {
        let ranks = trace_world(case, DType::F64, None, slowmo_of(case));
        assert_case(case, &ranks, 1e-12);
    }
}

#[test]
fn oracle_vectors_per_step_f32() {
    for name in [
        "lf2_sf8_alpha0.7_beta0.9",
        "lf3_sf4_alpha1_beta0.5_non_multiple",
        "warmup2_lf2_sf6_alpha0.7_beta0.9",
    ] {
        let case = case(name);
        let ranks = trace_world(&case, DType::F32, None, slowmo_of(&case));
        assert_case(&case, &ranks, 1e-6);
    }
}

#[test]
fn fairscale_defaults_are_the_default_config() {
    let case = case("fairscale_defaults_lf3_sf48");
    assert_eq!(case.config(), SlowMoConfig::default());
    let ranks = trace_world(&case, DType::F64, None, |w| {
        OuterAverager::slowmo(SlowMoConfig::default(), 0, w)
    });
    assert_case(&case, &ranks, 1e-12);
}

#[test]
fn non_multiple_frequencies_keep_the_replicas_identical_after_every_slow_step() {
    // lf 3, sf 4: averages after 3, 6, 9, slow steps after 4, 8, 12 (12 skips its average).
    let case = case("lf3_sf4_alpha1_beta0.5_non_multiple");
    assert_eq!(case.averaged, [3, 4, 6, 8, 9, 12]);
    assert_eq!(case.slow_steps, [4, 8, 12]);
    let ranks = trace_world(&case, DType::F64, None, slowmo_of(&case));
    for s in [3usize, 4, 6, 8, 9, 12] {
        let w: Vec<u64> = ranks.iter().map(|r| r.1[s - 1].w.to_bits()).collect();
        assert!(w.iter().all(|&x| x == w[0]), "step {s}: {w:?}");
    }
    // Between the average at 3 and the slow step at 4 the replicas differ.
    assert_ne!(ranks[0].1[1].w, ranks[3].1[1].w);
}

#[test]
fn the_disable_shortcut_is_plain_averaging_every_localsgd_frequency_steps() {
    // (α, β) = (1, 0): no slow step, no average at slowmo_frequency's steps 4 and 8.
    let case = case("lf3_sf4_alpha1_beta0_disabled");
    assert_eq!(case.averaged, [3, 6, 9, 12]);
    let ranks = trace_world(&case, DType::F64, None, slowmo_of(&case));
    assert_case(&case, &ranks, 1e-12);
    // The slow momentum never moves.
    for (_, steps) in &ranks {
        assert!(steps.iter().all(|s| s.momentum == Some(0f64.to_bits())));
    }
    // Bitwise the V1 periodic averages at the syncs (the oracle's V5a).
    let v1 = [1.1355, 1.2342795, 1.3062897555, 1.3587852317595];
    for (k, s) in [3usize, 6, 9, 12].into_iter().enumerate() {
        assert!((ranks[0].1[s - 1].w - v1[k]).abs() <= 1e-12 * v1[k]);
    }
}

/// `slowmo(H, H)` against `periodic(H, ...)` with the same SlowMo: every step's `w`, `θ`, slow
/// momentum and outer-step count bitwise equal.
#[test]
fn equal_frequencies_are_todays_slowmo_bitwise() {
    for (h, warmup, alpha, beta) in [
        (3, 0, 1.0, 0.5),
        (3, 0, 0.7, 0.9),
        (3, 2, 0.7, 0.9),
        (1, 0, 1.0, 0.5),
        (3, 0, 1.0, 0.0),
        (2, 3, 1.0, 0.0),
    ] {
        let template = Case {
            name: format!("H {h}, warmup {warmup}, α {alpha}, β {beta}"),
            lf: h,
            sf: h,
            alpha,
            beta,
            warmup,
            warmup_target: 1.5,
            w0: 0.0,
            lr: (1..=12).map(|s| if s <= 6 { 0.1 } else { 0.05 }).collect(),
            per_step: Vec::new(),
            averaged: Vec::new(),
            slow_steps: Vec::new(),
            after_slow: Vec::new(),
        };
        let optimizer = OuterOptimizer::SlowMo {
            lr: alpha,
            momentum: beta,
        };
        assert_eq!(template.config().optimizer(), optimizer);
        for dtype in [DType::F64, DType::F32] {
            let two = trace_world(&template, dtype, None, slowmo_of(&template));
            let today = trace_world(&template, dtype, None, |w| {
                OuterAverager::periodic(h, warmup, optimizer, w)
            });
            assert_eq!(two, today, "{} {dtype:?}", template.name);
            assert_eq!(two[0].1.last().map(|s| s.outer_steps), Some(12 / h));
        }
    }
    // And through the outer-optimizer vectors' own driver: V5c (fairscale's defaults) and V5d.
    let v5c = [
        1.1355,
        1.3020294999999997,
        1.4389442554999996,
        1.5239477400094996,
    ];
    let r = run(12, DType::F64, lr01, |w| {
        Ok(Box::new(OuterAverager::slowmo(
            SlowMoConfig::new(3, 3),
            0,
            w,
        )?))
    });
    assert_syncs(&r, &v5c, 1e-12);
    let v5d = [1.09485, 1.257071955, 1.4491551646365, 1.631675318577806];
    let config = SlowMoConfig::new(3, 3).with_lr(0.7).with_momentum(0.9);
    let r = run(12, DType::F64, lr01, move |w| {
        Ok(Box::new(OuterAverager::slowmo(config, 0, w)?))
    });
    assert_syncs(&r, &v5d, 1e-12);
    assert!(r.momentum.iter().all(Option::is_some));
}

#[test]
fn state_saved_in_the_middle_of_a_slow_period_resumes_bitwise() {
    // lf 2, sf 8: after step 5 the replicas differ (mid local period), after 6 they were just
    // averaged and the slow step at 8 is still ahead, 11 is in the second slow period, 16 is
    // right after a slow step.
    let case = case("lf2_sf8_alpha0.7_beta0.9");
    for dtype in [DType::F64, DType::F32] {
        let uninterrupted = trace_world(&case, dtype, None, slowmo_of(&case));
        for save_after in [5, 6, 11, 16] {
            let resumed = trace_world(&case, dtype, Some(save_after), slowmo_of(&case));
            assert_eq!(
                resumed, uninterrupted,
                "{dtype:?}, saved after {save_after}"
            );
        }
        if dtype == DType::F64 {
            assert_case(&case, &uninterrupted, 1e-12);
        }
    }
}

#[test]
fn the_state_names_both_frequencies_and_refuses_other_ones() {
    let world = solo_group();
    let a = OuterAverager::slowmo(SlowMoConfig::new(2, 8), 1, world.clone()).expect("averager");
    let state = a.state();
    let AveragerConfig::Outer { schedule, .. } = &state.config else {
        panic!("{:?}", state.config);
    };
    assert_eq!(
        **schedule,
        AveragerConfig::SlowMo {
            localsgd_frequency: 2,
            slowmo_frequency: 8,
            warmup_steps: 1,
        }
    );
    let text = state.config.to_string();
    assert!(
        text.contains("slowmo(localsgd_frequency 2, slowmo_frequency 8, warmup_steps 1)"),
        "{text}"
    );
    let json = serde_json::to_string(&state).expect("json");
    assert!(json.contains("\"kind\":\"slowmo\""), "{json}");
    assert_eq!(
        serde_json::from_str::<AveragerState>(&json).expect("decode"),
        state
    );
    assert_eq!(a.slowmo_config(), Some(&SlowMoConfig::new(2, 8)));
    // Another slow frequency, or today's single-frequency SlowMo, refuses this state.
    let mut other = OuterAverager::slowmo(SlowMoConfig::new(2, 4), 1, world.clone()).expect("b");
    let err = other.load_state(&state).unwrap_err();
    assert!(
        matches!(err, AveragerError::StateMismatch { .. })
            && err.to_string().contains("slowmo_frequency 8"),
        "{err}"
    );
    let mut periodic = OuterAverager::periodic(2, 1, SlowMoConfig::new(2, 8).optimizer(), world)
        .expect("periodic");
    assert!(matches!(
        periodic.load_state(&state),
        Err(AveragerError::StateMismatch { .. })
    ));
    assert_eq!(periodic.slowmo_config(), None);
}

#[test]
fn frequency_zero_and_bad_slow_settings_are_refused_naming_the_value() {
    let world = solo_group();
    let refuse = |config: SlowMoConfig| {
        let err = OuterAverager::slowmo(config, 0, world.clone())
            .map(|_| ())
            .expect_err("refused");
        assert_eq!(Err(err.clone()), config.validate().map(|_| ()));
        assert!(matches!(err, AveragerError::Outer(_)), "{err:?}");
        err.to_string()
    };
    let e = refuse(SlowMoConfig::new(0, 48));
    assert!(
        e.contains("localsgd_frequency") && e.contains("got 0") && e.contains(">= 1"),
        "{e}"
    );
    let e = refuse(SlowMoConfig::new(3, 0));
    assert!(
        e.contains("slowmo_frequency") && e.contains("got 0") && e.contains(">= 1"),
        "{e}"
    );
    let e = refuse(SlowMoConfig::new(3, 48).with_lr(0.0));
    assert!(
        e.contains("slow learning rate") && e.contains("got 0"),
        "{e}"
    );
    let e = refuse(SlowMoConfig::new(3, 48).with_momentum(-0.5));
    assert!(e.contains("slow momentum") && e.contains("-0.5"), "{e}");
    // Any positive pair is fine, multiple or not.
    for (lf, sf) in [(1, 1), (3, 4), (4, 3), (3, 48), (5, 7)] {
        assert!(OuterAverager::slowmo(SlowMoConfig::new(lf, sf), 0, world.clone()).is_ok());
    }
    // SlowMo averages the parameters: the other reduction and compression are refused.
    let a = OuterAverager::slowmo(SlowMoConfig::default(), 0, world.clone()).expect("a");
    assert_eq!(a.reduce(), PseudoGradient::DeltaOfMean);
    let e = a.with_reduce(PseudoGradient::MeanOfDeltas).unwrap_err();
    assert!(e.to_string().contains("delta-of-mean"), "{e}");
    let a = OuterAverager::slowmo(SlowMoConfig::default(), 0, world).expect("a");
    assert!(
        a.with_compression(Some(localsgd_averagers::comm::Precision::Fp16.into()))
            .is_err()
    );
}

#[test]
fn no_theta_fails_at_the_first_average_not_the_first_slow_step() {
    let out = ThreadWorld::new(2)
        .expect("world")
        .run(|world| {
            let mut a = OuterAverager::slowmo(SlowMoConfig::new(2, 8), 0, world).expect("averager");
            let mut model: Scalar = scalar(1.0, DType::F64);
            model = a
                .average_parameters(model, &ParamSelection::All)
                .expect("step 1 does not average");
            let err = a
                .average_parameters(model, &ParamSelection::All)
                .map(|_| ())
                .unwrap_err();
            (err.to_string(), a.step())
        })
        .expect("run");
    for (err, step) in out {
        assert!(err.contains("reset_global"), "{err}");
        // The failed step is not counted.
        assert_eq!(step, 1);
    }
}
