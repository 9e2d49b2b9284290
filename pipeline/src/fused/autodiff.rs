//! Autodiff through the fused operations: each records one node whose backward pass is the
//! inner backend's kernel.

use burn::backend::Autodiff;
use burn::backend::Backend;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::tensor::{FloatTensor, IntTensor};

use super::{FusedBackend, FusedKernels};

impl<B: Backend + FusedKernels, C: CheckpointStrategy> FusedBackend for Autodiff<B, C> {
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        /// Keeps the input, `gamma` and the rows' statistics.
        #[derive(Debug)]
        struct LayerNormBackward;

        impl<B: Backend + FusedKernels> Backward<B, 3> for LayerNormBackward {
            type State = (
                B::FloatTensorPrimitive,
                B::FloatTensorPrimitive,
                B::FloatTensorPrimitive,
                B::FloatTensorPrimitive,
            );

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let [node_x, node_gamma, node_beta] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x, gamma, mean, rstd) = ops.state;
                let (dx, dgamma, dbeta) = B::layer_norm_backward(x, gamma, mean, rstd, grad);
                for (node, g) in [(node_x, dx), (node_gamma, dgamma), (node_beta, dbeta)] {
                    if let Some(node) = node {
                        grads.register::<B>(node.id, g);
                    }
                }
            }
        }

        match LayerNormBackward
            .prepare::<C>([x.node(), gamma.node(), beta.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (x, gamma) = (x.into_primitive(), gamma.into_primitive());
                let (y, mean, rstd) =
                    B::layer_norm_forward(x.clone(), gamma.clone(), beta.into_primitive(), eps);
                prep.finish((x, gamma, mean, rstd), y)
            }
            OpsKind::UnTracked(prep) => {
                let (x, gamma, beta) = (
                    x.into_primitive(),
                    gamma.into_primitive(),
                    beta.into_primitive(),
                );
                prep.finish(B::layer_norm_forward(x, gamma, beta, eps).0)
            }
        }
    }

    fn fused_causal_softmax(scores: FloatTensor<Self>, scale: f64) -> FloatTensor<Self> {
        /// Keeps the output (the backward pass needs nothing else).
        #[derive(Debug)]
        struct CausalSoftmaxBackward;

        impl<B: Backend + FusedKernels> Backward<B, 1> for CausalSoftmaxBackward {
            type State = (B::FloatTensorPrimitive, f64);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let (p, scale) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::causal_softmax_backward(p, grad, scale)
                });
            }
        }

        match CausalSoftmaxBackward
            .prepare::<C>([scores.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let p = B::causal_softmax_forward(scores.into_primitive(), scale);
                prep.finish((p.clone(), scale), p)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::causal_softmax_forward(scores.into_primitive(), scale))
            }
        }
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        /// Keeps the logits and the targets (the backward pass recomputes the softmax).
        #[derive(Debug)]
        struct CrossEntropyBackward;

        impl<B: Backend + FusedKernels> Backward<B, 1> for CrossEntropyBackward {
            type State = (B::FloatTensorPrimitive, B::IntTensorPrimitive);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let (logits, targets) = ops.state;
                unary::<B, _>(ops.parents, ops.node, grads, |grad| {
                    B::cross_entropy_backward(logits, targets, grad)
                });
            }
        }

        match CrossEntropyBackward
            .prepare::<C>([logits.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let logits = logits.into_primitive();
                let loss = B::cross_entropy_forward(logits.clone(), targets.clone());
                prep.finish((logits, targets), loss)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::cross_entropy_forward(logits.into_primitive(), targets))
            }
        }
    }
}
