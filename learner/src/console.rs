//! [`ConsoleRenderer`]: burn-train metrics as plain text lines, for builds without burn-train's
//! `tui` feature (this workspace's), whose fallback renderer prints no metric.

use std::io::Write;
use std::time::{Duration, Instant};

use burn_train::LearnerSummary;
use burn_train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn_train::metric::{MetricAttributes, MetricDefinition, MetricEntry, MetricId};
use burn_train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};

/// A burn-train `MetricsRenderer` that prints plain lines, readable in a terminal and in a log
/// file: during a split, at most one progress line per tenth of its items (or
/// [`with_items`](Self::with_items)) or per 5 seconds ([`with_interval`](Self::with_interval)),
/// whichever comes first, with the epoch, the items done and the latest (batch) value of every
/// registered metric; then one line at the end of each train, valid and test split with each
/// metric's value over the split. Give it to `SupervisedTraining::renderer`:
///
/// ```text
/// epoch 1/2 train 400/2000 (20%): Accuracy 62.50 %, Loss 1.032
/// epoch 1/2 train done (2000 items): Accuracy 68.05 %, Loss 0.8902
/// epoch 1/2 valid done (10000 items): Accuracy 76.42 %, Loss 0.6395
/// ```
///
/// Lines go to stdout unless [`with_writer`](Self::with_writer) says otherwise; a failed write
/// is ignored (a renderer has no way to report it and must not stop training).
pub struct ConsoleRenderer {
    out: Box<dyn Write + Send + Sync>,
    items: Option<usize>,
    interval: Duration,
    label: String,
    epoch: usize,
    total_epochs: usize,
    /// The split under way: `train`, `valid` or a test's name, and which value slot it fills.
    split: String,
    slot: usize,
    done: usize,
    total: usize,
    last_items: usize,
    last_time: Instant,
    metrics: Vec<Shown>,
}

/// A registered metric and its latest formatted value in each slot (train, valid, test).
struct Shown {
    id: MetricId,
    name: String,
    unit: Option<String>,
    values: [Option<String>; 3],
}

const TRAIN: usize = 0;
const VALID: usize = 1;
const TEST: usize = 2;

impl ConsoleRenderer {
    /// A renderer printing to stdout, a progress line per tenth of a split or per 5 seconds.
    pub fn new() -> Self {
        Self {
            out: Box::new(std::io::stdout()),
            items: None,
            interval: Duration::from_secs(5),
            label: "training".to_string(),
            epoch: 0,
            total_epochs: 0,
            split: String::new(),
            slot: TRAIN,
            done: 0,
            total: 0,
            last_items: 0,
            last_time: Instant::now(),
            metrics: Vec::new(),
        }
    }

    /// Print a progress line at least every `interval` while items arrive (default 5 s).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Print a progress line every `items` items of a split (default: a tenth of the split).
    pub fn with_items(mut self, items: usize) -> Self {
        self.items = Some(items.max(1));
        self
    }

    /// Write the lines to `out` (a file, a buffer) instead of stdout.
    pub fn with_writer(mut self, out: impl Write + Send + Sync + 'static) -> Self {
        self.out = Box::new(out);
        self
    }

    fn start_split_in(&mut self, name: &str, slot: usize, total: usize) {
        self.split = name.to_string();
        self.slot = slot;
        (self.done, self.total, self.last_items) = (0, total, 0);
        self.last_time = Instant::now();
        self.metrics.iter_mut().for_each(|m| m.values[slot] = None);
    }

    /// `epoch 1/2 train` or `test NAME`.
    fn head(&self) -> String {
        match self.slot {
            TEST => format!("test {}", self.split),
            _ => format!("epoch {}/{} {}", self.epoch, self.total_epochs, self.split),
        }
    }

    fn progress(&mut self, done: usize) {
        self.done = done;
        let every = self.items.unwrap_or((self.total / 10).max(1));
        // The last item's line would repeat the split's summary, which follows.
        if done >= self.total && self.total > 0
            || (done < self.last_items + every && self.last_time.elapsed() < self.interval)
        {
            return;
        }
        (self.last_items, self.last_time) = (done, Instant::now());
        let percent = (done * 100).checked_div(self.total).unwrap_or(0);
        let head = format!("{} {done}/{} ({percent}%)", self.head(), self.total);
        self.line(&head);
    }

    fn summary(&mut self) {
        let head = format!("{} done ({} items)", self.head(), self.done);
        self.line(&head);
    }

    /// `head`, then `: Name value, ...` for each metric with a value in the current slot.
    fn line(&mut self, head: &str) {
        let values: Vec<String> = (self.metrics.iter())
            .filter_map(|m| Some(format!("{} {}", m.name, m.values[self.slot].as_ref()?)))
            .collect();
        let text = match values.is_empty() {
            true => head.to_string(),
            false => format!("{head}: {}", values.join(", ")),
        };
        self.write(&text);
    }

    fn write(&mut self, text: &str) {
        let _ = writeln!(self.out, "{text}").and_then(|_| self.out.flush());
    }

    fn update(&mut self, slot: usize, state: MetricState) {
        let (entry, number) = match state {
            MetricState::Generic(entry) => (entry, None),
            MetricState::Numeric(entry, number) => (entry, number.map(|n| n.current())),
        };
        let MetricEntry {
            metric_id,
            serialized_entry,
        } = entry;
        let Some(metric) = self.metrics.iter_mut().find(|m| m.id == metric_id) else {
            return; // unregistered: no name to show
        };
        let value = match (number, &metric.unit) {
            (Some(v), Some(unit)) => format!("{} {unit}", number_text(v)),
            (Some(v), None) => number_text(v),
            (None, _) if serialized_entry.is_not_available() => return,
            (None, _) => serialized_entry.formatted,
        };
        metric.values[slot] = Some(value);
    }
}

impl Default for ConsoleRenderer {
    fn default() -> Self {
        Self::new()
    }
}

/// Four significant digits (`0.4312`, `91.20`, `1234`), scientific beyond.
fn number_text(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() || a == 0.0 {
        return format!("{v}");
    }
    if !(1e-3..1e5).contains(&a) {
        return format!("{v:.3e}");
    }
    let decimals = (3 - a.log10().floor() as i32).max(0) as usize;
    format!("{v:.decimals$}")
}

impl MetricsRendererTraining for ConsoleRenderer {
    fn update_train(&mut self, state: MetricState) {
        self.update(TRAIN, state);
    }

    fn update_valid(&mut self, state: MetricState) {
        self.update(VALID, state);
    }

    fn on_train_end(
        &mut self,
        summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        if let Some(summary) = summary {
            self.write(&summary.to_string());
        }
        Ok(())
    }
}

impl MetricsRendererEvaluation for ConsoleRenderer {
    fn update_test(&mut self, _name: EvaluationName, state: MetricState) {
        self.update(TEST, state);
    }

    fn on_test_end(
        &mut self,
        summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        self.on_train_end(summary)
    }
}

impl TrainingProgressLogger for ConsoleRenderer {
    fn start(&mut self, total: usize, starting: usize, _items: Option<usize>, label: Option<&str>) {
        (self.epoch, self.total_epochs) = (starting, total);
        self.label = label.unwrap_or("training").to_string();
        let text = format!("{}: epochs {starting} to {total}", self.label);
        self.write(&text);
    }

    fn update_epoch(&mut self, epoch: usize) {
        self.epoch = epoch + 1;
    }

    fn start_split(&mut self, split: &str, total_items: usize) {
        let slot = if split == "valid" { VALID } else { TRAIN };
        self.start_split_in(split, slot, total_items);
    }

    fn update_split(&mut self, items_processed: usize) {
        self.progress(items_processed);
    }

    fn end_split(&mut self) {
        self.summary();
    }

    fn end(&mut self) {
        let text = format!("{} ended", self.label);
        self.write(&text);
    }

    fn log_event_training(&mut self, _event: String) {}
}

impl EvaluationProgressLogger for ConsoleRenderer {
    fn start_global_progress(&mut self, total_tests: usize) {
        self.write(&format!("evaluation: {total_tests} test(s)"));
    }

    fn start_test(&mut self, name: &str, total_items: usize) {
        self.start_split_in(name, TEST, total_items);
    }

    fn update_test_progress(&mut self, items_processed: usize) {
        self.progress(items_processed);
    }

    fn end_test(&mut self) {
        self.summary();
    }

    fn end_global_progress(&mut self) {}

    fn log_event_evaluation(&mut self, _event: String) {}
}

impl MetricsRenderer for ConsoleRenderer {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        if self.metrics.iter().any(|m| m.id == definition.metric_id) {
            return;
        }
        let unit = match definition.attributes {
            MetricAttributes::Numeric(numeric) => numeric.unit,
            MetricAttributes::None => None,
        };
        self.metrics.push(Shown {
            id: definition.metric_id,
            name: definition.name.to_string(),
            unit,
            values: [None, None, None],
        });
    }
}
