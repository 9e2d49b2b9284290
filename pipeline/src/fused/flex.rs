//! The fused operations on burn's CPU backend: tensors in and out of the row kernels.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;

use super::rows::{self, for_row_blocks, rows_per_block};
use super::{FusedBackend, FusedKernels};
use crate::cpu::{contiguous, values};

/// A contiguous f32 tensor of `shape` holding `data`.
fn tensor(data: Vec<f32>, shape: Vec<usize>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, shape))
}

/// The last dimension of `t` (1 for a scalar).
fn last_dim(t: &FlexTensor) -> usize {
    t.layout().shape().as_slice().last().copied().unwrap_or(1)
}

/// The targets as i64, whatever integer type they are stored in.
fn targets_i64(targets: FlexTensor) -> Vec<i64> {
    targets.into_data().iter::<i64>().collect()
}

impl FusedKernels for Flex {
    fn layer_norm_forward(
        x: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f64,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        let shape = x.layout().shape().to_vec();
        let (x, gamma, beta) = (values(&x), values(&gamma), values(&beta));
        let d = gamma.len();
        let n = x.len() / d.max(1);
        let (mut y, mut mean, mut rstd) = (vec![0.0; x.len()], vec![0.0; n], vec![0.0; n]);
        // One task per block of rows: the output rows with their statistics.
        let per = rows_per_block(d);
        {
            use rayon::prelude::*;
            y.par_chunks_mut(per * d.max(1))
                .zip(mean.par_chunks_mut(per))
                .zip(rstd.par_chunks_mut(per))
                .enumerate()
                .for_each(|(b, ((y, mean), rstd))| {
                    let x = &x[b * per * d..b * per * d + y.len()];
                    rows::layer_norm_forward(x, &gamma, &beta, eps as f32, y, mean, rstd);
                });
        }
        (
            tensor(y, shape),
            tensor(mean, vec![n]),
            tensor(rstd, vec![n]),
        )
    }

    fn layer_norm_backward(
        x: FlexTensor,
        gamma: FlexTensor,
        mean: FlexTensor,
        rstd: FlexTensor,
        grad: FlexTensor,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        use rayon::prelude::*;
        let (x, gamma, mean, rstd) = (values(&x), values(&gamma), values(&mean), values(&rstd));
        let d = gamma.len();
        let (mut out, range) = contiguous(grad);
        let dx = &mut out.storage_mut::<f32>()[range];
        let per = rows_per_block(d);
        // Each block's parameter-gradient sums, then their sum in block order.
        let partial: Vec<(Vec<f32>, Vec<f32>)> = dx
            .par_chunks_mut(per * d.max(1))
            .enumerate()
            .map(|(b, g)| {
                let rows = g.len() / d.max(1);
                let x = &x[b * per * d..b * per * d + g.len()];
                let (mean, rstd) = (
                    &mean[b * per..b * per + rows],
                    &rstd[b * per..b * per + rows],
                );
                let (mut dg, mut db) = (vec![0.0; d], vec![0.0; d]);
                rows::layer_norm_backward(x, &gamma, mean, rstd, g, &mut dg, &mut db);
                (dg, db)
            })
            .collect();
        let (mut dgamma, mut dbeta) = (vec![0.0f32; d], vec![0.0f32; d]);
        for (dg, db) in &partial {
            for (acc, v) in dgamma.iter_mut().zip(dg) {
                *acc += v;
            }
            for (acc, v) in dbeta.iter_mut().zip(db) {
                *acc += v;
            }
        }
        (out, tensor(dgamma, vec![d]), tensor(dbeta, vec![d]))
    }

    fn causal_softmax_forward(scores: FlexTensor, scale: f64) -> FlexTensor {
        let t = last_dim(&scores);
        let (mut p, range) = contiguous(scores);
        for_row_blocks(&mut p.storage_mut::<f32>()[range], t, |first, block| {
            rows::causal_softmax_forward(block, t, first, scale as f32)
        });
        p
    }

    fn causal_softmax_backward(p: FlexTensor, grad: FlexTensor, scale: f64) -> FlexTensor {
        let t = last_dim(&p);
        let p = values(&p);
        let (mut g, range) = contiguous(grad);
        for_row_blocks(&mut g.storage_mut::<f32>()[range], t, |first, block| {
            let p = &p[first * t..first * t + block.len()];
            rows::causal_softmax_backward(p, block, t, first, scale as f32)
        });
        g
    }

    fn cross_entropy_forward(logits: FlexTensor, targets: FlexTensor) -> FlexTensor {
        let v = last_dim(&logits);
        let logits = values(&logits);
        let targets = targets_i64(targets);
        if v == 0 {
            // No class to be right about: no loss is defined (PyTorch refuses the call).
            return tensor(vec![f32::NAN], vec![1]);
        }
        let mut loss = vec![0.0f32; targets.len()];
        {
            use rayon::prelude::*;
            let per = rows_per_block(v);
            loss.par_chunks_mut(per)
                .zip(targets.par_chunks(per))
                .enumerate()
                .for_each(|(b, (loss, targets))| {
                    let logits = &logits[b * per * v..(b * per + loss.len()) * v];
                    rows::cross_entropy_forward(logits, v, targets, loss);
                });
        }
        // The mean in f64: one rounding for the whole batch.
        let n = loss.len().max(1) as f64;
        let mean = loss.iter().map(|&l| f64::from(l)).sum::<f64>() / n;
        tensor(vec![mean as f32], vec![1])
    }

    fn cross_entropy_backward(
        logits: FlexTensor,
        targets: FlexTensor,
        grad: FlexTensor,
    ) -> FlexTensor {
        let v = last_dim(&logits);
        let (mut g, range) = contiguous(logits);
        let targets = targets_i64(targets);
        let n = targets.len().max(1);
        let scale = values(&grad).first().copied().unwrap_or(0.0) / n as f32;
        for_row_blocks(&mut g.storage_mut::<f32>()[range], v, |first, block| {
            let rows = block.len() / v.max(1);
            rows::cross_entropy_backward(block, v, &targets[first..first + rows], scale)
        });
        g
    }
}

/// Without autodiff (evaluation, `model.valid()`): the kernels' outputs.
impl FusedBackend for Flex {
    fn fused_layer_norm(
        x: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f64,
    ) -> FlexTensor {
        Self::layer_norm_forward(x, gamma, beta, eps).0
    }

    fn fused_causal_softmax(scores: FlexTensor, scale: f64) -> FlexTensor {
        Self::causal_softmax_forward(scores, scale)
    }

    fn fused_cross_entropy(logits: FlexTensor, targets: FlexTensor) -> FlexTensor {
        Self::cross_entropy_forward(logits, targets)
    }
}
