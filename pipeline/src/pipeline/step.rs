//! How a batch becomes a loss and gradients: the forward/backward phase's one override point.

use burn::optim::GradientsParams;
use burn::tensor::Tensor;

use super::source::SourceError;

/// Which micro-batch of an optimizer step a forward/backward pass computes (gradient
/// accumulation: `count` micro-batches per step, `index` from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MicroBatch {
    /// This micro-batch's place in the step, from 0.
    pub index: usize,
    /// Micro-batches per optimizer step (1: no accumulation).
    pub count: usize,
}

/// What one forward/backward pass produced.
#[derive(Debug)]
pub struct StepOutput {
    /// The loss on the micro-batch, unscaled, when the step can tell it (reports and metrics;
    /// the iteration's loss is the mean over its micro-batches).
    pub loss: Option<f32>,
    /// The gradients of this micro-batch. The pipeline sums them over an optimizer step's
    /// micro-batches: a step that wants PyTorch's mean scales its loss by `1 / count` before
    /// `backward` (as [`LossFn`] does).
    pub grads: GradientsParams,
}

/// The forward/backward phase of an iteration: one micro-batch in, its loss and gradients
/// out. The pipeline calls it once per micro-batch and never communicates inside it.
///
/// [`Pipeline::run_iteration`](super::Pipeline::run_iteration) takes a loss closure (wrapped
/// in [`LossFn`]); implement this trait when the step is more than a loss: burn-train's
/// `TrainStep` (the `localsgd-learner` strategy keeps each item's output for burn-train's
/// metrics), a step that records extra outputs, or one with its own accumulation rule.
pub trait ForwardBackward<M, B> {
    /// Forward and backward pass of `model` on `batch`, micro-batch `micro` of its step. An
    /// error stops the iteration on this rank ([`PipelineError::Data`](super::PipelineError)).
    fn forward_backward(
        &mut self,
        model: &M,
        batch: B,
        micro: MicroBatch,
    ) -> Result<StepOutput, SourceError>;
}

/// A loss closure as a [`ForwardBackward`] step: `loss_fn(model, batch)` is the mean loss of
/// the batch; with gradient accumulation each micro-batch's loss is divided by the number of
/// micro-batches before `backward`, so the summed gradients are their mean (PyTorch's usual
/// accumulation loop).
pub struct LossFn<'a, M, B>(pub &'a dyn Fn(&M, &B) -> Tensor<1>);

impl<M: burn::module::Module, B> ForwardBackward<M, B> for LossFn<'_, M, B> {
    fn forward_backward(
        &mut self,
        model: &M,
        batch: B,
        micro: MicroBatch,
    ) -> Result<StepOutput, SourceError> {
        let loss = (self.0)(model, &batch);
        let value = loss.clone().into_scalar::<f32>();
        let loss = if micro.count > 1 {
            loss / micro.count as f32
        } else {
            loss
        };
        Ok(StepOutput {
            loss: Some(value),
            grads: GradientsParams::from_grads(loss.backward(), model),
        })
    }
}
