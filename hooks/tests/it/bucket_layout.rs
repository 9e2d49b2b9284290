//! Bucket plans: formed in reverse traversal order, whole parameters, byte caps (1 MiB first / 25 MiB rest
//! by default), the last-bucket flag, frozen parameters left out, and what the hook sees.

use burn::module::{Module, Param, ParamId};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use localsgd_hooks::{
    BucketCaps, BucketData, BucketPlan, CommHook, GradBucket, GradientReducer, HookError, HookState,
};

#[derive(Module, Debug)]
struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

/// fc1: 8 -> 16 (weight 128, bias 16 elements), fc2: 16 -> 4 (weight 64, bias 4).
fn mlp(device: &Device) -> Mlp {
    Mlp {
        fc1: LinearConfig::new(8, 16).init(device),
        fc2: LinearConfig::new(16, 4).init(device),
    }
}

fn bucket_indexes(plan: &BucketPlan) -> Vec<Vec<usize>> {
    plan.buckets
        .iter()
        .map(|b| b.params.iter().map(|p| p.index).collect())
        .collect()
}

#[test]
fn default_caps_are_pytorch_ddp_defaults() {
    let caps = BucketCaps::default();
    assert_eq!(caps.first_bytes, 1024 * 1024);
    assert_eq!(caps.rest_bytes, 25 * 1024 * 1024);
}

#[test]
fn small_model_fits_one_bucket() {
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let mut reducer = GradientReducer::new(BucketCaps::default());
    let plan = reducer.plan(&model);
    assert_eq!(bucket_indexes(plan), vec![vec![0, 1, 2, 3]]);
    assert_eq!(plan.buckets[0].len, 4 + 64 + 16 + 128);
    assert_eq!(plan.buckets[0].bytes, 4 * 212);
    let offsets: Vec<usize> = plan.buckets[0]
        .params
        .iter()
        .map(|p| p.bucket_offset)
        .collect();
    assert_eq!(offsets, vec![0, 128, 144, 208]);
}

#[test]
fn caps_cut_at_parameter_boundaries_first_cap_then_rest() {
    // Bytes in reverse order: fc2.bias 16, fc2.weight 256, fc1.bias 64, fc1.weight 512.
    // First cap 300: 16 + 256 = 272 fits, + 64 would not. Rest cap 400: 64 fits, + 512 would
    // not; fc1.weight (512 > 400) gets a bucket of its own.
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let mut reducer = GradientReducer::new(BucketCaps {
        first_bytes: 300,
        rest_bytes: 400,
    });
    let plan = reducer.plan(&model);
    assert_eq!(bucket_indexes(plan), vec![vec![2, 3], vec![1], vec![0]]);
    // Each bucket is one contiguous range of the traversal-order flat gradient.
    let starts: Vec<usize> = plan.buckets.iter().map(|b| b.flat_offset).collect();
    assert_eq!(starts, vec![144, 128, 0]);
    let lens: Vec<usize> = plan.buckets.iter().map(|b| b.len).collect();
    assert_eq!(lens, vec![68, 16, 128]);
}

#[test]
fn first_cap_applies_only_to_the_first_bucket() {
    // Sizes in elements, f32: traversal [a: 10, b: 10, c: 10, d: 10] -> 40 bytes each.
    let plan = BucketPlan::new(
        vec![(0, 10), (1, 10), (2, 10), (3, 10)],
        4,
        BucketCaps {
            first_bytes: 40,
            rest_bytes: 80,
        },
    );
    assert_eq!(bucket_indexes(&plan), vec![vec![3], vec![1, 2], vec![0]]);
    // Flat offsets refer to the traversal-order flat buffer.
    let flat: Vec<Vec<usize>> = plan
        .buckets
        .iter()
        .map(|b| b.params.iter().map(|p| p.flat_offset).collect())
        .collect();
    assert_eq!(flat, vec![vec![30], vec![10, 20], vec![0]]);
    // f64 elements are 8 bytes: every parameter (80 bytes) exceeds the first cap alone.
    let wide = BucketPlan::new(
        vec![(0, 10), (1, 10), (2, 10)],
        8,
        BucketCaps {
            first_bytes: 40,
            rest_bytes: 160,
        },
    );
    assert_eq!(bucket_indexes(&wide), vec![vec![2], vec![0, 1]]);
}

#[test]
fn frozen_parameters_are_not_in_the_layout_and_the_plan_follows_changes() {
    let device = Device::flex().autodiff();
    let mut model = mlp(&device);
    let mut reducer = GradientReducer::default();
    assert_eq!(reducer.plan(&model).params.len(), 4);
    model.fc1 = model.fc1.no_grad();
    let plan = reducer.plan(&model);
    assert_eq!(plan.params, vec![(2, 64), (3, 4)]);
    assert_eq!(bucket_indexes(plan), vec![vec![2, 3]]);
}

/// Records what the reducer hands to a hook and leaves the bucket unchanged.
#[derive(Debug, Default)]
struct Recorder {
    seen: Vec<GradBucket>,
}

impl CommHook for Recorder {
    fn run(&mut self, bucket: &mut GradBucket) -> Result<(), HookError> {
        self.seen.push(bucket.clone());
        Ok(())
    }
    fn state(&self) -> HookState {
        HookState::AllReduce
    }
    fn load_state(&mut self, _: &HookState) -> Result<(), HookError> {
        Ok(())
    }
}

fn grads_with(model: &Mlp, values: [Option<f32>; 4]) -> GradientsParams {
    let mut grads = GradientsParams::new();
    let device = model.fc1.weight.val().device();
    let mut put2 = |p: &Param<Tensor<2>>, v: Option<f32>| {
        if let Some(v) = v {
            grads.register::<2>(p.id, Tensor::<2>::full(p.val().shape(), v, &device));
        }
    };
    put2(&model.fc1.weight, values[0]);
    put2(&model.fc2.weight, values[2]);
    let mut put1 = |id: ParamId, len: usize, v: Option<f32>| {
        if let Some(v) = v {
            grads.register::<1>(id, Tensor::<1>::full([len], v, &device));
        }
    };
    put1(model.fc1.bias.as_ref().unwrap().id, 16, values[1]);
    put1(model.fc2.bias.as_ref().unwrap().id, 4, values[3]);
    grads
}

#[test]
fn hook_sees_buckets_in_order_with_last_flag_and_their_contents() {
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let mut reducer = GradientReducer::new(BucketCaps {
        first_bytes: 300,
        rest_bytes: 400,
    });
    // fc1.bias has no gradient: it still occupies its place, as zeros.
    let grads = grads_with(&model, [Some(1.0), None, Some(3.0), Some(4.0)]);
    let mut hook = Recorder::default();
    let out = reducer.reduce(&model, grads, &mut hook).unwrap();
    let seen: Vec<(usize, bool, usize)> = hook
        .seen
        .iter()
        .map(|b| (b.index(), b.is_last(), b.len()))
        .collect();
    assert_eq!(seen, vec![(0, false, 68), (1, false, 16), (2, true, 128)]);
    let mut first = vec![3.0f32; 64];
    first.extend([4.0; 4]);
    assert_eq!(hook.seen[0].data(), &BucketData::F32(first));
    assert_eq!(hook.seen[1].data(), &BucketData::F32(vec![0.0; 16]));
    assert_eq!(hook.seen[2].data(), &BucketData::F32(vec![1.0; 128]));
    let params: Vec<(usize, usize, usize)> = hook.seen[0]
        .params()
        .iter()
        .map(|p| (p.index, p.offset, p.len))
        .collect();
    assert_eq!(params, vec![(2, 0, 64), (3, 64, 4)]);
    // Every trainable parameter comes back with a gradient, the unused one as zeros.
    assert_eq!(out.len(), 4);
    let b1: Tensor<1> = out.get(model.fc1.bias.as_ref().unwrap().id).unwrap();
    assert_eq!(b1.into_data().try_into_vec::<f32>().unwrap(), vec![0.0; 16]);
    let w2: Tensor<2> = out.get(model.fc2.weight.id).unwrap();
    assert_eq!(w2.into_data().try_into_vec::<f32>().unwrap(), vec![3.0; 64]);
}

/// A broken hook that drops an element.
#[derive(Debug)]
struct Truncate;

impl CommHook for Truncate {
    fn run(&mut self, bucket: &mut GradBucket) -> Result<(), HookError> {
        if let BucketData::F32(v) = bucket.data_mut() {
            v.pop();
        }
        Ok(())
    }
    fn state(&self) -> HookState {
        HookState::AllReduce
    }
    fn load_state(&mut self, _: &HookState) -> Result<(), HookError> {
        Ok(())
    }
}

#[test]
fn a_hook_that_changes_the_bucket_length_is_an_error() {
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let grads = grads_with(&model, [Some(1.0); 4]);
    let err = GradientReducer::default()
        .reduce(&model, grads, &mut Truncate)
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("211") && msg.contains("212"), "{msg}");
}
