//! Byte-level language-modelling data from any text (UTF-8 or not): the vocabulary is the 256
//! byte values, so any file trains with no tokenizer.
//!
//! The text is split at a byte position into a training part and a held-out tail for validation
//! (the last `valid_fraction` of the bytes; [`DEFAULT_VALID_FRACTION`] is 10%): the training part
//! is the first `floor(bytes × (1 − valid_fraction))` bytes, as nanoGPT's
//! `data[:int(n * 0.9)]`, and the validation part is the rest.
//!
//! Each part is cut into contiguous windows of `context + 1` bytes at stride `context`: window
//! `i` is bytes `[i·context, i·context + context + 1)` of its part, so consecutive windows share
//! one byte and every byte of a part after its first is a prediction target exactly once. A part
//! of `p` bytes gives `(p − 1) / context` windows (integer division); the `(p − 1) % context`
//! bytes at its end that do not fill a window are dropped.
//!
//! A window is one row of a [`Dataset`]: `dim = context + 1` features holding the byte values
//! `0..=255` as `f32` (exact), `num_classes = 256`, and the window's last byte as its label. The
//! language model reads its inputs and targets from the features (inputs `row[..context]`,
//! targets `row[1..]`) and ignores the label, which only keeps the row a valid [`Dataset`] row.
//! Rows are sharded across ranks by [`super::ShardSampler`], like every other data set.
//!
//! ```
//! use localsgd_models::data::text;
//!
//! // 40 bytes, a quarter held out: 30 training bytes, 10 validation bytes.
//! let bytes: Vec<u8> = (0..40).collect();
//! let split = text::from_bytes(&bytes, 4, 0.25).unwrap();
//! // Windows of 5 bytes at stride 4: (30 - 1) / 4 = 7 and (10 - 1) / 4 = 2 of them.
//! assert_eq!((split.train.len(), split.test.len()), (7, 2));
//! assert_eq!(split.train.dim(), 5);
//! assert_eq!(split.train.num_classes(), 256);
//! assert_eq!(split.train.row(1).unwrap(), &[4.0, 5.0, 6.0, 7.0, 8.0]);
//! assert_eq!(split.test.row(0).unwrap(), &[30.0, 31.0, 32.0, 33.0, 34.0]);
//! assert_eq!(split.train.labels()[1], 8);
//!
//! let facts = text::facts(bytes.len(), 4, 0.25).unwrap();
//! assert_eq!((facts.train_windows, facts.valid_windows), (7, 2));
//! // A context the text cannot fill is an error that says what is needed.
//! let e = text::from_bytes(&bytes, 16, 0.25).unwrap_err().to_string();
//! assert!(e.contains("need at least 65 bytes"), "{e}");
//! ```

use std::fmt;
use std::path::Path;

use super::{DataError, Dataset, TrainTest};
use crate::limits;

/// The share of the bytes held out for validation when none is chosen: the last 10%.
pub const DEFAULT_VALID_FRACTION: f64 = 0.1;

/// The vocabulary: one class per byte value.
pub const VOCAB_SIZE: usize = 256;

/// How a text divides into training and validation windows, for the run log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextFacts {
    /// Bytes in the whole text.
    pub bytes: usize,
    /// Bytes in the training part (the head of the text).
    pub train_bytes: usize,
    /// Bytes in the validation part (the tail of the text).
    pub valid_bytes: usize,
    /// Bytes of context per window (a window holds `context + 1` bytes).
    pub context: usize,
    /// The share of the bytes held out for validation.
    pub valid_fraction: f64,
    /// Windows (data set rows) in the training part.
    pub train_windows: usize,
    /// Windows (data set rows) in the validation part.
    pub valid_windows: usize,
}

impl TextFacts {
    /// Bytes predicted in one pass over the training windows (`train_windows × context`).
    pub fn train_targets(&self) -> usize {
        self.train_windows * self.context
    }

    /// Bytes predicted in one pass over the validation windows (`valid_windows × context`).
    pub fn valid_targets(&self) -> usize {
        self.valid_windows * self.context
    }

    /// Bytes at the ends of the two parts that fill no window and are dropped.
    pub fn dropped_bytes(&self) -> usize {
        (self.train_bytes - 1) % self.context + (self.valid_bytes - 1) % self.context
    }
}

impl fmt::Display for TextFacts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes ({} training, {} validation = the last {}), context {}: {} training and {} \
             validation windows of {} bytes ({} trailing bytes dropped)",
            self.bytes,
            self.train_bytes,
            self.valid_bytes,
            self.valid_fraction,
            self.context,
            self.train_windows,
            self.valid_windows,
            self.context + 1,
            self.dropped_bytes(),
        )
    }
}

/// Reads the file at `path` and cuts it into training and validation windows with
/// [`from_bytes`].
///
/// Errors: [`DataError::TextRead`] if the file is missing or unreadable, and every error of
/// [`from_bytes`], naming the file.
pub fn load(path: &Path, context: usize, valid_fraction: f64) -> Result<TrainTest, DataError> {
    load_with_facts(path, context, valid_fraction).map(|(split, _)| split)
}

/// [`load`], also returning the [`TextFacts`] for the run log.
pub fn load_with_facts(
    path: &Path,
    context: usize,
    valid_fraction: f64,
) -> Result<(TrainTest, TextFacts), DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::TextRead {
        path: path.to_path_buf(),
        source,
    })?;
    let what = format!("text file `{}`", path.display());
    build(&bytes, context, valid_fraction, &what)
}

/// Cuts `bytes` into a training part and the held-out tail (the last `valid_fraction` of the
/// bytes), each into windows of `context + 1` bytes at stride `context`, one [`Dataset`] row per
/// window (see the [module documentation](self)).
///
/// Errors, before anything is allocated: [`DataError::InvalidContext`] if `context` is 0,
/// [`DataError::InvalidValidFraction`] unless `0 < valid_fraction < 1`,
/// [`DataError::EmptyText`] for no bytes, [`DataError::TextTooShort`] if the text, its training
/// part or its validation part is shorter than one window, and [`DataError::TooLarge`] if the
/// windows would not fit in the memory available.
pub fn from_bytes(
    bytes: &[u8],
    context: usize,
    valid_fraction: f64,
) -> Result<TrainTest, DataError> {
    build(bytes, context, valid_fraction, "the text").map(|(split, _)| split)
}

/// How a text of `bytes` bytes divides into windows for `context` and `valid_fraction`, with the
/// same checks and errors as [`from_bytes`] (except the memory check).
pub fn facts(bytes: usize, context: usize, valid_fraction: f64) -> Result<TextFacts, DataError> {
    facts_of(bytes, context, valid_fraction, "the text")
}

/// [`from_bytes`] with `what` naming the text in errors.
fn build(
    bytes: &[u8],
    context: usize,
    valid_fraction: f64,
    what: &str,
) -> Result<(TrainTest, TextFacts), DataError> {
    let facts = facts_of(bytes.len(), context, valid_fraction, what)?;
    check_memory(&facts, what)?;
    let (train, valid) = bytes.split_at(facts.train_bytes);
    let split = TrainTest {
        train: windows(train, context)?,
        test: windows(valid, context)?,
    };
    Ok((split, facts))
}

/// [`facts`] with `what` naming the text in errors.
fn facts_of(
    bytes: usize,
    context: usize,
    valid_fraction: f64,
    what: &str,
) -> Result<TextFacts, DataError> {
    if context == 0 {
        return Err(DataError::InvalidContext { context });
    }
    let in_range = valid_fraction > 0.0 && valid_fraction < 1.0; // false for NaN
    if !in_range {
        return Err(DataError::InvalidValidFraction {
            value: valid_fraction,
        });
    }
    if bytes == 0 {
        return Err(DataError::EmptyText { what: what.into() });
    }
    let train_bytes = train_len(bytes, valid_fraction);
    let valid_bytes = bytes - train_bytes;
    let window = context.saturating_add(1);
    let short = [
        (bytes, "the whole text".to_string()),
        (
            train_bytes,
            format!("the training part (the first {train_bytes} bytes)"),
        ),
        (
            valid_bytes,
            format!("the validation part (the last {valid_bytes} bytes)"),
        ),
    ]
    .into_iter()
    .find(|&(part_bytes, _)| part_bytes < window);
    if let Some((part_bytes, part)) = short {
        return Err(DataError::TextTooShort {
            what: what.into(),
            part,
            part_bytes,
            bytes,
            context,
            valid_fraction,
            needed: min_bytes(context, valid_fraction),
        });
    }
    Ok(TextFacts {
        bytes,
        train_bytes,
        valid_bytes,
        context,
        valid_fraction,
        train_windows: window_count(train_bytes, context),
        valid_windows: window_count(valid_bytes, context),
    })
}

/// Bytes in the training part of a `bytes`-byte text: `floor(bytes × (1 − valid_fraction))`.
fn train_len(bytes: usize, valid_fraction: f64) -> usize {
    // The float-to-int cast saturates, and the product never exceeds `bytes`.
    ((bytes as f64 * (1.0 - valid_fraction)).floor() as usize).min(bytes)
}

/// Windows of `context + 1` bytes at stride `context` in `part_bytes` bytes.
fn window_count(part_bytes: usize, context: usize) -> usize {
    if part_bytes <= context {
        0
    } else {
        (part_bytes - 1) / context
    }
}

/// The fewest bytes whose training and validation parts both hold one window (saturating at
/// `u64::MAX`, for contexts no text can fill).
fn min_bytes(context: usize, valid_fraction: f64) -> u64 {
    let window = (context as u64).saturating_add(1);
    let fits = |n: u64| {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let train = train_len(n, valid_fraction) as u64;
        train >= window && n as u64 - train >= window
    };
    let mut hi = window.saturating_mul(2);
    while !fits(hi) {
        if hi == u64::MAX {
            return u64::MAX;
        }
        hi = hi.saturating_mul(2);
    }
    // Both parts grow with the text, so the smallest fitting length is found by bisection.
    let mut lo = window.saturating_mul(2) - 1;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) { hi = mid } else { lo = mid }
    }
    hi
}

/// Refuses windows that would not fit in the memory available (4 bytes per feature and label).
fn check_memory(facts: &TextFacts, what: &str) -> Result<(), DataError> {
    let rows = (facts.train_windows + facts.valid_windows) as u64;
    let need = rows.saturating_mul((facts.context as u64).saturating_add(2).saturating_mul(4));
    let windows = format!(
        "its {rows} windows of {} bytes (4 bytes each as f32)",
        facts.context + 1
    );
    let need = limits::Need::new("text-file", what, &windows, need).hint("use a shorter text");
    limits::check(&need, limits::available_memory()).map_err(DataError::from)
}

/// One row per window of `context + 1` bytes at stride `context`; the label is the last byte.
fn windows(part: &[u8], context: usize) -> Result<Dataset, DataError> {
    let count = window_count(part.len(), context);
    let mut features = Vec::with_capacity(count * (context + 1));
    let mut labels = Vec::with_capacity(count);
    for window in (0..count).map(|i| &part[i * context..i * context + context + 1]) {
        features.extend(window.iter().map(|&b| f32::from(b)));
        labels.extend(window.last().map(|&b| u32::from(b)));
    }
    Dataset::new(features, labels, context + 1, VOCAB_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_count_matches_the_stride_rule() {
        assert_eq!(window_count(4, 4), 0);
        assert_eq!(window_count(5, 4), 1);
        assert_eq!(window_count(8, 4), 1);
        assert_eq!(window_count(9, 4), 2);
        assert_eq!(window_count(2, 1), 1);
    }

    #[test]
    fn min_bytes_is_the_smallest_length_that_fits() {
        for (context, fraction) in [(4, 0.25), (64, 0.1), (1, 0.5), (7, 0.9), (255, 0.01)] {
            let n = min_bytes(context, fraction) as usize;
            assert!(
                facts(n, context, fraction).is_ok(),
                "{context} {fraction} {n}"
            );
            assert!(
                facts(n - 1, context, fraction).is_err(),
                "{context} {fraction} {n}"
            );
        }
        assert_eq!(min_bytes(4, 0.25), 17);
        assert_eq!(min_bytes(4, 0.75), 20);
        assert_eq!(min_bytes(usize::MAX, 0.1), u64::MAX);
    }

    #[test]
    fn dropped_bytes_are_the_remainders() {
        let f = facts(40, 4, 0.25).unwrap();
        assert_eq!((f.train_bytes, f.valid_bytes), (30, 10));
        assert_eq!(f.dropped_bytes(), 1 + 1);
        assert_eq!((f.train_targets(), f.valid_targets()), (28, 8));
    }
}
