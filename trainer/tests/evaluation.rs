//! `run::evaluate`: the test loss is the mean cross-entropy that burn's `CrossEntropyLoss`
//! (PyTorch's default reduction) gives on the whole test set, and the accuracy counts argmax
//! hits, for a trained MLP on the digits data.

use burn::nn::loss::CrossEntropyLoss;
use burn::tensor::{Device, Int, Tensor, TensorData};
use localsgd_trainer::model::MlpConfig;
use localsgd_trainer::run::evaluate;

#[test]
fn the_test_loss_is_burns_cross_entropy_over_the_whole_test_set() {
    let data = localsgd_trainer::data::digits::load().unwrap();
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
