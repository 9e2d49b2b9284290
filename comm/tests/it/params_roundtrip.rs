//! Flatten -> write-back on a real burn MLP preserves values, ParamIds and require_grad, and the
//! gradients of a selection come back as GradientsParams.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, SgdConfig};
use burn::prelude::*;
use localsgd_comm::params::{
    FlatBuffer, FlatLayout, ParamSelection, flatten_grads, flatten_params, grads_from_flat,
    write_params,
};

#[derive(Module, Debug)]
struct Mlp {
    fc1: Linear,
    act: Relu,
    fc2: Linear,
}

fn mlp(device: &Device) -> Mlp {
    Mlp {
        fc1: LinearConfig::new(6, 4).init(device),
        act: Relu::new(),
        fc2: LinearConfig::new(4, 3).init(device),
    }
}

struct Ids(Vec<(ParamId, bool)>);
impl ModuleVisitor for Ids {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        self.0.push((p.id, p.val().is_require_grad()));
    }
}

/// An MLP on the autodiff device and the gradients of the sum of its outputs on a batch of ones.
fn mlp_with_grads() -> (Mlp, GradientsParams) {
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let x = Tensor::<2>::ones([2, 6], &device);
    let loss = model
        .fc2
        .forward(model.act.forward(model.fc1.forward(x)))
        .sum();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    (model, grads)
}

fn ids(m: &Mlp) -> Vec<(ParamId, bool)> {
    let mut v = Ids(Vec::new());
    m.visit(&mut v);
    v.0
}

#[test]
fn roundtrip_preserves_values_ids_and_require_grad() {
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let before = ids(&model);
    let flat = flatten_params(&model, &ParamSelection::All).unwrap();
    // 6*4 + 4 + 4*3 + 3 elements, in traversal order fc1.weight, fc1.bias, fc2.weight, fc2.bias.
    assert_eq!(flat.layout.total, 24 + 4 + 12 + 3);
    assert_eq!(
        flat.layout
            .entries
            .iter()
            .map(|e| e.offset)
            .collect::<Vec<_>>(),
        vec![0, 24, 28, 40]
    );
    let FlatBuffer::F32(values) = &flat.buffer else {
        panic!("f32 model flattened to {:?}", flat.buffer)
    };
    let w1: Vec<f32> = model.fc1.weight.val().into_data().try_into_vec().unwrap();
    assert_eq!(&values[..24], &w1[..]);

    // Write back modified values: +1 everywhere.
    let mut changed = flat.clone();
    if let FlatBuffer::F32(v) = &mut changed.buffer {
        v.iter_mut().for_each(|x| *x += 1.0);
    }
    let model2 = write_params(model, &changed).unwrap();
    assert_eq!(ids(&model2), before, "ParamIds and require_grad survive");
    let again = flatten_params(&model2, &ParamSelection::All).unwrap();
    assert_eq!(again.buffer, changed.buffer);
}

#[test]
fn selection_writes_only_selected_params_and_grads_roundtrip() {
    let (model, grads) = mlp_with_grads();
    let sel = ParamSelection::with_grads(&model, &grads);
    let g = flatten_grads(&model, &grads, &sel).unwrap();
    assert_eq!(g.layout.total, 43);
    let back = grads_from_flat(&model, &g).unwrap();
    assert_eq!(back.len(), 4);
    let b2: Tensor<1> = back.get(model.fc2.bias.as_ref().unwrap().id).unwrap();
    // d(sum)/d(bias2) = batch size = 2 for every output.
    assert_eq!(b2.into_data().try_into_vec::<f32>().unwrap(), vec![2.0; 3]);

    // Only fc2.bias selected: fc1 untouched.
    let bias_id = model.fc2.bias.as_ref().unwrap().id;
    let sel = ParamSelection::ids([bias_id]);
    let mut flat = flatten_params(&model, &sel).unwrap();
    assert_eq!(flat.layout.entries.len(), 1);
    assert_eq!(flat.layout.entries[0].index, 3);
    if let FlatBuffer::F32(v) = &mut flat.buffer {
        v.iter_mut().for_each(|x| *x = 42.0);
    }
    let w1_before: Vec<f32> = model.fc1.weight.val().into_data().try_into_vec().unwrap();
    let model = write_params(model, &flat).unwrap();
    let w1_after: Vec<f32> = model.fc1.weight.val().into_data().try_into_vec().unwrap();
    assert_eq!(w1_before, w1_after);
    let b: Vec<f32> = model
        .fc2
        .bias
        .as_ref()
        .unwrap()
        .val()
        .into_data()
        .try_into_vec()
        .unwrap();
    assert_eq!(b, vec![42.0; 3]);
}

#[test]
fn missing_gradient_contributes_zeros_and_layouts_agree() {
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let mut grads = GradientsParams::new();
    grads.register::<1>(
        model.fc2.bias.as_ref().unwrap().id,
        Tensor::<1>::ones([3], &device),
    );
    let g = flatten_grads(&model, &grads, &ParamSelection::All).unwrap();
    let FlatBuffer::F32(v) = g.buffer else {
        panic!()
    };
    assert_eq!(v.len(), 43);
    assert!(v[..40].iter().all(|&x| x == 0.0));
    assert_eq!(&v[40..], &[1.0, 1.0, 1.0]);
    // Same layout fingerprint as a fresh model of the same type (ParamIds differ).
    let other = mlp(&device);
    assert_eq!(
        FlatLayout::of(&model, &ParamSelection::All).fingerprint(),
        FlatLayout::of(&other, &ParamSelection::All).fingerprint()
    );
}

#[test]
fn f64_parameters_flatten_as_f64() {
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let model = model.map(&mut F64Cast);
    let flat = flatten_params(&model, &ParamSelection::All).unwrap();
    assert!(matches!(flat.buffer, FlatBuffer::F64(_)));
    let model = write_params(model, &flat).unwrap();
    assert_eq!(model.fc1.weight.val().dtype(), burn::tensor::DType::F64);
}

struct F64Cast;
impl burn::module::ModuleMapper for F64Cast {
    fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
        p.map(|t| t.cast(burn::tensor::DType::F64))
    }
}

#[test]
fn write_back_with_wrong_layout_is_an_error() {
    let device = Device::flex().autodiff();
    let model = mlp(&device);
    let mut flat = flatten_params(&model, &ParamSelection::All).unwrap();
    flat.buffer = FlatBuffer::F32(vec![0.0; 3]);
    let err = write_params(model, &flat).unwrap_err();
    assert!(err.to_string().contains("43"), "{err}");
}

/// Gradients written back from a flat buffer sit where `backward` puts them: on the parameters'
/// device without autodiff. On the autodiff device, the optimizer's momentum became an autodiff
/// tensor for good and every later step paid autodiff dispatch (post-local SGD stayed about 50%
/// slower per step after its gradient warmup; DDP paid it every step).
#[test]
fn gradients_come_back_on_the_device_backward_uses() {
    let (model, grads) = mlp_with_grads();
    let reference: Tensor<2> = grads.get(model.fc1.weight.id).unwrap();
    assert!(
        !reference.is_autodiff(),
        "burn's own gradients are outside autodiff"
    );
    let flat = flatten_grads(&model, &grads, &ParamSelection::All).unwrap();
    let back = grads_from_flat(&model, &flat).unwrap();
    let w1: Tensor<2> = back.get(model.fc1.weight.id).unwrap();
    let b2: Tensor<1> = back.get(model.fc2.bias.as_ref().unwrap().id).unwrap();
    assert!(!w1.is_autodiff() && !b2.is_autodiff());
    // An optimizer with momentum steps the model with them; its parameters stay trainable
    // autodiff parameters (burn's device equality ignores autodiff, so nothing is moved).
    let mut optim = SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new()))
        .init();
    let model = optim.step(0.1, model, back);
    let w1 = model.fc1.weight.val();
    assert!(w1.is_autodiff() && w1.is_require_grad());
}
