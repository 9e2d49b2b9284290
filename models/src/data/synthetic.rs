//! Deterministic synthetic classification data: Gaussian blobs around per-class centers.
//!
//! Every class `c` has a center whose coordinates are drawn from `N(0, CENTER_STD²)`; row `i`
//! has label `i % classes` and features `center[label] + N(0, NOISE_STD²)` per coordinate. The
//! same `(samples, dim, classes, seed)` always gives the same data, on every platform, so all
//! ranks can generate it locally. With these spreads the classes are well separated for
//! `dim >= 2`, so a small MLP learns them quickly.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{DataError, Dataset, TrainTest};

/// Standard deviation of each class-center coordinate.
pub const CENTER_STD: f64 = 3.0;
/// Standard deviation of the noise added to each feature.
pub const NOISE_STD: f64 = 1.0;

/// Generates `samples` rows of `dim` features in `classes` balanced classes (label `i % classes`)
/// from `seed`.
///
/// Errors if `dim` or `classes` is zero.
pub fn generate(
    samples: usize,
    dim: usize,
    classes: usize,
    seed: u64,
) -> Result<Dataset, DataError> {
    if dim == 0 || classes == 0 {
        return Err(DataError::InvalidDataset(format!(
            "synthetic data needs dim >= 1 and classes >= 1, got dim {dim}, classes {classes}"
        )));
    }
    let total = samples.checked_mul(dim).ok_or_else(|| {
        DataError::InvalidDataset(format!(
            "{samples} samples x {dim} features overflows usize"
        ))
    })?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let centers: Vec<f64> = (0..classes * dim)
        .map(|_| CENTER_STD * standard_normal(&mut rng))
        .collect();
    let mut features = Vec::with_capacity(total);
    let mut labels = Vec::with_capacity(samples);
    for i in 0..samples {
        let label = i % classes;
        let center = &centers[label * dim..(label + 1) * dim];
        features.extend(
            center
                .iter()
                .map(|&c| (c + NOISE_STD * standard_normal(&mut rng)) as f32),
        );
        labels.push(label as u32);
    }
    Dataset::new(features, labels, dim, classes)
}

/// Generates `train + test` rows with [`generate`] (same centers for both) and splits them: the
/// first `train` rows train, the remaining `test` rows test.
pub fn generate_split(
    train: usize,
    test: usize,
    dim: usize,
    classes: usize,
    seed: u64,
) -> Result<TrainTest, DataError> {
    let samples = train.checked_add(test).ok_or_else(|| {
        DataError::InvalidDataset(format!("{train} + {test} samples overflows usize"))
    })?;
    let (train, test) = generate(samples, dim, classes, seed)?.split_at(train);
    Ok(TrainTest { train, test })
}

/// One `N(0, 1)` draw by the Box–Muller transform (kept local so the stream never depends on a
/// distribution crate's algorithm).
fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    // `random::<f64>()` is in [0, 1); 1 - u is in (0, 1], so the log is finite.
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}
