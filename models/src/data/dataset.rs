//! The in-memory [`Dataset`] and its conversion to burn tensors.

use burn::tensor::{Device, Int, Tensor, TensorData};

use super::DataError;

/// A classification dataset held in memory: `len` rows of `dim` features and one label each.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    features: Vec<f32>,
    labels: Vec<u32>,
    dim: usize,
    num_classes: usize,
}

/// A dataset's canonical train/test split.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainTest {
    /// The rows used for training.
    pub train: Dataset,
    /// The held-out rows used for evaluation.
    pub test: Dataset,
}

impl Dataset {
    /// Builds a dataset from row-major `features` (`labels.len()` rows of `dim` values) and
    /// `labels` in `0..num_classes`.
    ///
    /// Errors if `dim` or `num_classes` is zero, the feature count is not `labels.len() * dim`,
    /// or a label is out of range.
    pub fn new(
        features: Vec<f32>,
        labels: Vec<u32>,
        dim: usize,
        num_classes: usize,
    ) -> Result<Self, DataError> {
        if dim == 0 || num_classes == 0 {
            return Err(DataError::InvalidDataset(format!(
                "dim ({dim}) and num_classes ({num_classes}) must both be positive"
            )));
        }
        if Some(features.len()) != labels.len().checked_mul(dim) {
            return Err(DataError::InvalidDataset(format!(
                "{} feature values do not form {} rows of {dim}",
                features.len(),
                labels.len()
            )));
        }
        if let Some((row, &label)) = labels
            .iter()
            .enumerate()
            .find(|&(_, &l)| l as usize >= num_classes)
        {
            return Err(DataError::InvalidDataset(format!(
                "row {row} has label {label}, valid labels are 0..{num_classes}"
            )));
        }
        Ok(Self {
            features,
            labels,
            dim,
            num_classes,
        })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the dataset has no rows.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Number of features per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of classes; every label is below it.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// All features, row-major (`len() * dim()` values).
    pub fn features(&self) -> &[f32] {
        &self.features
    }

    /// All labels, one per row.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// The features of row `index`, or `None` past the end.
    pub fn row(&self, index: usize) -> Option<&[f32]> {
        let start = index.checked_mul(self.dim)?;
        let end = start.checked_add(self.dim)?;
        self.features.get(start..end)
    }

    /// Splits into rows `[0, at)` and `[at, len)` (`at` is clamped to `len`); both halves keep
    /// `num_classes`.
    pub fn split_at(&self, at: usize) -> (Dataset, Dataset) {
        let at = at.min(self.len());
        let (fa, fb) = self.features.split_at(at * self.dim);
        let (la, lb) = self.labels.split_at(at);
        let part = |f: &[f32], l: &[u32]| Dataset {
            features: f.to_vec(),
            labels: l.to_vec(),
            dim: self.dim,
            num_classes: self.num_classes,
        };
        (part(fa, la), part(fb, lb))
    }

    /// Gathers the rows `indices` (in that order, repeats allowed) into a `[batch, dim]` float
    /// tensor and a `[batch]` Int label tensor on `device`.
    ///
    /// Errors with [`DataError::IndexOutOfRange`] if an index is `>= len()`.
    pub fn batch_tensors(
        &self,
        indices: &[usize],
        device: &Device,
    ) -> Result<(Tensor<2>, Tensor<1, Int>), DataError> {
        let mut x = Vec::with_capacity(indices.len() * self.dim);
        let mut y = Vec::with_capacity(indices.len());
        for &index in indices {
            let row = self.row(index).ok_or(DataError::IndexOutOfRange {
                index,
                len: self.len(),
            })?;
            x.extend_from_slice(row);
            y.push(i64::from(self.labels[index]));
        }
        let features =
            Tensor::<2>::from_data(TensorData::new(x, [indices.len(), self.dim]), device);
        let labels = Tensor::<1, Int>::from_data(TensorData::new(y, [indices.len()]), device);
        Ok((features, labels))
    }
}
