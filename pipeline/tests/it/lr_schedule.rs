//! The learning-rate schedules against the examples of PyTorch's documentation
//! (`torch.optim.lr_scheduler`), step by step.

use burn::optim::lr_scheduler::LrScheduler;
use localsgd_pipeline::lr_schedule::LrSchedule;

fn close(a: f64, b: f64) {
    assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
}

/// StepLR docs: lr = 0.05 if epoch < 30, 0.005 if 30 <= epoch < 60, 0.0005 if 60 <= epoch < 90.
#[test]
fn step_lr_follows_pytorchs_example() {
    let s = LrSchedule::Step {
        base: 0.05,
        step_size: 30,
        gamma: 0.1,
    };
    for (k, want) in [
        (0, 0.05),
        (29, 0.05),
        (30, 0.005),
        (59, 0.005),
        (60, 0.0005),
        (89, 0.0005),
    ] {
        close(s.lr(k), want);
    }
}

/// LinearLR docs (start_factor 0.5, total_iters 4, lr 0.05): 0.025, 0.03125, 0.0375, 0.04375,
/// then 0.05.
#[test]
fn linear_warmup_follows_pytorchs_example() {
    let s = LrSchedule::LinearWarmup {
        base: 0.05,
        start_factor: 0.5,
        steps: 4,
    };
    let got: Vec<f64> = (0..7).map(|k| s.lr(k)).collect();
    for (g, w) in got
        .iter()
        .zip([0.025, 0.03125, 0.0375, 0.04375, 0.05, 0.05, 0.05])
    {
        close(*g, w);
    }
}

/// CosineAnnealingLR: the base at step 0, the midpoint at T_max / 2, eta_min at T_max.
#[test]
fn cosine_goes_from_base_to_min_over_t_max() {
    let s = LrSchedule::Cosine {
        base: 0.1,
        t_max: 10,
        min: 0.01,
    };
    close(s.lr(0), 0.1);
    close(s.lr(5), 0.055);
    close(s.lr(10), 0.01);
}

/// As burn's `LrScheduler`: the n-th `step()` is step n - 1's rate, and a record restores the
/// position.
#[test]
fn the_scheduler_steps_through_the_schedule_and_resumes_from_its_record() {
    let s = LrSchedule::Step {
        base: 1.0,
        step_size: 2,
        gamma: 0.5,
    };
    let mut a = s.clone().scheduler();
    let first: Vec<f64> = (0..3).map(|_| a.step()).collect();
    assert_eq!(first, vec![1.0, 1.0, 0.5]);
    let mut b = s.scheduler();
    b.load_record(a.to_record());
    assert_eq!(b.step(), 0.5);
    assert_eq!(b.step(), 0.25);
}
