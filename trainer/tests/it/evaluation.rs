//! `run::evaluate`: the test loss is the mean cross-entropy that burn's `CrossEntropyLoss`
//! (PyTorch's default reduction) gives on the whole test set, and the accuracy counts argmax
//! hits, for a trained MLP on the digits data. Every rank's per-iteration losses are recorded
//! and average to the all-reduced world mean.

use burn::nn::loss::CrossEntropyLoss;
use burn::tensor::{Device, Int, Tensor, TensorData};
use localsgd_models::mlp::MlpConfig;
use localsgd_trainer::run::evaluate;

#[test]
fn the_test_loss_is_burns_cross_entropy_over_the_whole_test_set() {
    let data = localsgd_models::data::digits::load().unwrap();
    let test = &data.test;
    let device = Device::flex();
    let model = MlpConfig {
        input: test.dim(),
        hidden: vec![32],
        classes: test.num_classes(),
    }
    .init(3, &device)
    .unwrap();
    let e = evaluate(&model, test, &device).unwrap();

    let all: Vec<usize> = (0..test.len()).collect();
    let (x, _) = test.batch_tensors(&all, &device).unwrap();
    let labels: Vec<i64> = test.labels().iter().map(|&l| i64::from(l)).collect();
    let y = Tensor::<1, Int>::from_data(TensorData::new(labels.clone(), [labels.len()]), &device);
    let logits = model.forward(x);
    let expected: f32 = CrossEntropyLoss::new(None, &device)
        .forward(logits.clone(), y)
        .into_scalar();
    assert!(
        (e.loss - f64::from(expected)).abs() <= 1e-5 * f64::from(expected),
        "evaluate {} vs burn {expected}",
        e.loss
    );
    let predicted: Vec<i64> = logits.argmax(1).into_data().iter::<i64>().collect();
    let hits = predicted
        .iter()
        .zip(&labels)
        .filter(|(p, l)| p == l)
        .count();
    assert_eq!(e.accuracy, hits as f64 / labels.len() as f64);
}

/// Every rank writes its own metrics file, and rank 0's world-mean loss (`global_loss`, an
/// all-reduced mean of the ranks' losses) is the mean of the four files' `loss` at every
/// iteration where it is logged, warmup (DDP) and local phase alike.
#[test]
fn every_rank_writes_its_losses_and_they_average_to_the_world_mean() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    crate::cli::ok(&crate::cli::localsgd(&[
        "train",
        "--workers",
        "4",
        "--warmup",
        "10",
        "--period",
        "4",
        "--steps",
        "40",
        "--log-every",
        "3",
        "--checkpoint-every",
        "7",
        "--progress",
        "false",
        "--run-dir",
        run.to_str().unwrap(),
    ]));
    let column = |file: &str, name: &str| crate::cli::csv_column(&run.join(file), name);
    let files = [
        "metrics.csv",
        "metrics-rank1.csv",
        "metrics-rank2.csv",
        "metrics-rank3.csv",
    ];
    for f in files {
        let iterations = column(f, "iteration");
        let expected: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        assert_eq!(iterations, expected, "{f}");
    }
    let losses: Vec<Vec<f32>> = files
        .iter()
        .map(|f| {
            column(f, "loss")
                .iter()
                .map(|v| v.parse().unwrap())
                .collect()
        })
        .collect();
    let global = column("metrics.csv", "global_loss");
    let mut checked = 0;
    for (i, g) in global.iter().enumerate() {
        if g.is_empty() {
            continue;
        }
        let g: f64 = g.parse().unwrap();
        let mean = losses.iter().map(|l| f64::from(l[i])).sum::<f64>() / 4.0;
        assert!(
            (g - mean).abs() <= 1e-12 * g.abs(),
            "iteration {i}: global_loss {g}, mean of the ranks' losses {mean}"
        );
        checked += 1;
    }
    assert_eq!(checked, 13, "iterations 2, 5, ..., 38 log the world mean");
    // After local steps the ranks' losses are their own, not copies of rank 0's.
    assert!(losses[1] != losses[0] && losses[2] != losses[3]);
}
