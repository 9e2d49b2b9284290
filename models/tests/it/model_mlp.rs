//! `Mlp` construction: seeded PyTorch-default initialization, shapes and the forward pass.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor, TensorData};
use localsgd_models::mlp::{MlpConfig, ModelError};

/// Every float parameter's values, in traversal order.
#[derive(Default)]
struct Collect(Vec<Vec<f32>>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        self.0
            .push(p.val().into_data().try_to_vec::<f32>().unwrap());
    }
}

fn params(model: &impl Module) -> Vec<Vec<f32>> {
    let mut c = Collect::default();
    model.visit(&mut c);
    c.0
}

fn config() -> MlpConfig {
    MlpConfig {
        input: 16,
        hidden: vec![9, 4],
        classes: 3,
    }
}

#[test]
fn same_seed_same_parameters() {
    let device = Device::flex();
    let a = params(&config().init(5, &device).unwrap());
    let b = params(&config().init(5, &device).unwrap());
    let c = params(&config().init(6, &device).unwrap());
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn shapes_and_pytorch_default_bounds() {
    let device = Device::flex();
    let model = config().init(1, &device).unwrap();
    assert_eq!(model.widths(), vec![16, 9, 4, 3]);
    assert_eq!(model.layers.len(), 3);
    assert_eq!(model.num_params(), 16 * 9 + 9 + 9 * 4 + 4 + 4 * 3 + 3);
    // nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
    for (layer, fan_in) in model.layers.iter().zip([16.0f32, 9.0, 4.0]) {
        let bound = 1.0 / fan_in.sqrt();
        let w = layer.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let b = layer
            .bias
            .as_ref()
            .unwrap()
            .val()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for v in w.iter().chain(&b) {
            assert!(v.abs() <= bound, "{v} outside ±{bound}");
        }
        // Values actually spread over the range (not all zero / constant).
        let max = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(max > 0.5 * bound, "max |w| {max} for bound {bound}");
    }
}

#[test]
fn forward_gives_logits_per_class() {
    let device = Device::flex();
    let model = config().init(2, &device).unwrap();
    let logits = model.forward(Tensor::<2>::ones([7, 16], &device));
    assert_eq!(logits.dims(), [7, 3]);
}

#[test]
fn forward_applies_relu_between_layers_only() {
    // 1 -> 1 -> 1 with weights set by hand: h = relu(-2x + 0), out = 3h - 1.
    let device = Device::flex();
    let mut model = MlpConfig {
        input: 1,
        hidden: vec![1],
        classes: 1,
    }
    .init(0, &device)
    .unwrap();
    let set = |v: f32, shape: [usize; 2]| {
        Param::from_tensor(Tensor::<2>::from_data(
            TensorData::new(vec![v], shape),
            &device,
        ))
    };
    let bias = |v: f32| {
        Some(Param::from_tensor(Tensor::<1>::from_data(
            TensorData::new(vec![v], [1]),
            &device,
        )))
    };
    model.layers[0].weight = set(-2.0, [1, 1]);
    model.layers[0].bias = bias(0.0);
    model.layers[1].weight = set(3.0, [1, 1]);
    model.layers[1].bias = bias(-1.0);
    let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, -1.0], [2, 1]), &device);
    let out = model.forward(x).into_data().try_to_vec::<f32>().unwrap();
    // x = 1: relu(-2) = 0 → -1 (no ReLU after the last layer); x = -1: relu(2) = 2 → 5.
    assert_eq!(out, vec![-1.0, 5.0]);
}

#[test]
fn no_hidden_layer_is_a_linear_classifier() {
    let device = Device::flex();
    let model = MlpConfig {
        input: 4,
        hidden: vec![],
        classes: 2,
    }
    .init(0, &device)
    .unwrap();
    assert_eq!(model.widths(), vec![4, 2]);
}

#[test]
fn zero_width_is_rejected() {
    let device = Device::flex();
    let err = MlpConfig {
        input: 4,
        hidden: vec![8, 0],
        classes: 2,
    }
    .init(0, &device)
    .unwrap_err();
    assert_eq!(
        err,
        ModelError::ZeroWidth {
            widths: vec![4, 8, 0, 2],
            position: 2
        }
    );
    assert!(err.to_string().contains("width 2 is 0"));
}
