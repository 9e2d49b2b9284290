//! Shared test fixtures: small modules, setting every parameter to a value, reading values back,
//! and capturing `tracing` warnings.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::prelude::*;
use burn::tensor::DType;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// Three free parameters p1, p2, p3 (V4).
#[derive(Module, Debug)]
pub struct Three {
    pub p1: Param<Tensor<1>>,
    pub p2: Param<Tensor<2>>,
    pub p3: Param<Tensor<1>>,
}

impl Three {
    pub fn new(device: &Device) -> Self {
        Self {
            p1: Param::from_tensor(Tensor::zeros([3], device)),
            p2: Param::from_tensor(Tensor::zeros([2, 2], device)),
            p3: Param::from_tensor(Tensor::zeros([2], device)),
        }
    }
}

#[derive(Module, Debug)]
pub struct Mlp {
    pub fc1: Linear,
    pub act: Relu,
    pub fc2: Linear,
}

impl Mlp {
    pub fn new(device: &Device) -> Self {
        Self {
            fc1: LinearConfig::new(4, 5).init(device),
            act: Relu::new(),
            fc2: LinearConfig::new(5, 2).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.fc2.forward(self.act.forward(self.fc1.forward(x)))
    }
}

#[derive(Module, Debug)]
pub struct ConvNet {
    pub conv: Conv2d,
    pub head: Linear,
}

impl ConvNet {
    pub fn new(device: &Device) -> Self {
        Self {
            conv: Conv2dConfig::new([1, 2], [3, 3]).init(device),
            head: LinearConfig::new(2 * 2 * 2, 3).init(device),
        }
    }
}

/// Nested modules, a vector of submodules and an optional one.
#[derive(Module, Debug)]
pub struct Nested {
    pub blocks: Vec<Mlp>,
    pub conv: ConvNet,
    pub extra: Option<Linear>,
}

impl Nested {
    pub fn new(device: &Device) -> Self {
        Self {
            blocks: vec![Mlp::new(device), Mlp::new(device)],
            conv: ConvNet::new(device),
            extra: Some(LinearConfig::new(2, 2).init(device)),
        }
    }
}

/// Set every element of every float parameter to `value` (keeping ids and dtypes).
pub fn fill<M: Module>(module: M, value: f64) -> M {
    struct Fill(f64);
    impl ModuleMapper for Fill {
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let v = self.0;
            p.map(|t| {
                let rg = t.is_require_grad();
                let fresh = t.detach().zeros_like().add_scalar(v);
                if rg { fresh.require_grad() } else { fresh }
            })
        }
    }
    module.map(&mut Fill(value))
}

/// Cast every float parameter to `dtype`.
pub fn cast<M: Module>(module: M, dtype: DType) -> M {
    struct Cast(DType);
    impl ModuleMapper for Cast {
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let d = self.0;
            p.map(|t| t.cast(d))
        }
    }
    module.map(&mut Cast(dtype))
}

/// Values of a tensor as f64.
pub fn values<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.into_data()
        .convert::<f64>()
        .try_into_vec::<f64>()
        .unwrap()
}

/// Every float parameter's values as f64, in traversal order.
pub fn param_values<M: Module>(module: &M) -> Vec<Vec<f64>> {
    struct V(Vec<Vec<f64>>);
    impl ModuleVisitor for V {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.0.push(values(p.val()));
        }
    }
    let mut v = V(Vec::new());
    module.visit(&mut v);
    v.0
}

/// Every float parameter's (id, dtype, require_grad), in traversal order.
pub fn param_meta<M: Module>(module: &M) -> Vec<(ParamId, DType, bool)> {
    struct V(Vec<(ParamId, DType, bool)>);
    impl ModuleVisitor for V {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let t = p.val();
            self.0.push((p.id, t.dtype(), t.is_require_grad()));
        }
    }
    let mut v = V(Vec::new());
    module.visit(&mut v);
    v.0
}

/// Every float parameter's id, in traversal order.
pub fn param_ids<M: Module>(module: &M) -> Vec<ParamId> {
    param_meta(module).into_iter().map(|m| m.0).collect()
}

/// Whether every element of every parameter equals `value`.
pub fn all_equal<M: Module>(module: &M, value: f64) -> bool {
    param_values(module)
        .iter()
        .all(|p| p.iter().all(|&x| x == value))
}

/// Records every `tracing` event as (level, "field=value ..."), for the current thread only.
#[derive(Clone, Default)]
pub struct Capture(pub Arc<Mutex<Vec<(tracing::Level, String)>>>);

impl Capture {
    pub fn warnings(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| *l == tracing::Level::WARN)
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Run `f` with this subscriber as the thread's default.
    pub fn during<R>(&self, f: impl FnOnce() -> R) -> R {
        tracing::subscriber::with_default(self.clone(), f)
    }
}

struct Fields(String);
impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A one-rank world group (for constructing averagers outside worker threads).
pub fn solo_group() -> localsgd_comm::Group {
    let g = localsgd_comm::ThreadWorld::new(1)
        .unwrap()
        .groups()
        .pop()
        .unwrap();
    Arc::new(g)
}

/// Rank 0's handle on a world of `size` ranks whose other handles are dropped: fine for checks
/// that fail before any communication (a collective would fail fast with `PeerFailed`).
pub fn lone_handle(size: usize) -> localsgd_comm::Group {
    let g = localsgd_comm::ThreadWorld::new(size)
        .unwrap()
        .groups()
        .into_iter()
        .next()
        .unwrap();
    Arc::new(g)
}
