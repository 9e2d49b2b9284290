//! Section 3: the hierarchical averager's schedule (V9, V10, V12), its subgroups, validation
//! (including deliberate differences 1 and 2) and warning.

use crate::common;

use burn::prelude::*;
use common::*;
use localsgd_averagers::comm::ThreadWorld;
use localsgd_averagers::{
    AverageParameters, AveragerError, HierarchicalModelAverager, ModelAverager, ParamSelection,
};
use std::sync::Arc;

/// Run `steps` calls on 4 ranks with values = rank before each call; per rank, the value after
/// each call.
fn run_schedule(levels: &[(u64, usize)], warmup: i64, steps: u64) -> Vec<Vec<f64>> {
    ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let rank = world.rank() as f64;
            let mut avg = HierarchicalModelAverager::new(levels, warmup, world.clone()).unwrap();
            let mut m = Three::new(&device);
            let mut seen = Vec::new();
            for _ in 0..steps {
                m = fill(m, rank);
                m = avg.average_parameters(m, &ParamSelection::All).unwrap();
                let vals = param_values(&m);
                let first = vals[0][0];
                assert!(vals.iter().flatten().all(|&x| x == first), "{vals:?}");
                seen.push(first);
            }
            assert_eq!(avg.step(), steps);
            seen
        })
        .unwrap()
}

const WORLD_MEAN: [f64; 4] = [1.5; 4];
const PAIR_MEANS: [f64; 4] = [0.5, 0.5, 2.5, 2.5];
const LOCAL: [f64; 4] = [0.0, 1.0, 2.0, 3.0];

fn check(seen: &[Vec<f64>], expected_at: impl Fn(u64) -> [f64; 4]) {
    for (rank, values) in seen.iter().enumerate() {
        for (step, &v) in values.iter().enumerate() {
            assert_eq!(
                v,
                expected_at(step as u64)[rank],
                "rank {rank}, step {step}"
            );
        }
    }
}

#[test]
fn v9_three_levels_with_warmup() {
    let seen = run_schedule(&[(2, 2), (4, 4), (8, 4)], 10, 25);
    check(&seen, |step| match step {
        10 | 14 | 18 | 22 => PAIR_MEANS,
        12 | 16 | 20 | 24 => WORLD_MEAN,
        _ => LOCAL,
    });
}

#[test]
fn v9_only_the_pair_subgroups_are_created() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let before = world.traffic();
            let avg = HierarchicalModelAverager::new(&[(2, 2), (4, 4), (8, 4)], 10, world.clone())
                .unwrap();
            let splits = (world.traffic() - before).collectives;
            let groups = avg.level_groups();
            (
                avg.subgroup_sizes_created(),
                splits,
                groups[0].world_ranks().to_vec(),
                Arc::ptr_eq(&groups[1], &world) && Arc::ptr_eq(&groups[2], &world),
            )
        })
        .unwrap();
    for (rank, (sizes, splits, pair, reuses_world)) in out.into_iter().enumerate() {
        assert_eq!(sizes, vec![2]);
        assert_eq!(
            splits, 1,
            "one collective split for the one subgroup family"
        );
        assert_eq!(pair, if rank < 2 { vec![0, 1] } else { vec![2, 3] });
        assert!(reuses_world, "levels of size 4 use the world group itself");
    }
}

#[test]
fn levels_sharing_a_size_share_one_subgroup_family() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let avg = HierarchicalModelAverager::new(&[(2, 2), (4, 2), (8, 4)], 0, world.clone())
                .unwrap();
            let groups = avg.level_groups();
            (
                avg.subgroup_sizes_created(),
                Arc::ptr_eq(&groups[0], &groups[1]),
            )
        })
        .unwrap();
    assert!(
        out.iter()
            .all(|(sizes, shared)| sizes == &vec![2] && *shared)
    );
}

#[test]
fn v10_two_levels_with_warmup() {
    let seen = run_schedule(&[(2, 2), (4, 4)], 4, 12);
    check(&seen, |step| match step {
        4 | 8 => WORLD_MEAN,
        6 | 10 => PAIR_MEANS,
        _ => LOCAL,
    });
}

#[test]
fn v12_absolute_schedule_averages_only_at_step_16() {
    let seen = run_schedule(&[(4, 4)], 13, 20);
    check(&seen, |step| if step == 16 { WORLD_MEAN } else { LOCAL });
}

fn new_err(levels: &[(u64, usize)], warmup: i64) -> AveragerError {
    HierarchicalModelAverager::new(levels, warmup, lone_handle(4)).unwrap_err()
}

#[test]
fn empty_levels_are_an_error() {
    let err = new_err(&[], 0);
    assert_eq!(err, AveragerError::EmptyLevels);
    assert!(
        err.to_string().contains("levels must not be empty"),
        "{err}"
    );
}

#[test]
fn a_later_period_of_zero_is_an_error() {
    let err = new_err(&[(2, 2), (0, 4)], 0);
    assert_eq!(
        err,
        AveragerError::NonPositiveLevelPeriod {
            index: 1,
            period: 0,
            size: 4
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("period must be positive"), "{msg}");
    assert!(msg.contains("level 1 is (period 0, group size 4)"), "{msg}");
}

#[test]
fn a_shadowed_level_is_an_error() {
    // PyTorch silently never uses the size-2 level here.
    let err = new_err(&[(4, 2), (2, 4)], 0);
    assert!(
        matches!(err, AveragerError::ShadowedLevel { index: 1, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("strictly increasing periods"), "{msg}");
    assert!(msg.contains("level 1 (period 2, group size 4)"), "{msg}");
    assert!(msg.contains("level 0 (period 4, group size 2)"), "{msg}");
    // Equal periods shadow too.
    let err = new_err(&[(2, 2), (2, 4)], 0);
    assert!(matches!(err, AveragerError::ShadowedLevel { .. }), "{err}");
}

#[test]
fn last_level_must_cover_the_whole_group() {
    let err = new_err(&[(2, 1), (4, 2)], 0);
    let msg = err.to_string();
    assert!(
        msg.contains("the last level must average over the whole group of 4 ranks"),
        "{msg}"
    );
    assert!(msg.contains("(period 4, group size 2)"), "{msg}");
}

#[test]
fn invalid_group_sizes_are_errors() {
    for (size, needle) in [
        (0, "must be positive"),
        (8, "must not exceed the group size"),
        (3, "must be divisible"),
    ] {
        let err = new_err(&[(2, size), (4, 4)], 0);
        assert!(
            matches!(err, AveragerError::InvalidLevelGroupSize { index: 0, size: s, .. } if s == size),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(needle), "{msg}");
        assert!(msg.contains(&format!("group size {size}")), "{msg}");
    }
}

#[test]
fn negative_warmup_is_an_error() {
    let err = new_err(&[(4, 4)], -2);
    assert_eq!(err, AveragerError::NegativeWarmup(-2));
    assert!(
        err.to_string()
            .contains("warmup_steps must be non-negative (got -2)")
    );
}

#[test]
fn last_period_one_warns_through_tracing() {
    let capture = Capture::default();
    capture.during(|| HierarchicalModelAverager::new(&[(1, 1)], 0, solo_group()).unwrap());
    let warnings = capture.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("DDP"), "{warnings:?}");

    let quiet = Capture::default();
    quiet.during(|| HierarchicalModelAverager::new(&[(2, 1)], 0, solo_group()).unwrap());
    assert!(quiet.warnings().is_empty());
}

#[test]
fn a_level_of_one_rank_communicates_nothing() {
    // Levels (2, 1), (4, 4) on 4 ranks: steps 2 and 6 are due at the 1-rank level (each replica
    // "averages" with itself: the identity, no collective), steps 0, 4, 8 at the world level
    // (the 4-word parameter-set check, then the fused all-reduce).
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let rank = world.rank() as f64;
            let mut avg =
                HierarchicalModelAverager::new(&[(2, 1), (4, 4)], 0, world.clone()).unwrap();
            let mut m = Three::new(&device);
            let mut per_step = Vec::new();
            for _ in 0..9 {
                m = fill(m, rank);
                let before = world.traffic();
                m = avg.average_parameters(m, &ParamSelection::All).unwrap();
                let t = world.traffic() - before;
                per_step.push((t.collectives, param_values(&m)[0][0]));
            }
            per_step
        })
        .unwrap();
    for (rank, steps) in out.iter().enumerate() {
        for (step, &(collectives, value)) in steps.iter().enumerate() {
            let (want_collectives, want_value) = match step {
                0 | 4 | 8 => (2, WORLD_MEAN[rank]),
                _ => (0, LOCAL[rank]),
            };
            assert_eq!(collectives, want_collectives, "rank {rank} step {step}");
            assert_eq!(value, want_value, "rank {rank} step {step}");
        }
    }
}
