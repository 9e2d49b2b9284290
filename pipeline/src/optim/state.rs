//! Per-parameter optimizer state, recorded under the same names as burn's `SgdState` and
//! `AdamState`/`AdamWState` (`momentum.velocity`; `momentum.time`, `momentum.moment_1`,
//! `momentum.moment_2`), so an optimizer record moves between burn's optimizers and the fused
//! ones in either direction.

use burn::optim::{RecordState, StateSink, StateSource, join_path};
use burn::tensor::{Device, Tensor, TensorData};
use burn_pack::Scalar;

/// SGD's state of one parameter: the momentum buffer (PyTorch's `momentum_buffer`), when
/// momentum is on.
#[derive(Clone)]
pub struct SgdState<const D: usize> {
    /// The momentum buffer; `None` without momentum.
    pub velocity: Option<Tensor<D>>,
}

/// Adam's and AdamW's state of one parameter: PyTorch's `step`, `exp_avg` and `exp_avg_sq`.
#[derive(Clone)]
pub struct AdamState<const D: usize> {
    /// Steps taken (the bias corrections' `t`).
    pub time: usize,
    /// First moment (`exp_avg`).
    pub moment_1: Tensor<D>,
    /// Second moment (`exp_avg_sq`).
    pub moment_2: Tensor<D>,
}

const MOMENTUM: &str = "momentum";

impl<const D: usize> RecordState for SgdState<D> {
    fn state_flatten(&self, prefix: &str, out: &mut StateSink) {
        if let Some(v) = &self.velocity {
            out.push_tensor(
                &join_path(prefix, MOMENTUM),
                "velocity",
                v.clone().into_data(),
            );
        }
    }

    fn state_unflatten(prefix: &str, src: &mut StateSource, device: &Device) -> Option<Self> {
        let path = join_path(prefix, MOMENTUM);
        let velocity = src
            .take_tensor(&path, "velocity")
            .map(|data| Tensor::from_data(data, device));
        Some(Self { velocity })
    }
}

impl<const D: usize> RecordState for AdamState<D> {
    fn state_flatten(&self, prefix: &str, out: &mut StateSink) {
        let path = join_path(prefix, MOMENTUM);
        out.push_scalar(&path, "time", Scalar::from(self.time));
        out.push_tensor(&path, "moment_1", self.moment_1.clone().into_data());
        out.push_tensor(&path, "moment_2", self.moment_2.clone().into_data());
    }

    fn state_unflatten(prefix: &str, src: &mut StateSource, device: &Device) -> Option<Self> {
        let path = join_path(prefix, MOMENTUM);
        let time = usize::try_from(src.take_scalar(&path, "time")?).ok()?;
        let moment_1: TensorData = src.take_tensor(&path, "moment_1")?;
        let moment_2: TensorData = src.take_tensor(&path, "moment_2")?;
        Some(Self {
            time,
            moment_1: Tensor::from_data(moment_1, device),
            moment_2: Tensor::from_data(moment_2, device),
        })
    }
}
