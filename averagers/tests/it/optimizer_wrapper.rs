//! V16: a loop that averages after the optimizer step equals the same loop written with an
//! "averaging optimizer" wrapper (PyTorch's `PostLocalSGDOptimizer`: inner step, then exactly one
//! averager call), in parameters and in step counters.

use crate::common;

use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::prelude::*;
use common::*;
use localsgd_averagers::comm::{Group, ThreadWorld};
use localsgd_averagers::{
    AverageParameters, AveragerError, HierarchicalModelAverager, ModelAverager, ParamSelection,
    PeriodicModelAverager,
};

/// `PostLocalSGDOptimizer`: `step()` = inner optimizer step, then one averager call with the
/// parameters that had gradients.
struct AveragingOptimizer {
    inner: ModuleOptimizer,
    averager: Box<dyn ModelAverager>,
}

impl AveragingOptimizer {
    fn step<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        grads: GradientsParams,
    ) -> Result<M, AveragerError> {
        let selection = ParamSelection::with_grads(&module, &grads);
        let module = self.inner.step(lr, module, grads);
        self.averager.average_parameters(module, &selection)
    }
}

fn sgd() -> ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig {
            momentum: 0.9,
            dampening: 0.0,
            nesterov: false,
        }))
        .init()
}

fn batch(rank: usize, step: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let x =
        Tensor::<2>::ones([4, 4], device).mul_scalar((rank + 1) as f32 * 0.1 + step as f32 * 0.01);
    let y = Tensor::<2>::ones([4, 2], device).mul_scalar(rank as f32);
    (x, y)
}

fn grads_of(model: &Mlp, rank: usize, step: usize, device: &Device) -> GradientsParams {
    let (x, y) = batch(rank, step, device);
    let loss = MseLoss::new().forward(model.forward(x), y, Reduction::Mean);
    GradientsParams::from_grads(loss.backward(), model)
}

/// Runs both loops on 4 ranks; returns each rank's final parameters after checking that both
/// loops agree.
fn compare(make: impl Fn(Group) -> Box<dyn ModelAverager> + Sync) -> Vec<Vec<Vec<f64>>> {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex().autodiff();
            let rank = world.rank();
            let init = Mlp::new(&device);

            // (1) The loop averages after the optimizer step.
            let mut model = init.clone();
            let mut optim = sgd();
            let mut averager = make(world.clone());
            for step in 0..20 {
                let grads = grads_of(&model, rank, step, &device);
                let selection = ParamSelection::with_grads(&model, &grads);
                model = optim.step(0.05, model, grads);
                model = averager.average_parameters(model, &selection).unwrap();
            }

            // (2) The optimizer wrapper averages inside step().
            let mut wrapped_model = init;
            let mut wrapped = AveragingOptimizer {
                inner: sgd(),
                averager: make(world.clone()),
            };
            for step in 0..20 {
                let grads = grads_of(&wrapped_model, rank, step, &device);
                wrapped_model = wrapped.step(0.05, wrapped_model, grads).unwrap();
            }
            (
                param_values(&model),
                param_values(&wrapped_model),
                averager.state(),
                wrapped.averager.state(),
            )
        })
        .unwrap();
    out.into_iter()
        .map(|(after_step, wrapped, state, wrapped_state)| {
            assert_eq!(after_step, wrapped, "identical parameters");
            assert_eq!(state, wrapped_state, "identical step counters");
            assert_eq!(state.step, 20);
            after_step
        })
        .collect()
}

#[test]
fn v16_periodic_loop_equals_averaging_optimizer() {
    // Periodic(4, 3) averages at 3, 7, 11, 15, 19.
    let finals = compare(|g| Box::new(PeriodicModelAverager::new(4, 3, g).unwrap()));
    assert!(
        finals.iter().all(|f| f == &finals[0]),
        "step 19 averaged over the world"
    );
}

#[test]
fn v16_hierarchical_loop_equals_averaging_optimizer() {
    // Pairs every step, everyone every 4 steps: the last step (19) averages within pairs.
    let finals =
        compare(|g| Box::new(HierarchicalModelAverager::new(&[(1, 2), (4, 4)], 0, g).unwrap()));
    assert_eq!(finals[0], finals[1]);
    assert_eq!(finals[2], finals[3]);
    assert_ne!(finals[0], finals[2]);
}
