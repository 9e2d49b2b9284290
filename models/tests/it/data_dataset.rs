//! `Dataset` construction checks and conversion of a batch to burn tensors.

use burn::tensor::Device;
use localsgd_models::data::{DataError, Dataset};

fn small() -> Dataset {
    // 3 rows of 2 features.
    Dataset::new(vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5], vec![2, 0, 1], 2, 3).unwrap()
}

#[test]
fn accessors() {
    let d = small();
    assert_eq!(
        (d.len(), d.dim(), d.num_classes(), d.is_empty()),
        (3, 2, 3, false)
    );
    assert_eq!(d.row(1), Some([1.0f32, 1.5].as_slice()));
    assert_eq!(d.row(3), None);
    let (a, b) = d.split_at(1);
    assert_eq!((a.len(), b.len()), (1, 2));
    assert_eq!(b.labels(), &[0, 1]);
    assert_eq!(b.num_classes(), 3);
}

#[test]
fn batch_tensors_gathers_rows_in_order() {
    let device = Device::flex();
    let (x, y) = small().batch_tensors(&[2, 0, 2], &device).unwrap();
    assert_eq!(x.dims(), [3, 2]);
    assert_eq!(
        x.into_data().try_to_vec::<f32>().unwrap(),
        vec![2.0, 2.5, 0.0, 0.5, 2.0, 2.5]
    );
    let labels: Vec<i64> = y.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
    assert_eq!(labels, vec![1, 2, 1]);
}

#[test]
fn batch_index_out_of_range_is_an_error() {
    let err = small().batch_tensors(&[0, 3], &Device::flex()).unwrap_err();
    assert!(matches!(
        err,
        DataError::IndexOutOfRange { index: 3, len: 3 }
    ));
}

#[test]
fn inconsistent_parts_are_rejected() {
    let err = Dataset::new(vec![0.0; 5], vec![0, 0], 2, 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("5 feature values") && err.contains("2 rows of 2"),
        "{err}"
    );
    let err = Dataset::new(vec![0.0; 4], vec![0, 3], 2, 3)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("row 1 has label 3") && err.contains("0..3"),
        "{err}"
    );
    assert!(Dataset::new(vec![], vec![], 0, 3).is_err());
    assert!(Dataset::new(vec![], vec![], 2, 0).is_err());
}
