//! Section 2: the periodic averager's schedule (V7, V8), validation and warning.

use crate::common;

use burn::nn::LinearConfig;
use burn::optim::GradientsParams;
use burn::prelude::*;
use common::*;
use localsgd_averagers::comm::ThreadWorld;
use localsgd_averagers::{
    AverageParameters, AveragerError, ModelAverager, ParamSelection, PeriodicModelAverager,
};

/// V7 table: (warmup, period, averaging steps within 20 calls).
fn v7_table() -> Vec<(i64, u64, Vec<u64>)> {
    vec![
        (0, 1, (0..=19).collect()),
        (0, 2, (0..=18).step_by(2).collect()),
        (0, 4, vec![0, 4, 8, 12, 16]),
        (1, 1, (1..=19).collect()),
        (1, 2, (1..=19).step_by(2).collect()),
        (1, 4, vec![1, 5, 9, 13, 17]),
        (10, 1, (10..=19).collect()),
        (10, 2, (10..=18).step_by(2).collect()),
        (10, 4, vec![10, 14, 18]),
        (12, 1, (12..=19).collect()),
        (12, 2, vec![12, 14, 16, 18]),
        (12, 4, vec![12, 16]),
        (13, 1, (13..=19).collect()),
        (13, 2, vec![13, 15, 17, 19]),
        (13, 4, vec![13, 17]),
        (15, 1, (15..=19).collect()),
        (15, 2, vec![15, 17, 19]),
        (15, 4, vec![15, 19]),
    ]
}

fn v7_for_world(ws: usize, averaged_value: f64) {
    let table = v7_table();
    let out = ThreadWorld::new(ws)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let rank = world.rank() as f64;
            let mut cells = Vec::new();
            for (warmup, period, _) in &table {
                let mut avg = PeriodicModelAverager::new(*period, *warmup, world.clone()).unwrap();
                let mut m = Three::new(&device);
                let mut steps = Vec::new();
                for call in 0..20u64 {
                    m = fill(m, rank);
                    m = avg.average_parameters(m, &ParamSelection::All).unwrap();
                    if all_equal(&m, averaged_value) {
                        steps.push(call);
                    } else {
                        assert!(
                            all_equal(&m, rank),
                            "call {call}: neither averaged nor local"
                        );
                    }
                }
                assert_eq!(avg.step(), 20);
                cells.push(steps);
            }
            cells
        })
        .unwrap();
    for cells in out {
        for ((warmup, period, expected), got) in table.iter().zip(cells) {
            assert_eq!(&got, expected, "ws {ws}, warmup {warmup}, period {period}");
        }
    }
}

#[test]
fn v7_every_cell_world_of_four() {
    v7_for_world(4, 1.5);
}

#[test]
fn v7_every_cell_world_of_two() {
    v7_for_world(2, 0.5);
}

#[test]
fn v8_bias_without_gradient_is_never_averaged() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let rank = world.rank() as f64;
            let mut model = LinearConfig::new(3, 2).init(&device);
            let mut avg = PeriodicModelAverager::new(4, 12, world.clone()).unwrap();
            let mut history = Vec::new();
            for _ in 0..20 {
                model = fill(model, rank);
                // This step's gradients: the weight only.
                let mut grads = GradientsParams::new();
                grads.register::<2>(model.weight.id, Tensor::<2>::ones([3, 2], &device));
                let selection = ParamSelection::with_grads(&model, &grads);
                model = avg.average_parameters(model, &selection).unwrap();
                let bias = model.bias.as_ref().map(|b| values(b.val())).unwrap();
                history.push((values(model.weight.val()), bias));
            }
            history
        })
        .unwrap();
    for (rank, history) in out.into_iter().enumerate() {
        for (step, (weight, bias)) in history.into_iter().enumerate() {
            let expected = if step == 12 || step == 16 {
                1.5
            } else {
                rank as f64
            };
            assert!(
                weight.iter().all(|&w| w == expected),
                "step {step}: {weight:?}"
            );
            assert!(
                bias.iter().all(|&b| b == rank as f64),
                "step {step}: {bias:?}"
            );
        }
    }
}

#[test]
fn validation_messages_and_order() {
    let g = solo_group();
    let err = PeriodicModelAverager::new(4, -1, g.clone()).unwrap_err();
    assert_eq!(err, AveragerError::NegativeWarmup(-1));
    assert!(
        err.to_string()
            .contains("warmup_steps must be non-negative (got -1)"),
        "{err}"
    );
    let err = PeriodicModelAverager::new(0, 0, g.clone()).unwrap_err();
    assert_eq!(err, AveragerError::NonPositivePeriod(0));
    assert!(
        err.to_string().contains("period must be positive (got 0)"),
        "{err}"
    );
    // warmup is checked first.
    let err = PeriodicModelAverager::new(0, -3, g.clone()).unwrap_err();
    assert_eq!(err, AveragerError::NegativeWarmup(-3));
}

#[test]
fn period_one_warns_through_tracing() {
    let g = solo_group();
    let capture = Capture::default();
    capture.during(|| PeriodicModelAverager::new(1, 0, g.clone()).unwrap());
    let warnings = capture.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("period=1"), "{warnings:?}");
    assert!(warnings[0].contains("DDP"), "{warnings:?}");

    let quiet = Capture::default();
    quiet.during(|| PeriodicModelAverager::new(2, 0, g.clone()).unwrap());
    assert!(quiet.warnings().is_empty(), "{:?}", quiet.warnings());
}

#[test]
fn empty_selection_counts_the_step_without_communicating() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let mut avg = PeriodicModelAverager::new(1, 0, world.clone()).unwrap();
            let m = fill(Three::new(&device), world.rank() as f64);
            let before = world.traffic();
            assert!(avg.scheduled_group().is_some());
            let m = avg.average_parameters(m, &ParamSelection::ids([])).unwrap();
            (
                avg.step(),
                (world.traffic() - before).collectives,
                all_equal(&m, world.rank() as f64),
            )
        })
        .unwrap();
    assert_eq!(out, vec![(1, 0, true), (1, 0, true)]);
}

#[test]
fn boxed_dyn_averager_averages_and_scheduled_group_is_pure() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let mut avg: Box<dyn ModelAverager> =
                Box::new(PeriodicModelAverager::new(2, 1, world.clone()).unwrap());
            assert!(avg.scheduled_group().is_none());
            assert!(avg.scheduled_group().is_none());
            assert_eq!(avg.step(), 0);
            let mut averaged = Vec::new();
            let mut m = Three::new(&device);
            for _ in 0..4 {
                m = fill(m, world.rank() as f64);
                let scheduled = avg.scheduled_group().map(|g| g.size());
                m = avg.average_parameters(m, &ParamSelection::All).unwrap();
                averaged.push((scheduled, all_equal(&m, 0.5)));
            }
            (avg.step(), averaged)
        })
        .unwrap();
    for (step, averaged) in out {
        assert_eq!(step, 4);
        assert_eq!(
            averaged,
            vec![
                (None, false),
                (Some(2), true),
                (None, false),
                (Some(2), true)
            ]
        );
    }
}
