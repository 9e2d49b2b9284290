//! Synthetic blobs: deterministic, balanced and learnable.

use localsgd_models::data::{DataError, synthetic};

#[test]
fn same_seed_same_data_other_seed_other_data() {
    let a = synthetic::generate(60, 5, 3, 42).unwrap();
    let b = synthetic::generate(60, 5, 3, 42).unwrap();
    let c = synthetic::generate(60, 5, 3, 43).unwrap();
    assert_eq!(a, b);
    assert_ne!(a.features(), c.features());
    assert_eq!((a.len(), a.dim(), a.num_classes()), (60, 5, 3));
    assert_eq!(a.features().len(), 300);
    assert!(a.features().iter().all(|v| v.is_finite()));
}

#[test]
fn labels_are_balanced_round_robin() {
    let d = synthetic::generate(10, 2, 4, 0).unwrap();
    assert_eq!(d.labels(), &[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]);
}

#[test]
fn split_shares_centers_and_is_learnable() {
    let split = synthetic::generate_split(300, 150, 8, 4, 7).unwrap();
    assert_eq!((split.train.len(), split.test.len()), (300, 150));
    // The split is the first 300 rows of the same 450-row generation.
    let whole = synthetic::generate(450, 8, 4, 7).unwrap();
    assert_eq!(split.test.row(0), whole.row(300));

    // Nearest class mean of the train rows classifies the test rows almost perfectly.
    let (dim, classes) = (8, 4);
    let mut means = vec![0.0f64; classes * dim];
    let mut counts = vec![0usize; classes];
    for i in 0..split.train.len() {
        let c = split.train.labels()[i] as usize;
        counts[c] += 1;
        for (j, &v) in split.train.row(i).unwrap().iter().enumerate() {
            means[c * dim + j] += f64::from(v);
        }
    }
    for c in 0..classes {
        for j in 0..dim {
            means[c * dim + j] /= counts[c] as f64;
        }
    }
    let correct = (0..split.test.len())
        .filter(|&i| {
            let row = split.test.row(i).unwrap();
            let dist = |c: usize| -> f64 {
                row.iter()
                    .enumerate()
                    .map(|(j, &v)| (f64::from(v) - means[c * dim + j]).powi(2))
                    .sum()
            };
            let best = (0..classes)
                .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                .unwrap();
            best == split.test.labels()[i] as usize
        })
        .count();
    assert!(correct as f64 / 150.0 > 0.95, "{correct}/150 correct");
}

#[test]
fn zero_dim_or_classes_is_an_error() {
    assert!(matches!(
        synthetic::generate(10, 0, 3, 1),
        Err(DataError::InvalidDataset(_))
    ));
    let err = synthetic::generate(10, 3, 0, 1).unwrap_err().to_string();
    assert!(err.contains("classes 0"), "{err}");
}
