//! Ranks whose backward passes touched different parameters still agree on the bucket layout:
//! a trainable parameter without a local gradient contributes zeros.

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use localsgd_comm::{Group, ThreadWorld};
use localsgd_hooks::{AllReduceHook, BucketCaps, GradientReducer};

#[derive(Module, Debug)]
struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

fn values(p: &Param<Tensor<2>>, grads: &GradientsParams) -> Vec<f32> {
    grads
        .get::<2>(p.id)
        .unwrap()
        .into_data()
        .try_into_vec::<f32>()
        .unwrap()
}

#[test]
fn ranks_with_different_unused_parameters_agree() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| {
            let rank = world.rank();
            let device = Device::flex().autodiff();
            let model = Mlp {
                fc1: LinearConfig::new(8, 16).init(&device),
                fc2: LinearConfig::new(16, 4).init(&device),
            };
            // Which of fc1.weight, fc1.bias, fc2.weight, fc2.bias got a gradient on this rank.
            let used = [
                [true, true, true, true],
                [false, false, true, true],
                [true, false, false, false],
                [false, false, false, false],
            ][rank];
            let value = (rank + 1) as f32;
            let mut grads = GradientsParams::new();
            let ws = [&model.fc1.weight, &model.fc2.weight];
            for (p, u) in ws.into_iter().zip([used[0], used[2]]) {
                if u {
                    grads.register::<2>(p.id, Tensor::full(p.val().shape(), value, &device));
                }
            }
            let bs = [&model.fc1.bias, &model.fc2.bias];
            for (p, u) in bs.into_iter().zip([used[1], used[3]]) {
                let p = p.as_ref().unwrap();
                if u {
                    grads.register::<1>(p.id, Tensor::full(p.val().shape(), value, &device));
                }
            }
            let mut reducer = GradientReducer::new(BucketCaps {
                first_bytes: 100,
                rest_bytes: 100,
            });
            let plan = reducer.plan(&model).clone();
            let mut hook = AllReduceHook::new(world.clone());
            let out = reducer.reduce(&model, grads, &mut hook).unwrap();
            let b1: Tensor<1> = out.get(model.fc1.bias.as_ref().unwrap().id).unwrap();
            let b2: Tensor<1> = out.get(model.fc2.bias.as_ref().unwrap().id).unwrap();
            (
                plan,
                out.len(),
                values(&model.fc1.weight, &out),
                b1.into_data().try_into_vec::<f32>().unwrap(),
                values(&model.fc2.weight, &out),
                b2.into_data().try_into_vec::<f32>().unwrap(),
            )
        })
        .unwrap();
    let plan0 = out[0].0.clone();
    assert!(plan0.len() >= 3);
    for (plan, n, w1, b1, w2, b2) in out {
        assert_eq!(plan, plan0);
        assert_eq!(n, 4);
        // Means over 4 ranks with zeros where a rank had no gradient:
        // fc1.weight: ranks 0 (1) and 2 (3) -> 1.0; fc1.bias: rank 0 -> 0.25;
        // fc2.*: ranks 0 (1) and 1 (2) -> 0.75.
        assert_eq!(w1, vec![1.0; 128]);
        assert_eq!(b1, vec![0.25; 16]);
        assert_eq!(w2, vec![0.75; 64]);
        assert_eq!(b2, vec![0.75; 4]);
    }
}

/// One rank: the mean is the identity. With every gradient present the reducer hands them on
/// untouched and issues no collective; a parameter without a gradient still gets zeros, as it
/// would on more ranks.
#[test]
fn one_rank_passes_gradients_through_and_fills_missing_ones_with_zeros() {
    let out = ThreadWorld::new(1)
        .unwrap()
        .run(|world: Group| {
            let device = Device::flex().autodiff();
            let model = Mlp {
                fc1: LinearConfig::new(8, 16).init(&device),
                fc2: LinearConfig::new(16, 4).init(&device),
            };
            let grads_with = |all: bool| {
                let mut grads = GradientsParams::new();
                grads.register::<2>(model.fc1.weight.id, Tensor::full([8, 16], 1.5, &device));
                grads.register::<2>(model.fc2.weight.id, Tensor::full([16, 4], -0.25, &device));
                grads.register::<1>(
                    model.fc2.bias.as_ref().unwrap().id,
                    Tensor::full([4], 3.0, &device),
                );
                if all {
                    grads.register::<1>(
                        model.fc1.bias.as_ref().unwrap().id,
                        Tensor::full([16], 0.1, &device),
                    );
                }
                grads
            };
            let mut reducer = GradientReducer::new(BucketCaps {
                first_bytes: 100,
                rest_bytes: 100,
            });
            let mut hook = AllReduceHook::new(world.clone());
            let mut seen = Vec::new();
            for all in [true, false] {
                let before = world.traffic().collectives;
                let out = reducer.reduce(&model, grads_with(all), &mut hook).unwrap();
                let b1: Tensor<1> = out.get(model.fc1.bias.as_ref().unwrap().id).unwrap();
                let b2: Tensor<1> = out.get(model.fc2.bias.as_ref().unwrap().id).unwrap();
                seen.push((
                    world.traffic().collectives - before,
                    values(&model.fc1.weight, &out),
                    b1.into_data().try_into_vec::<f32>().unwrap(),
                    values(&model.fc2.weight, &out),
                    b2.into_data().try_into_vec::<f32>().unwrap(),
                ));
            }
            seen
        })
        .unwrap();
    let [present, missing] = <[_; 2]>::try_from(out.into_iter().next().unwrap()).unwrap();
    assert_eq!(present.0, 0, "no collective for the identity");
    assert_eq!(present.1, vec![1.5; 128]);
    assert_eq!(present.2, vec![0.1f32; 16]);
    assert_eq!(present.3, vec![-0.25; 64]);
    assert_eq!(present.4, vec![3.0; 4]);
    // fc1.bias had no gradient: zeros; the others are their own mean.
    assert!(missing.0 > 0, "the flat path runs the bucket collectives");
    assert_eq!(missing.1, vec![1.5; 128]);
    assert_eq!(missing.2, vec![0.0; 16]);
    assert_eq!(missing.3, vec![-0.25; 64]);
    assert_eq!(missing.4, vec![3.0; 4]);
}
