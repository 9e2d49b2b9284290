//! Reader for the MNIST IDX format (also used by Fashion-MNIST and KMNIST).
//!
//! Images: big-endian `u32` magic `0x00000803`, then `n`, `rows`, `cols`, then `n * rows * cols`
//! bytes. Labels: magic `0x00000801`, then `n`, then `n` bytes. Features are `byte / 255`.
//! Each file may also be gzip'd, under the same name plus `.gz`.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

use super::{DataError, Dataset, TrainTest};

/// Magic number of an IDX images file (unsigned bytes, 3 dimensions).
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an IDX labels file (unsigned bytes, 1 dimension).
pub const LABELS_MAGIC: u32 = 0x0000_0801;
/// Standard file name of the training images.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
/// Standard file name of the training labels.
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
/// Standard file name of the test images.
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
/// Standard file name of the test labels.
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

/// The contents of an IDX images file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxImages {
    /// Number of images.
    pub count: usize,
    /// Rows per image.
    pub rows: usize,
    /// Columns per image.
    pub cols: usize,
    /// `count * rows * cols` pixels, image after image, each row-major.
    pub pixels: Vec<u8>,
}

/// Loads the standard train and test files from `dir` (each plain or `.gz`).
///
/// Features are `byte / 255`; `num_classes` is one more than the largest label of either split,
/// so both splits share it.
pub fn load_dir(dir: &Path) -> Result<TrainTest, DataError> {
    let (train_x, train_y) = load_pair(dir, TRAIN_IMAGES, TRAIN_LABELS)?;
    let (test_x, test_y) = load_pair(dir, TEST_IMAGES, TEST_LABELS)?;
    let dim = train_x.rows * train_x.cols;
    if test_x.rows * test_x.cols != dim {
        return Err(DataError::InvalidDataset(format!(
            "train images are {}x{} but test images are {}x{}",
            train_x.rows, train_x.cols, test_x.rows, test_x.cols
        )));
    }
    let num_classes = train_y
        .iter()
        .chain(&test_y)
        .max()
        .map_or(1, |&m| usize::from(m) + 1);
    let to_dataset = |images: IdxImages, labels: Vec<u8>| {
        let features = images
            .pixels
            .iter()
            .map(|&p| f32::from(p) / 255.0)
            .collect();
        let labels = labels.into_iter().map(u32::from).collect();
        Dataset::new(features, labels, dim, num_classes)
    };
    Ok(TrainTest {
        train: to_dataset(train_x, train_y)?,
        test: to_dataset(test_x, test_y)?,
    })
}

/// Reads one images file and its labels file from `dir` and checks that their counts agree.
fn load_pair(dir: &Path, images: &str, labels: &str) -> Result<(IdxImages, Vec<u8>), DataError> {
    let images_path = locate(dir, images)?;
    let labels_path = locate(dir, labels)?;
    let x = read_images(&images_path)?;
    let y = read_labels(&labels_path)?;
    if x.count != y.len() {
        return Err(DataError::CountMismatch {
            images: images_path,
            num_images: x.count,
            labels: labels_path,
            num_labels: y.len(),
        });
    }
    Ok((x, y))
}

/// Finds `dir/name`, or else `dir/name.gz`.
fn locate(dir: &Path, name: &str) -> Result<PathBuf, DataError> {
    let plain = dir.join(name);
    let gz = dir.join(format!("{name}.gz"));
    if plain.is_file() {
        Ok(plain)
    } else if gz.is_file() {
        Ok(gz)
    } else {
        Err(DataError::MissingFile {
            tried: vec![plain, gz],
        })
    }
}

/// Reads an IDX images file (gzip'd if its name ends in `.gz`).
pub fn read_images(path: &Path) -> Result<IdxImages, DataError> {
    let bytes = read_bytes(path)?;
    let header = parse_header(path, &bytes, IMAGES_MAGIC, "images", 3)?;
    let (count, rows, cols) = (header[0], header[1], header[2]);
    let pixels = body(path, &bytes, 16, [count, rows, cols])?;
    Ok(IdxImages {
        count,
        rows,
        cols,
        pixels,
    })
}

/// Reads an IDX labels file (gzip'd if its name ends in `.gz`).
pub fn read_labels(path: &Path) -> Result<Vec<u8>, DataError> {
    let bytes = read_bytes(path)?;
    let header = parse_header(path, &bytes, LABELS_MAGIC, "labels", 1)?;
    body(path, &bytes, 8, [header[0], 1, 1])
}

/// The whole file, decompressed when the name ends in `.gz`.
fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|source| DataError::Gzip {
                what: path.display().to_string(),
                source,
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Checks the magic and returns the `dims` big-endian `u32` sizes that follow it.
fn parse_header(
    path: &Path,
    bytes: &[u8],
    expected: u32,
    kind: &'static str,
    dims: usize,
) -> Result<Vec<usize>, DataError> {
    let header_len = 4 * (1 + dims);
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .take(1 + dims)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    match words.first() {
        Some(&found) if found != expected => {
            return Err(DataError::BadMagic {
                path: path.to_path_buf(),
                found,
                expected,
                kind,
            });
        }
        _ => {}
    }
    if bytes.len() < header_len {
        return Err(DataError::Truncated {
            path: path.to_path_buf(),
            expected: header_len,
            found: bytes.len(),
        });
    }
    Ok(words[1..].iter().map(|&w| w as usize).collect())
}

/// The `product(sizes)` bytes after the `header_len`-byte header; the file must end there.
fn body(
    path: &Path,
    bytes: &[u8],
    header_len: usize,
    sizes: [usize; 3],
) -> Result<Vec<u8>, DataError> {
    let expected = sizes
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .and_then(|n| n.checked_add(header_len))
        .ok_or_else(|| {
            DataError::InvalidDataset(format!(
                "{}: header sizes {sizes:?} overflow",
                path.display()
            ))
        })?;
    if bytes.len() < expected {
        return Err(DataError::Truncated {
            path: path.to_path_buf(),
            expected,
            found: bytes.len(),
        });
    }
    if bytes.len() > expected {
        return Err(DataError::TrailingBytes {
            path: path.to_path_buf(),
            expected,
            extra: bytes.len() - expected,
        });
    }
    Ok(bytes[header_len..].to_vec())
}
