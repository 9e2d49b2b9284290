//! The IDX reader on hand-built files in a temporary directory, and every error case.

use std::io::Write;
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;
use localsgd_models::data::{DataError, idx};

/// An images file: magic 0x00000803, n, rows, cols (big-endian u32), then the pixels.
fn images_bytes(n: u32, rows: u32, cols: u32, pixels: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, 8, 3];
    for v in [n, rows, cols] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b.extend_from_slice(pixels);
    b
}

/// A labels file: magic 0x00000801, n, then the labels.
fn labels_bytes(labels: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, 8, 1];
    b.extend_from_slice(&(labels.len() as u32).to_be_bytes());
    b.extend_from_slice(labels);
    b
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Train: 3 images of 2x2; test: 2 images; all four files plain.
fn write_dir(dir: &Path) {
    let train_px = [0u8, 255, 51, 102, 1, 2, 3, 4, 10, 20, 30, 40];
    std::fs::write(
        dir.join(idx::TRAIN_IMAGES),
        images_bytes(3, 2, 2, &train_px),
    )
    .unwrap();
    std::fs::write(dir.join(idx::TRAIN_LABELS), labels_bytes(&[7, 0, 3])).unwrap();
    std::fs::write(dir.join(idx::TEST_IMAGES), images_bytes(2, 2, 2, &[255; 8])).unwrap();
    std::fs::write(dir.join(idx::TEST_LABELS), labels_bytes(&[9, 1])).unwrap();
}

#[test]
fn reads_plain_files() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path());
    let split = idx::load_dir(dir.path()).unwrap();
    assert_eq!((split.train.len(), split.test.len()), (3, 2));
    assert_eq!(split.train.dim(), 4);
    assert_eq!(split.train.row(0).unwrap(), &[0.0, 1.0, 0.2, 0.4]);
    assert_eq!(split.train.labels(), &[7, 0, 3]);
    assert_eq!(split.test.labels(), &[9, 1]);
    // num_classes = largest label of either split + 1, shared.
    assert_eq!(
        (split.train.num_classes(), split.test.num_classes()),
        (10, 10)
    );
}

#[test]
fn reads_gzipped_files() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path());
    for name in [idx::TRAIN_IMAGES, idx::TEST_LABELS] {
        let plain = dir.path().join(name);
        let bytes = std::fs::read(&plain).unwrap();
        std::fs::write(dir.path().join(format!("{name}.gz")), gzip(&bytes)).unwrap();
        std::fs::remove_file(plain).unwrap();
    }
    let split = idx::load_dir(dir.path()).unwrap();
    assert_eq!(
        split.train.row(2).unwrap(),
        &[10.0 / 255.0, 20.0 / 255.0, 30.0 / 255.0, 40.0 / 255.0]
    );
    assert_eq!(split.test.labels(), &[9, 1]);
}

#[test]
fn read_images_exposes_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x");
    std::fs::write(&path, images_bytes(1, 2, 3, &[1, 2, 3, 4, 5, 6])).unwrap();
    let images = idx::read_images(&path).unwrap();
    assert_eq!((images.count, images.rows, images.cols), (1, 2, 3));
    assert_eq!(images.pixels, vec![1, 2, 3, 4, 5, 6]);
}

#[test]
fn missing_file_names_both_candidates() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path());
    std::fs::remove_file(dir.path().join(idx::TEST_LABELS)).unwrap();
    match idx::load_dir(dir.path()) {
        Err(DataError::MissingFile { tried }) => {
            assert_eq!(tried[0], dir.path().join(idx::TEST_LABELS));
            assert_eq!(tried[1], dir.path().join("t10k-labels-idx1-ubyte.gz"));
        }
        other => panic!("expected MissingFile, got {other:?}"),
    }
}

#[test]
fn bad_magic_reports_the_value() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path());
    // A labels file where images are expected.
    std::fs::write(dir.path().join(idx::TRAIN_IMAGES), labels_bytes(&[1, 2, 3])).unwrap();
    let err = idx::load_dir(dir.path()).unwrap_err();
    assert!(matches!(
        err,
        DataError::BadMagic {
            found: 0x801,
            expected: 0x803,
            kind: "images",
            ..
        }
    ));
    let msg = err.to_string();
    assert!(
        msg.contains("0x00000801") && msg.contains(idx::TRAIN_IMAGES),
        "{msg}"
    );
}

#[test]
fn truncated_and_overlong_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("imgs");
    // Header says 2 images of 2x2 = 8 pixels, only 5 present: 16 + 8 expected, 21 found.
    std::fs::write(&path, images_bytes(2, 2, 2, &[0; 5])).unwrap();
    let err = idx::read_images(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Truncated {
                expected: 24,
                found: 21,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("imgs"));
    // Cut inside the header.
    std::fs::write(&path, [0u8, 0, 8, 3, 0, 0]).unwrap();
    assert!(matches!(
        idx::read_images(&path),
        Err(DataError::Truncated {
            expected: 16,
            found: 6,
            ..
        })
    ));
    // Empty file.
    std::fs::write(&path, []).unwrap();
    assert!(matches!(
        idx::read_labels(&path),
        Err(DataError::Truncated {
            expected: 8,
            found: 0,
            ..
        })
    ));
    // Two extra bytes.
    let mut long = labels_bytes(&[1, 2]);
    long.extend_from_slice(&[0, 0]);
    std::fs::write(&path, long).unwrap();
    assert!(matches!(
        idx::read_labels(&path),
        Err(DataError::TrailingBytes {
            expected: 10,
            extra: 2,
            ..
        })
    ));
}

#[test]
fn corrupt_gzip_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("labels.gz");
    std::fs::write(&path, b"not gzip at all").unwrap();
    let err = idx::read_labels(&path).unwrap_err();
    assert!(matches!(err, DataError::Gzip { .. }), "{err:?}");
    assert!(err.to_string().contains("labels.gz"));
}

#[test]
fn image_and_label_counts_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path());
    std::fs::write(dir.path().join(idx::TRAIN_LABELS), labels_bytes(&[1, 2])).unwrap();
    match idx::load_dir(dir.path()) {
        Err(DataError::CountMismatch {
            num_images: 3,
            num_labels: 2,
            images,
            labels,
        }) => {
            assert!(images.ends_with(idx::TRAIN_IMAGES));
            assert!(labels.ends_with(idx::TRAIN_LABELS));
        }
        other => panic!("expected CountMismatch, got {other:?}"),
    }
}

#[test]
fn train_and_test_image_sizes_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    write_dir(dir.path());
    std::fs::write(
        dir.path().join(idx::TEST_IMAGES),
        images_bytes(2, 3, 1, &[0; 6]),
    )
    .unwrap();
    let err = idx::load_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("2x2") && err.contains("3x1"), "{err}");
}
