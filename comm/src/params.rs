//! The burn glue, in one place: flatten a module's float parameters (or their gradients) into one
//! contiguous buffer in module traversal order, and write a buffer back.
//!
//! Traversal order (the order [`Module::visit`] sees parameters) is the wire layout: it is the same
//! on every rank, while [`ParamId`]s are random per process and must never order anything that
//! crosses ranks. Writing back keeps each parameter's `ParamId` (so optimizer state stays
//! attached) and its `require_grad` setting.

use crate::error::CommError;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Device, Tensor, TensorCreationOptions, TensorData};
use std::collections::HashSet;

/// Which float parameters take part in a flatten / write-back.
#[derive(Debug, Clone, Default)]
pub enum ParamSelection {
    /// Every float parameter of the module.
    #[default]
    All,
    /// Only parameters with these ids (e.g. those that received a gradient this step).
    Ids(HashSet<ParamId>),
}

impl ParamSelection {
    /// The parameters of `module` that have a gradient in `grads` (semantics §1's "params with
    /// grads": frozen and unused parameters are left out).
    pub fn with_grads<M: Module>(module: &M, grads: &GradientsParams) -> Self {
        struct V<'a> {
            grads: &'a GradientsParams,
            ids: HashSet<ParamId>,
        }
        impl ModuleVisitor for V<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                if self.grads.get::<D>(p.id).is_some() {
                    self.ids.insert(p.id);
                }
            }
        }
        let mut v = V {
            grads,
            ids: HashSet::new(),
        };
        module.visit(&mut v);
        ParamSelection::Ids(v.ids)
    }

    /// The float tensors of `module` that do not require a gradient: buffers such as burn's
    /// `RunningState` (BatchNorm's running statistics), and frozen parameters. PyTorch's
    /// `module.buffers()` without the frozen parameters; taking rank 0's frozen parameters is a
    /// no-op once the replicas started equal.
    pub fn buffers<M: Module>(module: &M) -> Self {
        struct V(HashSet<ParamId>);
        impl ModuleVisitor for V {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                if !p.val().is_require_grad() {
                    self.0.insert(p.id);
                }
            }
        }
        let mut v = V(HashSet::new());
        module.visit(&mut v);
        ParamSelection::Ids(v.0)
    }

    /// Whether nothing can be selected (an empty id set; `All` may still select nothing on a
    /// module without float tensors).
    pub fn is_empty(&self) -> bool {
        matches!(self, ParamSelection::Ids(ids) if ids.is_empty())
    }

    /// Select exactly these ids.
    pub fn ids(ids: impl IntoIterator<Item = ParamId>) -> Self {
        ParamSelection::Ids(ids.into_iter().collect())
    }

    /// Whether `id` takes part.
    pub fn contains(&self, id: &ParamId) -> bool {
        match self {
            ParamSelection::All => true,
            ParamSelection::Ids(ids) => ids.contains(id),
        }
    }
}

/// Where one selected parameter lives in the flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutEntry {
    /// Position of the parameter among *all* float parameters in traversal order (identical on
    /// every rank for the same module type).
    pub index: usize,
    /// The parameter's id (local to this process).
    pub id: ParamId,
    /// Tensor shape.
    pub shape: Vec<usize>,
    /// Offset of its first element in the flat buffer.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

/// The selected parameters' places in a flat buffer, in traversal order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlatLayout {
    /// One entry per selected parameter.
    pub entries: Vec<LayoutEntry>,
    /// Total number of elements.
    pub total: usize,
}

impl FlatLayout {
    /// The layout of `module`'s parameters chosen by `selection`, without reading any values.
    pub fn of<M: Module>(module: &M, selection: &ParamSelection) -> Self {
        struct V<'a> {
            selection: &'a ParamSelection,
            index: usize,
            layout: FlatLayout,
        }
        impl ModuleVisitor for V<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                let index = self.index;
                self.index += 1;
                if !self.selection.contains(&p.id) {
                    return;
                }
                let shape = p.lazy_shape().to_vec();
                let len = shape.iter().product();
                self.layout.entries.push(LayoutEntry {
                    index,
                    id: p.id,
                    shape,
                    offset: self.layout.total,
                    len,
                });
                self.layout.total += len;
            }
        }
        let mut v = V {
            selection,
            index: 0,
            layout: FlatLayout::default(),
        };
        module.visit(&mut v);
        v.layout
    }

    /// A rank-independent description (traversal index and length of every entry, in order),
    /// for checking that ranks agree on a layout before a fused collective.
    pub fn fingerprint(&self) -> u64 {
        // FNV-1a over (index, len) pairs: stable across processes and platforms.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |x: u64| {
            for b in x.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        mix(self.entries.len() as u64);
        for e in &self.entries {
            mix(e.index as u64);
            mix(e.len as u64);
        }
        h
    }

    /// Whether no parameter is selected.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A flat buffer's element type: `f64` when any selected parameter is `f64`, else `f32`
/// (half-precision parameters travel as `f32`).
#[derive(Debug, Clone, PartialEq)]
pub enum FlatBuffer {
    /// 32-bit elements.
    F32(Vec<f32>),
    /// 64-bit elements.
    F64(Vec<f64>),
}

impl FlatBuffer {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            FlatBuffer::F32(v) => v.len(),
            FlatBuffer::F64(v) => v.len(),
        }
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A type-erased mutable view for collectives.
    pub fn as_buffer_mut(&mut self) -> crate::buffer::BufferMut<'_> {
        match self {
            FlatBuffer::F32(v) => crate::buffer::BufferMut::F32(v),
            FlatBuffer::F64(v) => crate::buffer::BufferMut::F64(v),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            FlatBuffer::F32(_) => DType::F32,
            FlatBuffer::F64(_) => DType::F64,
        }
    }
}

/// Parameters (or gradients) flattened into one buffer, with the layout to write them back.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatParams {
    /// Where each parameter lives.
    pub layout: FlatLayout,
    /// The values.
    pub buffer: FlatBuffer,
}

/// Collects 1-D views of the selected tensors (values or gradients) in traversal order.
struct Gather<'a> {
    selection: &'a ParamSelection,
    grads: Option<&'a GradientsParams>,
    parts: Vec<Tensor<1>>,
    wide: bool,
}

impl ModuleVisitor for Gather<'_> {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
        if !self.selection.contains(&p.id) {
            return;
        }
        let value = p.val();
        let n = value.shape().num_elements();
        // Read without autodiff (gradients are already outside it): no autodiff dispatch for
        // the reshape and the concatenation.
        let tensor = match self.grads {
            None => value.inner(),
            Some(grads) => match grads.get::<D>(p.id) {
                Some(g) => g,
                // A trainable parameter without a local gradient contributes zeros so every rank
                // has the same layout.
                None => Tensor::<D>::zeros(value.shape(), (&value.device().inner(), value.dtype())),
            },
        };
        if tensor.dtype() == DType::F64 {
            self.wide = true;
        }
        self.parts.push(tensor.reshape([n as i64]));
    }
}

fn gather<M: Module>(
    module: &M,
    selection: &ParamSelection,
    grads: Option<&GradientsParams>,
) -> Result<FlatParams, CommError> {
    let layout = FlatLayout::of(module, selection);
    let mut g = Gather {
        selection,
        grads,
        parts: Vec::with_capacity(layout.entries.len()),
        wide: false,
    };
    module.visit(&mut g);
    if g.parts.is_empty() {
        return Ok(FlatParams {
            layout,
            buffer: FlatBuffer::F32(Vec::new()),
        });
    }
    let dtype = if g.wide { DType::F64 } else { DType::F32 };
    let parts: Vec<Tensor<1>> = g
        .parts
        .into_iter()
        .map(|t| if t.dtype() == dtype { t } else { t.cast(dtype) })
        .collect();
    // One read of one concatenated tensor: reading tensors one by one is ~200x slower.
    let flat = if parts.len() == 1 {
        parts.into_iter().next().unwrap_or_else(|| unreachable!())
    } else {
        Tensor::cat(parts, 0)
    };
    let data = flat
        .try_into_data()
        .map_err(|e| CommError::Params(format!("reading parameters failed: {e:?}")))?;
    let buffer = if g.wide {
        FlatBuffer::F64(
            data.try_into_vec::<f64>()
                .map_err(|e| CommError::Params(format!("{e:?}")))?,
        )
    } else {
        FlatBuffer::F32(
            data.try_into_vec::<f32>()
                .map_err(|e| CommError::Params(format!("{e:?}")))?,
        )
    };
    Ok(FlatParams { layout, buffer })
}

/// Flatten the selected float parameters of `module`, in traversal order.
pub fn flatten_params<M: Module>(
    module: &M,
    selection: &ParamSelection,
) -> Result<FlatParams, CommError> {
    gather(module, selection, None)
}

/// Flatten the gradients of the selected parameters, in traversal order. A selected parameter
/// without a gradient in `grads` contributes zeros, so the layout never depends on which
/// parameters this rank happened to use.
pub fn flatten_grads<M: Module>(
    module: &M,
    grads: &GradientsParams,
    selection: &ParamSelection,
) -> Result<FlatParams, CommError> {
    gather(module, selection, Some(grads))
}

fn slice_tensor<const D: usize>(
    flat: &FlatParams,
    entry: &LayoutEntry,
    device: &Device,
    dtype: DType,
) -> Tensor<D> {
    let range = entry.offset..entry.offset + entry.len;
    let data = match &flat.buffer {
        FlatBuffer::F32(v) => TensorData::new(v[range].to_vec(), entry.shape.clone()),
        FlatBuffer::F64(v) => TensorData::new(v[range].to_vec(), entry.shape.clone()),
    };
    let _ = flat.buffer.dtype();
    Tensor::<D>::from_data(
        data,
        TensorCreationOptions::new(device.clone()).with_dtype(dtype),
    )
}

/// Write `flat` back into the parameters it was flattened from. Parameters keep their
/// `ParamId`, dtype, device and `require_grad`; unselected parameters are untouched.
///
/// Fails (leaving nothing half-written: the module is only returned on success) when the module's
/// layout for the same selection differs from `flat.layout`; the error says what differs and the
/// likely cause. The layout selects by `ParamId`, and ids are random per process and per
/// initialisation: a buffer flattened from one instance of a model selects nothing in another
/// (a fresh replica). Lay it out for the target first (`FlatLayout::of(&target, &selection)`).
pub fn write_params<M: Module>(module: M, flat: &FlatParams) -> Result<M, CommError> {
    check_layout(&module, flat)?;
    struct W<'a> {
        flat: &'a FlatParams,
        index: usize,
        next: usize,
    }
    impl ModuleMapper for W<'_> {
        fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let index = self.index;
            self.index += 1;
            let Some(entry) = self.flat.layout.entries.get(self.next) else {
                return p;
            };
            if entry.index != index {
                return p;
            }
            self.next += 1;
            let flat = self.flat;
            p.map(|old| {
                let require_grad = old.is_require_grad();
                let fresh = slice_tensor::<D>(flat, entry, &old.device(), old.dtype());
                if require_grad {
                    fresh.require_grad()
                } else {
                    fresh
                }
            })
        }
    }
    Ok(module.map(&mut W {
        flat,
        index: 0,
        next: 0,
    }))
}

/// Turn a flat gradient buffer back into [`GradientsParams`] for the optimizer (one entry per
/// layout entry, keyed by the local `ParamId`).
pub fn grads_from_flat<M: Module>(
    module: &M,
    flat: &FlatParams,
) -> Result<GradientsParams, CommError> {
    check_layout(module, flat)?;
    struct V<'a> {
        flat: &'a FlatParams,
        index: usize,
        next: usize,
        out: GradientsParams,
    }
    impl ModuleVisitor for V<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let index = self.index;
            self.index += 1;
            let Some(entry) = self.flat.layout.entries.get(self.next) else {
                return;
            };
            if entry.index != index {
                return;
            }
            self.next += 1;
            let value = p.val();
            // On the parameter's device without autodiff, as `backward` hands gradients out. A
            // gradient on the autodiff device makes the optimizer's state (momentum) an
            // autodiff tensor for good, and every later step, forward and backward pays autodiff
            // dispatch for it: post-local SGD stayed 50% slower after its gradient warmup.
            let device = value.device().inner();
            let g = slice_tensor::<D>(self.flat, entry, &device, value.dtype());
            self.out.register::<D>(p.id, g);
        }
    }
    let mut v = V {
        flat,
        index: 0,
        next: 0,
        out: GradientsParams::new(),
    };
    module.visit(&mut v);
    Ok(v.out)
}

fn check_layout<M: Module>(module: &M, flat: &FlatParams) -> Result<(), CommError> {
    if flat.buffer.len() != flat.layout.total {
        return Err(CommError::LayoutMismatch(format!(
            "buffer has {} elements but its layout describes {}",
            flat.buffer.len(),
            flat.layout.total
        )));
    }
    let selection = ParamSelection::ids(flat.layout.entries.iter().map(|e| e.id));
    let here = FlatLayout::of(module, &selection);
    if here != flat.layout {
        return Err(CommError::LayoutMismatch(layout_mismatch(
            module,
            &here,
            &flat.layout,
        )));
    }
    Ok(())
}

/// Why `module` does not fit a buffer laid out as `want` (`here`: the module's own layout of the
/// ids `want` selects): the counts, what differs, the likely cause and what to do.
fn layout_mismatch<M: Module>(module: &M, here: &FlatLayout, want: &FlatLayout) -> String {
    let counts = format!(
        "the module's parameters ({} selected, {} elements) do not match the buffer's layout ({} \
         parameters, {} elements)",
        here.entries.len(),
        here.total,
        want.entries.len(),
        want.total
    );
    // The module's every float tensor, entry `i` at traversal position `i`.
    let all = FlatLayout::of(module, &ParamSelection::All);
    let at = |index: usize| match all.entries.get(index) {
        Some(e) => format!("shape {:?}", e.shape),
        None => format!("absent (it has {} float tensors)", all.entries.len()),
    };
    let missing: Vec<&LayoutEntry> = want
        .entries
        .iter()
        .filter(|w| !here.entries.iter().any(|h| h.id == w.id))
        .collect();
    let same_places = want
        .entries
        .iter()
        .all(|w| all.entries.get(w.index).is_some_and(|a| a.shape == w.shape));
    let why = match missing.first() {
        Some(_) if missing.len() == want.entries.len() && same_places => format!(
            "none of the buffer's {} ParamIds is a parameter of this module, although the \
             module has tensors of the same shapes at the buffer's traversal positions: the \
             buffer was flattened from another instance of the model (a fresh replica, another \
             process: ParamIds are random per process and per initialisation), and a selection \
             by another module's ids selects nothing here. Write it into the module it was \
             flattened from, or lay it out for this module (`FlatParams {{ layout: \
             FlatLayout::of(&module, &ParamSelection::All), buffer }}` when it holds every \
             parameter), or restore the saved ParamIds first (checkpoints do)",
            want.entries.len()
        ),
        Some(first) if missing.len() == want.entries.len() => format!(
            "none of the buffer's {} ParamIds is a parameter of this module, and its tensors \
             differ from the buffer's too (position {} is shape {:?} in the buffer, {} in the \
             module): the buffer holds another model's parameters",
            want.entries.len(),
            first.index,
            first.shape,
            at(first.index)
        ),
        Some(first) => format!(
            "{} of the buffer's {} ParamIds are not parameters of this module (the first, at \
             traversal position {} with shape {:?}: the module has {} there): the buffer was \
             flattened from a module some of whose parameters were since replaced (a new \
             `Param` has a new id); flatten again, or lay the buffer out with \
             `FlatLayout::of` of this module",
            missing.len(),
            want.entries.len(),
            first.index,
            first.shape,
            at(first.index)
        ),
        None => match want.entries.iter().zip(&here.entries).find(|(w, h)| w != h) {
            Some((w, h)) => format!(
                "the buffer's parameter at traversal position {} with shape {:?} is at position \
                 {} with shape {:?} in the module: the module's structure changed since it was \
                 flattened (tensors added, removed or reshaped); flatten it again",
                w.index, w.shape, h.index, h.shape
            ),
            None => "the same parameters, laid out differently".to_string(),
        },
    };
    format!("{counts}: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Module, Debug)]
    struct Two {
        a: Param<Tensor<2>>,
        b: Param<Tensor<1>>,
    }

    fn two(device: &Device, rows: usize) -> Two {
        Two {
            a: Param::from_tensor(Tensor::ones([rows, 3], device)),
            b: Param::from_tensor(Tensor::zeros([3], device)),
        }
    }

    fn mismatch(result: Result<Two, CommError>) -> String {
        match result {
            Err(e @ CommError::LayoutMismatch(_)) => e.to_string(),
            Err(e) => panic!("expected a layout mismatch, got {e}"),
            Ok(_) => panic!("expected a layout mismatch, the write succeeded"),
        }
    }

    #[test]
    fn writing_into_a_fresh_replica_names_the_param_ids_and_what_to_do() {
        let device = Device::flex();
        let flat = flatten_params(&two(&device, 2), &ParamSelection::All).unwrap();
        let fresh = two(&device, 2);
        let msg = mismatch(write_params(fresh.clone(), &flat));
        assert!(msg.contains("0 selected, 0 elements"), "{msg}");
        assert!(msg.contains("none of the buffer's 2 ParamIds"), "{msg}");
        assert!(msg.contains("another instance of the model"), "{msg}");
        assert!(msg.contains("ParamIds are random per process"), "{msg}");
        assert!(msg.contains("FlatLayout::of(&module"), "{msg}");
        // What the message says to do works.
        let relaid = FlatParams {
            layout: FlatLayout::of(&fresh, &ParamSelection::All),
            buffer: flat.buffer.clone(),
        };
        let written = write_params(fresh, &relaid).unwrap();
        assert_eq!(
            flatten_params(&written, &ParamSelection::All)
                .unwrap()
                .buffer,
            flat.buffer
        );
    }

    #[test]
    fn writing_into_another_model_names_the_shapes() {
        let device = Device::flex();
        let flat = flatten_params(&two(&device, 2), &ParamSelection::All).unwrap();
        let msg = mismatch(write_params(two(&device, 4), &flat));
        assert!(msg.contains("another model's parameters"), "{msg}");
        assert!(
            msg.contains("shape [2, 3] in the buffer, shape [4, 3]"),
            "{msg}"
        );
    }

    #[test]
    fn a_replaced_param_is_named() {
        let device = Device::flex();
        let model = two(&device, 2);
        let flat = flatten_params(&model, &ParamSelection::All).unwrap();
        let model = Two {
            b: Param::from_tensor(Tensor::zeros([3], &device)),
            ..model
        };
        let msg = mismatch(write_params(model, &flat));
        assert!(msg.contains("1 of the buffer's 2 ParamIds"), "{msg}");
        assert!(msg.contains("traversal position 1 with shape [3]"), "{msg}");
    }
}
