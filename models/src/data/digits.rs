//! The bundled UCI "Optical Recognition of Handwritten Digits" data (1797 8x8 images, 10 classes),
//! embedded in the binary so the default run needs no download.
//!
//! Source: E. Alpaydin, C. Kaynak (1998), UCI Machine Learning Repository, CC BY 4.0, as shipped
//! inside scikit-learn (`sklearn/datasets/data/digits.csv.gz`).

use std::io::Read;

use flate2::read::GzDecoder;

use super::{DataError, Dataset, TrainTest};

/// The gzip'd CSV: one sample per line, 64 pixel values in `0..=16`, then the label `0..=9`.
const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../../data/digits.csv.gz");

/// Number of rows in the file.
pub const NUM_ROWS: usize = 1797;
/// Rows `[0, TRAIN_ROWS)` form the canonical training split, the rest the test split.
pub const TRAIN_ROWS: usize = 1437;
/// Features per row (an 8x8 image, row-major).
pub const DIM: usize = 64;
/// Number of classes (the digits 0..=9).
pub const NUM_CLASSES: usize = 10;
/// Largest pixel value; features are `pixel / MAX_PIXEL`.
pub const MAX_PIXEL: f32 = 16.0;

/// All 1797 rows in file order, features scaled to `[0, 1]` by `pixel / 16`.
pub fn load_all() -> Result<Dataset, DataError> {
    let mut csv = String::new();
    GzDecoder::new(DIGITS_CSV_GZ)
        .read_to_string(&mut csv)
        .map_err(|source| DataError::Gzip {
            what: "embedded digits.csv.gz".to_string(),
            source,
        })?;
    parse_csv(&csv)
}

/// The canonical split: train = rows `[0, 1437)`, test = rows `[1437, 1797)`, in file order.
pub fn load() -> Result<TrainTest, DataError> {
    let (train, test) = load_all()?.split_at(TRAIN_ROWS);
    Ok(TrainTest { train, test })
}

/// Parses digits CSV text (64 integer pixels in `0..=16`, then a label in `0..=9`, per line).
/// Blank lines are skipped.
pub fn parse_csv(csv: &str) -> Result<Dataset, DataError> {
    let mut features = Vec::with_capacity(NUM_ROWS * DIM);
    let mut labels = Vec::with_capacity(NUM_ROWS);
    for (i, line) in csv.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let err = |problem: String| DataError::DigitsParse {
            line: line_no,
            problem,
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != DIM + 1 {
            return Err(err(format!(
                "expected {} comma-separated values, found {}",
                DIM + 1,
                fields.len()
            )));
        }
        for (col, field) in fields[..DIM].iter().enumerate() {
            let pixel =
                parse_int(field, MAX_PIXEL as u32).map_err(|p| err(format!("pixel {col}: {p}")))?;
            features.push(pixel as f32 / MAX_PIXEL);
        }
        let label = parse_int(fields[DIM], NUM_CLASSES as u32 - 1)
            .map_err(|p| err(format!("label: {p}")))?;
        labels.push(label);
    }
    Dataset::new(features, labels, DIM, NUM_CLASSES)
}

/// Parses an integer in `0..=max`; an integral float such as `"3.0"` is accepted too.
fn parse_int(field: &str, max: u32) -> Result<u32, String> {
    let value: f64 = field
        .parse()
        .map_err(|_| format!("{field:?} is not a number"))?;
    if value.fract() != 0.0 || !(0.0..=f64::from(max)).contains(&value) {
        return Err(format!("{field:?} is not an integer in 0..={max}"));
    }
    Ok(value as u32)
}
