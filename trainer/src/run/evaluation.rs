//! Test-set evaluation, and the files of the final models.

use super::error::RunError;
use crate::config::TrainConfig;
use burn::tensor::Device;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_models::data::{Dataset, TrainTest};
use localsgd_models::network::{BatchEval, Network, Objective};
use localsgd_models::pytorch::save_pytorch_safetensors;
use localsgd_pipeline::pipeline::Pipeline;
use std::path::Path;

/// The file in the run directory that holds rank 0's final model as PyTorch safetensors
/// (names and layout of [`localsgd_models::pytorch`]; loads with `--init-weights` and with
/// `model.load_state_dict(safetensors.torch.load_file(...))` into the PyTorch twin).
pub const MODEL_FILE: &str = "model.safetensors";

/// A model's test accuracy and loss.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Evaluation {
    /// Fraction predicted correctly, in [0, 1]: samples for a classifier, next bytes for a
    /// language model.
    pub accuracy: f64,
    /// Mean cross-entropy in nats per prediction (per sample, or per byte for a language
    /// model; computed in f64 from the f32 logits).
    pub loss: f64,
}

impl Evaluation {
    /// The loss in bits per prediction (bits per byte for a language model).
    pub fn bits(&self) -> f64 {
        self.loss / std::f64::consts::LN_2
    }
}

/// Fraction of `data` the model predicts correctly, in evaluation mode (`Module::valid`:
/// no autodiff, batch normalization from its running statistics, which are left unchanged).
pub fn accuracy<M: Objective>(model: &M, data: &Dataset, device: &Device) -> Result<f64, RunError> {
    Ok(evaluate(model, data, device)?.accuracy)
}

/// [`accuracy`] and the mean cross-entropy of `data`, in one pass. An empty data set gives
/// zeros.
pub fn evaluate<M: Objective>(
    model: &M,
    data: &Dataset,
    device: &Device,
) -> Result<Evaluation, RunError> {
    if data.is_empty() {
        return Ok(Evaluation::default());
    }
    let model = model.valid();
    let indices: Vec<usize> = (0..data.len()).collect();
    let mut total = BatchEval::default();
    for chunk in indices.chunks(1024) {
        let (x, _) = data.batch_tensors(chunk, device)?;
        let labels: Vec<u32> = chunk.iter().map(|&i| data.labels()[i]).collect();
        let eval = model
            .batch_eval(x.inner(), &labels)
            .map_err(|message| RunError::Output {
                what: "evaluation".into(),
                message,
            })?;
        total.loss_sum += eval.loss_sum;
        total.correct += eval.correct;
        total.count += eval.count;
    }
    let n = total.count.max(1) as f64;
    Ok(Evaluation {
        accuracy: total.correct as f64 / n,
        loss: total.loss_sum / n,
    })
}

/// After training: rank 0's `model.safetensors`, the `export` file, this rank's own model and
/// the world average evaluated on the test set, and this rank's final parameters. Collective
/// (the world average).
pub(super) fn final_models(
    cfg: &TrainConfig,
    model: Network,
    pipeline: &Pipeline<Network>,
    run_dir: Option<&Path>,
    data: &TrainTest,
    device: &Device,
) -> Result<(Evaluation, Evaluation, FlatBuffer), RunError> {
    let rank = pipeline.group().rank();
    // Rank 0's own final model, in its PyTorch twin's state_dict layout.
    if let (0, Some(dir)) = (rank, run_dir) {
        save_pytorch_safetensors(&model, &dir.join(MODEL_FILE)).map_err(|e| RunError::Output {
            what: MODEL_FILE.into(),
            message: e.to_string(),
        })?;
    }
    // `export` with `export-rank`: that rank writes its own model (on its host's file system).
    if let Some(path) = &cfg.export
        && cfg.export_rank == Some(rank)
    {
        export_model(&model, path)?;
    }
    let local = evaluate(&model, &data.test, device)?;
    let params = flatten_params(&model, &ParamSelection::All)
        .map_err(RunError::Comm)?
        .buffer;
    let averaged = pipeline.world_average(model)?;
    // `export` alone: rank 0 writes the world average.
    if let Some(path) = &cfg.export
        && cfg.export_rank.is_none()
        && rank == 0
    {
        export_model(&averaged, path)?;
    }
    let world = evaluate(&averaged, &data.test, device)?;
    Ok((local, world, params))
}

/// Write `model` to the `export` file (PyTorch layout, atomically; [`crate::export`]).
fn export_model(model: &Network, path: &Path) -> Result<(), RunError> {
    save_pytorch_safetensors(model, path).map_err(|e| RunError::Output {
        what: "export".into(),
        message: e.to_string(),
    })
}
