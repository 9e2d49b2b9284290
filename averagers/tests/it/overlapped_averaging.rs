//! Overlapped periodic averaging against vectors computed by hand on a scalar problem.
//!
//! Every rank r holds one scalar x (x0 = 8) and takes the local step x <- x - 0.5 (x - c_r)
//! (gradient descent on 0.5 (x - c_r)^2 with learning rate 0.5), then calls the averager. All
//! numbers are dyadic, so every value below is exact in f32 and the expected numbers are the
//! arithmetic written in the comments.

use burn::module::Param;
use burn::prelude::*;
use localsgd_averagers::comm::ThreadWorld;
use localsgd_averagers::{
    AverageParameters, AveragerError, ModelAverager, ParamSelection, PeriodicModelAverager,
};

#[derive(Module, Debug)]
struct Scalar {
    x: Param<Tensor<1>>,
}

fn scalar(v: f32, device: &Device) -> Scalar {
    Scalar {
        x: Param::from_tensor(Tensor::from_floats([v], device)),
    }
}

fn value(m: &Scalar) -> f32 {
    m.x.val().into_data().try_into_vec::<f32>().unwrap()[0]
}

/// Run `iters` iterations on `ranks` ranks with targets `targets`; returns every rank's x after
/// each iteration's averaging call, then after `complete_pending`.
fn run(
    ranks: usize,
    targets: &'static [f32],
    period: u64,
    warmup: i64,
    delay: u64,
    iters: usize,
) -> Vec<(Vec<f32>, f32)> {
    ThreadWorld::new(ranks)
        .unwrap()
        .run(move |g| {
            let device = Device::flex();
            let c = targets[g.rank()];
            let mut m = scalar(8.0, &device);
            let mut avg = PeriodicModelAverager::new(period, warmup, g)
                .unwrap()
                .with_overlap(delay)
                .unwrap();
            let mut trace = Vec::new();
            for _ in 0..iters {
                let x = value(&m);
                m = scalar(x - 0.5 * (x - c), &device);
                m = avg.average_parameters(m, &ParamSelection::All).unwrap();
                trace.push(value(&m));
            }
            let m = avg.complete_pending(m).unwrap();
            (trace, value(&m))
        })
        .unwrap()
}

#[test]
fn two_ranks_delay_one() {
    // c = [0, 4], period 2, warmup 0, delay 1.
    // i0: local 8 -> 4 | 6; step 0 starts a = (4 + 6) / 2 = 5, s = 4 | 6.
    // i1: local 4 -> 2 | 6 -> 5; step 1 applies 5 + (2 - 4) = 3 | 5 + (5 - 6) = 4.
    // i2: local 3 -> 1.5 | 4 -> 4; step 2 starts a = (1.5 + 4) / 2 = 2.75.
    // i3: local 1.5 -> 0.75 | 4; applies 2.75 + (0.75 - 1.5) = 2 | 2.75 + 0 = 2.75.
    // i4: local 2 -> 1 | 2.75 -> 3.375; starts a = (1 + 3.375) / 2 = 2.1875.
    // i5: local 1 -> 0.5 | 3.375 -> 3.6875; applies 2.1875 - 0.5 = 1.6875 | 2.1875 + 0.3125 = 2.5.
    let out = run(2, &[0.0, 4.0], 2, 0, 1, 6);
    assert_eq!(out[0].0, vec![4.0, 3.0, 1.5, 2.0, 1.0, 1.6875]);
    assert_eq!(out[1].0, vec![6.0, 4.0, 4.0, 2.75, 3.375, 2.5]);
    // Nothing pending at the end: complete_pending changes nothing.
    assert_eq!((out[0].1, out[1].1), (1.6875, 2.5));
}

#[test]
fn four_ranks_delay_equal_to_the_period() {
    // c = [0, 4, 8, 12], period 2, warmup 0, delay 2: each average is applied at the next
    // averaging step, just before that step starts the next one.
    // i0: 8 -> 4, 6, 8, 10; step 0 starts a = 1 + 1.5 + 2 + 2.5 = 7.
    // i1: -> 2, 5, 8, 11 (nothing due).
    // i2: -> 1, 4.5, 8, 11.5; applies 7 + (x - s): 4, 5.5, 7, 8.5; starts
    //     a = (4 + 5.5 + 7 + 8.5) / 4 = 6.25.
    // i3: -> 2, 4.75, 7.5, 10.25.
    // i4: -> 1, 4.375, 7.75, 11.125; applies 6.25 + (x - s): 3.25, 5.125, 7, 8.875; starts
    //     a = (3.25 + 5.125 + 7 + 8.875) / 4 = 6.0625.
    // End: complete_pending applies 6.0625 + (x - s) = 6.0625 on every rank.
    let out = run(4, &[0.0, 4.0, 8.0, 12.0], 2, 0, 2, 5);
    let expected = [
        [4.0, 2.0, 4.0, 2.0, 3.25],
        [6.0, 5.0, 5.5, 4.75, 5.125],
        [8.0, 8.0, 7.0, 7.5, 7.0],
        [10.0, 11.0, 8.5, 10.25, 8.875],
    ];
    for (r, (trace, last)) in out.iter().enumerate() {
        assert_eq!(trace, &expected[r].to_vec(), "rank {r}");
        assert_eq!(*last, 6.0625, "rank {r}");
    }
}

#[test]
fn warmup_shifts_the_schedule_as_for_blocking_averaging() {
    // c = [0, 4], period 4, warmup 1, delay 1: averages start at steps 1 and 5.
    // i0: 8 -> 4 | 6 (no averaging before the warmup).
    // i1: -> 2 | 5; step 1 starts a = 3.5.
    // i2: -> 1 | 4.5; applies 3.5 + (1 - 2) = 2.5 | 3.5 + (4.5 - 5) = 3.
    let out = run(2, &[0.0, 4.0], 4, 1, 1, 3);
    assert_eq!(out[0].0, vec![4.0, 2.0, 2.5]);
    assert_eq!(out[1].0, vec![6.0, 5.0, 3.0]);
}

#[test]
fn a_delay_longer_than_the_period_is_refused_naming_both() {
    let out = ThreadWorld::new(1)
        .unwrap()
        .run(|g| {
            PeriodicModelAverager::new(4, 0, g)
                .unwrap()
                .with_overlap(5)
                .map(|_| ())
        })
        .unwrap();
    match &out[0] {
        Err(AveragerError::Overlap(m)) => {
            assert!(m.contains("delay 5") && m.contains("period 4"), "{m}");
        }
        other => panic!("expected an overlap error, got {other:?}"),
    }
}

#[test]
fn a_pending_average_past_its_completion_step_is_an_error() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let device = Device::flex();
            let mut avg = PeriodicModelAverager::new(4, 0, g)
                .unwrap()
                .with_overlap(2)
                .unwrap();
            let m = avg
                .average_parameters(scalar(1.0, &device), &ParamSelection::All)
                .unwrap();
            // Move the counter past the completion step (2) under the pending average.
            let mut state = avg.state();
            state.step = 3;
            avg.load_state(&state).unwrap();
            avg.average_parameters(m, &ParamSelection::All).map(|_| ())
        })
        .unwrap();
    for r in out {
        match r {
            Err(AveragerError::Overlap(m)) => {
                assert!(m.contains("due at step 2") && m.contains("step 3"), "{m}")
            }
            other => panic!("expected an overlap error, got {other:?}"),
        }
    }
}

#[test]
fn a_settled_average_restored_elsewhere_applies_as_the_original_would() {
    // Two ranks, delay 1: complete the average started at step 0 (as a checkpoint does), move it
    // into a fresh averager at step 1, apply: the same numbers as two_ranks_delay_one.
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let device = Device::flex();
            let c = [0.0f32, 4.0][g.rank()];
            let mut a = PeriodicModelAverager::new(2, 0, g.clone())
                .unwrap()
                .with_overlap(1)
                .unwrap();
            let m = scalar(8.0 - 0.5 * (8.0 - c), &device);
            let m = a.average_parameters(m, &ParamSelection::All).unwrap();
            let saved = a.overlap_mut().unwrap().wait_pending().unwrap().unwrap();
            let state = a.state();
            let mut b = PeriodicModelAverager::new(2, 0, g)
                .unwrap()
                .with_overlap(1)
                .unwrap();
            b.load_state(&state).unwrap();
            b.overlap_mut().unwrap().restore(saved).unwrap();
            let x = value(&m);
            let m = b
                .average_parameters(scalar(x - 0.5 * (x - c), &device), &ParamSelection::All)
                .unwrap();
            drop(a);
            value(&m)
        })
        .unwrap();
    assert_eq!(out, vec![3.0, 4.0]);
}
