//! `ConsoleRenderer`: driven through burn-train's renderer traits, its progress and summary lines
//! name each metric with its value; through `SupervisedTraining` with the strategy, a run prints
//! the loss and accuracy of each split.

use crate::common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn_train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn_train::metric::{
    AccuracyMetric, LossMetric, MetricAttributes, MetricDefinition, MetricEntry, MetricId,
    NumericAttributes, NumericEntry, SerializedEntry,
};
use burn_train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};
use localsgd_learner::{AlgorithmSpec, ConsoleRenderer, StrategyConfig};

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_string).collect()
    }
}

fn id(name: &str) -> MetricId {
    MetricId::new(Arc::new(name.to_string()))
}

fn numeric(name: &str, unit: Option<&str>) -> MetricDefinition {
    MetricDefinition {
        metric_id: id(name),
        name: Arc::new(name.to_string()),
        description: None,
        attributes: MetricAttributes::Numeric(NumericAttributes {
            unit: unit.map(str::to_string),
            higher_is_better: unit.is_some(),
        }),
    }
}

fn value(name: &str, entry: NumericEntry) -> MetricState {
    let text = entry.current().to_string();
    let serialized = SerializedEntry::new(text.clone(), text);
    MetricState::Numeric(MetricEntry::new(id(name), serialized), Some(entry))
}

/// Loss, Accuracy (%) and a generic Note, registered in that order (Loss twice).
fn renderer(out: &Captured) -> ConsoleRenderer {
    let mut r = ConsoleRenderer::new()
        .with_items(25)
        .with_interval(Duration::MAX)
        .with_writer(out.clone());
    r.register_metric(numeric("Loss", None));
    r.register_metric(numeric("Accuracy", Some("%")));
    r.register_metric(numeric("Loss", None));
    r.register_metric(MetricDefinition {
        metric_id: id("Note"),
        name: Arc::new("Note".to_string()),
        description: None,
        attributes: MetricAttributes::None,
    });
    r
}

#[test]
fn progress_and_summary_lines_name_every_metric_with_its_value() {
    let out = Captured::default();
    let mut r = renderer(&out);
    r.start(2, 1, None, None);
    r.start_split("train", 100);
    for done in (10..=100).step_by(10) {
        let loss = 1.0 / done as f64;
        r.update_train(value(
            "Loss",
            NumericEntry::Aggregated {
                aggregated_value: loss,
                count: 10,
            },
        ));
        r.update_train(value("Accuracy", NumericEntry::Value(done as f64 * 0.9)));
        // Unregistered and not-available entries change nothing.
        r.update_train(value("Unknown", NumericEntry::Value(7.0)));
        let na = MetricEntry::new(id("Note"), SerializedEntry::not_available(None));
        r.update_train(MetricState::Numeric(na, None));
        r.update_split(done);
    }
    r.update_train(value("Loss", NumericEntry::Final(0.43124)));
    r.update_train(value("Accuracy", NumericEntry::Final(91.2)));
    let note = MetricEntry::new(
        id("Note"),
        SerializedEntry::new("all good".into(), "all good".into()),
    );
    r.update_train(MetricState::Generic(note));
    r.end_split();

    r.start_split("valid", 40);
    r.update_valid(value("Loss", NumericEntry::Final(0.5)));
    r.update_valid(value("Accuracy", NumericEntry::Final(88.0)));
    r.update_split(40);
    r.end_split();
    r.update_epoch(1);
    r.start_split("train", 100);
    r.update_split(50);
    r.end();

    let lines = out.lines();
    assert_eq!(
        lines,
        [
            "training: epochs 1 to 2",
            // Every 25 items at most: 30, 60, 90 (100 is the summary's).
            "epoch 1/2 train 30/100 (30%): Loss 0.03333, Accuracy 27.00 %",
            "epoch 1/2 train 60/100 (60%): Loss 0.01667, Accuracy 54.00 %",
            "epoch 1/2 train 90/100 (90%): Loss 0.01111, Accuracy 81.00 %",
            "epoch 1/2 train done (100 items): Loss 0.4312, Accuracy 91.20 %, Note all good",
            "epoch 1/2 valid done (40 items): Loss 0.5000, Accuracy 88.00 %",
            // A new split starts without the last one's values.
            "epoch 2/2 train 50/100 (50%)",
            "training ended",
        ],
        "{lines:#?}"
    );
}

#[test]
fn a_zero_interval_prints_every_item_and_tests_have_their_lines() {
    let out = Captured::default();
    let mut r = renderer(&out)
        .with_items(1000)
        .with_interval(Duration::ZERO);
    r.start_global_progress(1);
    r.start_test("digits", 3);
    for done in 1..=3 {
        let loss = NumericEntry::Value(done as f64 * 1e-5);
        r.update_test(EvaluationName::new("digits"), value("Loss", loss));
        r.update_test_progress(done);
    }
    r.end_test();
    r.end_global_progress();
    assert_eq!(
        out.lines(),
        [
            "evaluation: 1 test(s)",
            "test digits 1/3 (33%): Loss 1.000e-5",
            "test digits 2/3 (66%): Loss 2.000e-5",
            "test digits done (3 items): Loss 3.000e-5",
        ]
    );
}

/// One epoch of DDP on the digits through `SupervisedTraining` with burn-train's loss and
/// accuracy metrics: the lines name both, with numbers, for the train and the valid split.
#[test]
fn a_supervised_run_prints_loss_and_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let out = Captured::default();
    let renderer = ConsoleRenderer::new().with_writer(out.clone());
    let config = StrategyConfig::new(AlgorithmSpec::ddp());
    let result = common::run_strategy(dir.path(), config, 1, None, |t| {
        t.metrics((AccuracyMetric::new(), LossMetric::new()))
            .renderer(Box::new(renderer))
    });
    assert!(result.error.is_none(), "{:?}", result.error);
    let lines = out.lines();
    for split in ["train", "valid"] {
        let done = format!("epoch 1/1 {split} done (");
        let summary = lines.iter().find(|l| l.starts_with(&done));
        let summary = summary.unwrap_or_else(|| panic!("no {split} summary in {lines:#?}"));
        assert!(
            summary.contains("Accuracy ") && summary.contains(" %"),
            "{summary}"
        );
        let loss = summary.split("Loss ").nth(1).unwrap_or_default();
        let loss: f64 = loss.split(',').next().unwrap_or_default().parse().unwrap();
        assert!(loss.is_finite() && loss > 0.0, "{summary}");
    }
    let progress = lines.iter().filter(|l| l.contains("%): ")).count();
    assert!(progress >= 1, "{lines:#?}");
}
