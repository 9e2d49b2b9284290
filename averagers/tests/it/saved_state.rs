//! V17 and deliberate difference 5: the step counter is saved, serialized and restored exactly;
//! a state from a different configuration is refused.

use crate::common;

use burn::prelude::*;
use common::*;
use localsgd_averagers::comm::ThreadWorld;
use localsgd_averagers::{
    AverageParameters, AveragerConfig, AveragerError, AveragerState, HierarchicalModelAverager,
    Level, ModelAverager, ParamSelection, PeriodicModelAverager,
};

#[test]
fn v17_state_after_20_steps_carries_step_20_and_restores_it() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let mut avg = PeriodicModelAverager::new(4, 3, world.clone()).unwrap();
            let mut m = Three::new(&device);
            for _ in 0..20 {
                m = avg.average_parameters(m, &ParamSelection::All).unwrap();
            }
            let json = serde_json::to_string(&avg.state()).unwrap();
            let restored_state: AveragerState = serde_json::from_str(&json).unwrap();
            let mut fresh = PeriodicModelAverager::new(4, 3, world.clone()).unwrap();
            fresh.load_state(&restored_state).unwrap();
            (avg.state(), json, fresh.step())
        })
        .unwrap();
    for (state, json, restored) in out {
        assert_eq!(state.step, 20);
        assert_eq!(
            state.config,
            AveragerConfig::Periodic {
                period: 4,
                warmup_steps: 3,
                overlap: 0,
            }
        );
        assert!(json.contains("\"step\":20"), "{json}");
        assert!(json.contains("\"kind\":\"periodic\""), "{json}");
        assert_eq!(restored, 20);
    }
}

/// Steps at which `avg` averages from its current step up to `to` (advancing it there).
fn schedule(avg: &mut dyn ModelAverager, to: u64) -> Vec<u64> {
    let mut steps = Vec::new();
    while avg.step() < to {
        if avg.scheduled_group().is_some() {
            steps.push(avg.step());
        }
        avg.advance();
    }
    steps
}

#[test]
fn restored_schedules_continue_exactly() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let levels = [(2, 2), (4, 4), (8, 4)];
            let mut straight = HierarchicalModelAverager::new(&levels, 10, world.clone()).unwrap();
            let mut first = HierarchicalModelAverager::new(&levels, 10, world.clone()).unwrap();
            let all = schedule(&mut straight, 40);
            let mut resumed = schedule(&mut first, 13);
            let saved = serde_json::to_string(&first.state()).unwrap();
            let mut second = HierarchicalModelAverager::new(&levels, 10, world.clone()).unwrap();
            second
                .load_state(&serde_json::from_str(&saved).unwrap())
                .unwrap();
            resumed.extend(schedule(&mut second, 40));
            (all, resumed, second.state())
        })
        .unwrap();
    for (all, resumed, state) in out {
        assert_eq!(resumed, all);
        assert_eq!(
            resumed[..2],
            [10, 12],
            "warmup is not repeated after resume"
        );
        assert_eq!(state.step, 40);
        assert_eq!(
            state.config,
            AveragerConfig::Hierarchical {
                levels: vec![
                    Level {
                        period: 2,
                        group_size: 2
                    },
                    Level {
                        period: 4,
                        group_size: 4
                    },
                    Level {
                        period: 8,
                        group_size: 4
                    },
                ],
                warmup_steps: 10
            }
        );
    }
}

#[test]
fn loading_a_state_of_another_configuration_fails_naming_both() {
    let g = solo_group();
    let saved = PeriodicModelAverager::new(4, 0, g.clone()).unwrap().state();
    let mut other = PeriodicModelAverager::new(2, 0, g.clone()).unwrap();
    other.advance();
    let err = other
        .load_state(&AveragerState {
            step: 20,
            ..saved.clone()
        })
        .unwrap_err();
    assert!(matches!(err, AveragerError::StateMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("periodic(period 4, warmup_steps 0)"), "{msg}");
    assert!(msg.contains("periodic(period 2, warmup_steps 0)"), "{msg}");
    assert_eq!(other.step(), 1, "a failed load changes nothing");

    let mut warm = PeriodicModelAverager::new(4, 5, g.clone()).unwrap();
    assert!(warm.load_state(&saved).is_err(), "warmup differs");

    let mut hier = HierarchicalModelAverager::new(&[(4, 1)], 0, g.clone()).unwrap();
    let msg = hier.load_state(&saved).unwrap_err().to_string();
    assert!(msg.contains("periodic(period 4"), "{msg}");
    assert!(
        msg.contains("hierarchical(levels (period, group size) [(4, 1)]"),
        "{msg}"
    );
    let mut other_levels = HierarchicalModelAverager::new(&[(2, 1), (4, 1)], 0, g).unwrap();
    assert!(other_levels.load_state(&hier.state()).is_err());
}

/// A hierarchical state saved on 4 ranks loads on the 3 survivors of a rank failure: the last
/// level is the whole group whatever its size. Lower levels, periods and warmup must match.
#[test]
fn hierarchical_state_loads_on_another_world_size_but_not_another_schedule() {
    let saved = AveragerState {
        step: 9,
        config: AveragerConfig::Hierarchical {
            levels: vec![Level::from((2, 1)), Level::from((4, 4))],
            warmup_steps: 2,
        },
    };
    let out = ThreadWorld::new(3)
        .unwrap()
        .run(|world| {
            let load = |levels: &[(u64, usize)], warmup| {
                let levels: Vec<Level> = levels.iter().copied().map(Level::from).collect();
                let mut avg = HierarchicalModelAverager::new(&levels, warmup, world.clone())?;
                avg.load_state(&saved).map(|()| avg.step())
            };
            (
                load(&[(2, 1), (4, 3)], 2),
                load(&[(2, 3), (4, 3)], 2).is_err(),
                load(&[(2, 1), (5, 3)], 2).is_err(),
                load(&[(2, 1), (4, 3)], 3).is_err(),
            )
        })
        .unwrap();
    for (same, lower, period, warmup) in out {
        assert_eq!(same.unwrap(), 9);
        assert!(lower && period && warmup);
    }
}
