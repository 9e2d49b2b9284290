//! `measure_step`, the bare loop of `localsgd bench-step`: a restart trains from the start
//! again, the gap is spun off the clock, and with peers every rank reports each step's slowest
//! rank.

use burn::module::{Module, Param};
use burn::optim::SgdConfig;
use burn::tensor::{Device, Tensor, TensorData};
use localsgd_comm::ThreadWorld;
use localsgd_planner::measure::{StepError, StepSettings, StepTiming, measure_step};
use std::convert::Infallible;
use std::time::{Duration, Instant};

/// `x w`, trained towards 0.
#[derive(Module, Debug)]
struct Line {
    w: Param<Tensor<2>>,
}

fn device() -> Device {
    Device::flex().autodiff()
}

fn line() -> Line {
    let w = Tensor::from_data(TensorData::new(vec![0.5f32, -0.25], [2, 1]), &device());
    Line {
        w: Param::from_tensor(w),
    }
}

fn loss(m: &Line, x: &Tensor<2>) -> Tensor<1> {
    let y = x.clone().matmul(m.w.val());
    (y.clone() * y).mean()
}

/// The batch of a run's step `step`: different for every step.
fn batch(step: usize) -> Result<Tensor<2>, Infallible> {
    let v = 1.0 + step as f32 / 4.0;
    Ok(Tensor::from_data(
        TensorData::new(vec![v, 1.0, 1.0, -v], [2, 2]),
        &device(),
    ))
}

fn run(iters: usize, warmup: usize, restart_every: usize, gap: Duration) -> StepTiming {
    let settings = StepSettings::new(iters, warmup, restart_every, gap).unwrap();
    measure_step(
        line(),
        || SgdConfig::new().init(),
        0.1,
        loss,
        batch,
        &settings,
        None,
    )
    .unwrap()
}

#[test]
fn a_restart_trains_from_the_start_again() {
    let first = run(1, 0, 0, Duration::ZERO).last_loss;
    // Iterations 0..8 with a restart every 7: iteration 7 is a run's step 0 again.
    let restarted = run(6, 2, 7, Duration::ZERO).last_loss;
    let trained = run(6, 2, 0, Duration::ZERO).last_loss;
    assert!(first.is_finite() && first > 0.0, "{first}");
    assert_eq!(restarted, first);
    assert_ne!(trained, first);
}

#[test]
fn the_gap_is_spun_before_each_step_off_the_clock() {
    let started = Instant::now();
    let t = run(3, 1, 0, Duration::from_millis(20));
    assert!(started.elapsed() >= Duration::from_millis(80));
    assert!(t.mean_ms < 20.0 && t.median_ms < 20.0, "{t:?}");
    assert!(t.cycle_mean_ms >= t.mean_ms, "{t:?}");
    assert_eq!(t.ranks, 1);
    assert!(t.copy_ms > 0.0, "{t:?}");
}

#[test]
fn with_peers_every_rank_reports_the_slowest_step() {
    let settings = StepSettings::new(4, 1, 0, Duration::ZERO).unwrap();
    let results = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            // Rank 1's batches take 10 ms to build, off the clock: the steps stay fast, and
            // the cycle (step and all-reduce on this rank's clock) of rank 0 includes the wait.
            let slow = g.rank() == 1;
            let slow_batch = |step| {
                if slow {
                    std::thread::sleep(Duration::from_millis(10));
                }
                batch(step)
            };
            let t = measure_step(
                line(),
                || SgdConfig::new().init(),
                0.1,
                loss,
                slow_batch,
                &settings,
                Some(&g),
            )
            .unwrap();
            (g.rank(), t)
        })
        .unwrap();
    let (t0, t1) = (results[0].1, results[1].1);
    assert_eq!((t0.ranks, t1.ranks), (2, 2));
    // Every step's time is the maximum over the ranks: the same list on both.
    assert_eq!(t0.median_ms, t1.median_ms);
    assert_eq!(t0.mean_ms, t1.mean_ms);
    assert!(t0.cycle_mean_ms > 5.0, "{t0:?}");
    assert_eq!(t0.last_loss, t1.last_loss);
}

#[test]
fn a_batch_that_fails_ends_the_measurement_with_its_error() {
    #[derive(Debug, thiserror::Error)]
    #[error("no batch for step {0}")]
    struct NoBatch(usize);
    let settings = StepSettings::new(4, 0, 0, Duration::ZERO).unwrap();
    let err = measure_step(
        line(),
        || SgdConfig::new().init(),
        0.1,
        loss,
        |step| {
            if step < 2 {
                Ok(batch(step).unwrap())
            } else {
                Err(NoBatch(step))
            }
        },
        &settings,
        None,
    )
    .unwrap_err();
    assert!(matches!(err, StepError::Batch(NoBatch(2))), "{err:?}");
    assert_eq!(err.to_string(), "no batch for step 2");
}
