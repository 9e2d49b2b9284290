//! A 2-d batch normalization with PyTorch's `nn.BatchNorm2d` arithmetic.
//!
//! burn's `BatchNorm` updates its running variance with the biased (population) batch variance;
//! PyTorch updates `running_var` with the unbiased one (`n / (n - 1)` times it, `n` = batch x
//! height x width). Training-mode outputs agree; the running statistics, and so every
//! evaluation, drift apart. [`BatchNorm2d`] keeps burn's layout (`gamma`, `beta`, `training`,
//! `running_mean`, `running_var`, all visited like burn's) and PyTorch's update:
//!
//! `running_mean <- (1 - momentum) running_mean + momentum mean`,
//! `running_var <- (1 - momentum) running_var + momentum var * n / (n - 1)`.
//!
//! ```
//! use burn::tensor::{Device, Tensor, TensorData};
//! use localsgd_models::batch_norm::BatchNorm2d;
//!
//! let device = Device::flex().autodiff();
//! let norm = BatchNorm2d::new(1, &device);
//! // One channel, values 1 and 3: batch mean 2, biased variance 1, unbiased 2.
//! let x = Tensor::<4>::from_data(TensorData::new(vec![1.0f32, 3.0], [2, 1, 1, 1]), &device);
//! let _ = norm.forward(x);
//! let norm = norm.valid(); // applies the pending running-statistics update
//! let mean: Vec<f32> = norm.running_mean.value().into_data().to_vec().unwrap();
//! let var: Vec<f32> = norm.running_var.value().into_data().to_vec().unwrap();
//! assert!((mean[0] - 0.2).abs() < 1e-6); // 0.9 * 0 + 0.1 * 2
//! assert!((var[0] - 1.1).abs() < 1e-6); // 0.9 * 1 + 0.1 * 2
//! # use burn::module::Module;
//! ```

use burn::module::{Flag, Module, Param, RunningState};
use burn::tensor::{Device, Tensor};

/// PyTorch's `nn.BatchNorm2d(channels)` with its defaults (momentum 0.1, eps 1e-5, affine,
/// running statistics tracked): batch statistics in training on an autodiff device, running
/// statistics otherwise (after [`Module::valid`], or on a plain device).
#[derive(Module, Debug)]
pub struct BatchNorm2d {
    /// The learnable scale (PyTorch's `weight`), initialised to ones.
    pub gamma: Param<Tensor<1>>,
    /// The learnable shift (PyTorch's `bias`), initialised to zeros.
    pub beta: Param<Tensor<1>>,
    /// Whether training behaviour is on (burn's flag; [`Module::valid`] turns it off).
    pub training: Param<Flag>,
    /// The running mean, initialised to zeros.
    pub running_mean: RunningState<Tensor<1>>,
    /// The running (unbiased) variance, initialised to ones.
    pub running_var: RunningState<Tensor<1>>,
    /// Weight of the new batch statistics in the running update (PyTorch's default 0.1).
    pub momentum: f64,
    /// Added to the variance before the square root (PyTorch's default 1e-5).
    pub epsilon: f64,
}

impl BatchNorm2d {
    /// A layer over `channels` channels with PyTorch's initial values.
    pub fn new(channels: usize, device: &Device) -> Self {
        Self::from_values(
            &vec![1.0; channels],
            &vec![0.0; channels],
            &vec![0.0; channels],
            &vec![1.0; channels],
            device,
        )
    }

    /// A layer with the given weight (gamma), bias (beta), running mean and running variance,
    /// all of the same length (the channel count).
    pub fn from_values(
        gamma: &[f32],
        beta: &[f32],
        running_mean: &[f32],
        running_var: &[f32],
        device: &Device,
    ) -> Self {
        let t = |v: &[f32]| {
            Tensor::<1>::from_data(burn::tensor::TensorData::new(v.to_vec(), [v.len()]), device)
        };
        Self {
            gamma: Param::from_tensor(t(gamma)),
            beta: Param::from_tensor(t(beta)),
            training: Param::from_bool(true),
            running_mean: RunningState::new(t(running_mean)),
            running_var: RunningState::new(t(running_var)),
            momentum: 0.1,
            epsilon: 1e-5,
        }
    }

    /// Normalizes `[batch, channels, height, width]`.
    pub fn forward(&self, input: Tensor<4>) -> Tensor<4> {
        if input.device().is_autodiff() && self.training.is_enabled() {
            self.forward_train(input)
        } else {
            let device = input.device();
            burn::tensor::module::batch_norm(
                input,
                self.gamma.val(),
                self.beta.val(),
                self.running_mean.value().to_device(&device),
                self.running_var.value().to_device(&device),
                self.epsilon,
            )
        }
    }

    fn forward_train(&self, input: Tensor<4>) -> Tensor<4> {
        let [batch, _, height, width] = input.dims();
        let n = (batch * height * width) as f64;
        let device = input.device();
        let result = burn::tensor::module::batch_norm_train(
            input,
            self.gamma.val(),
            self.beta.val(),
            self.epsilon,
        );
        // PyTorch's unbiased correction. PyTorch refuses a training batch of one value per
        // channel; here such a batch keeps the (zero) biased variance.
        let correction = if n > 1.0 { n / (n - 1.0) } else { 1.0 };
        let running_mean = self.running_mean.value_sync().to_device(&device);
        let running_var = self.running_var.value_sync().to_device(&device);
        let m = self.momentum;
        self.running_mean.update(
            running_mean
                .mul_scalar(1.0 - m)
                .add(result.mean.detach().mul_scalar(m))
                .detach(),
        );
        self.running_var.update(
            running_var
                .mul_scalar(1.0 - m)
                .add(result.variance.detach().mul_scalar(m * correction))
                .detach(),
        );
        result.output
    }
}
