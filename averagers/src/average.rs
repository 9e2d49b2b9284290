//! Semantics §1 (the book): average the selected parameters of a module within a group, with one
//! fused all-reduce.

use crate::error::{AveragerError, RankParams};
use burn::module::Module;
use localsgd_comm::params::{FlatBuffer, FlatParams, ParamSelection, flatten_params, write_params};
use localsgd_comm::{Group, GroupExt};

/// Average `selection`'s parameters of `module` over `group`, the way PyTorch does:
/// flatten them in module traversal order, divide by the group size, all-reduce (sum) the flat
/// buffer once, and write the result back.
///
/// - Unselected parameters (frozen, or without a gradient this step) keep their local values and
///   are not sent. Parameters keep their `ParamId`, dtype, device and `require_grad`, so optimizer
///   state stays attached (and is never averaged).
/// - The element type follows the parameters: `f64` if any selected parameter is `f64`, else
///   `f32` (half-precision parameters are averaged in `f32`).
/// - An empty selection is a no-op without any communication.
/// - So is a group of one rank (a hierarchical level of size 1, a one-worker run): the average
///   of one replica is itself (PyTorch divides by 1 and all-reduces alone, which gives the same
///   bits), so nothing is flattened, checked or sent.
/// - Before the fused all-reduce, the ranks exchange a small fingerprint of what they are about
///   to average (one extra all-gather of four words). If the ranks selected different tensors,
///   sizes or element types, every rank gets [`AveragerError::ParameterSetMismatch`] naming what
///   each rank has, instead of a hang or a silently wrong average. A rank whose selection is empty
///   while its peers' are not does not communicate at all; its peers then fail with
///   [`CommError::Timeout`](localsgd_comm::CommError::Timeout) naming it after the group's
///   timeout.
///
/// On error the module is dropped (collective failures are not recoverable mid-training).
pub fn average_in_group<M: Module>(
    module: M,
    selection: &ParamSelection,
    group: &Group,
) -> Result<M, AveragerError> {
    fused(module, selection, group, Fused::Average)
}

/// What one fused collective over a module's flat buffer does.
enum Fused {
    Average,
    Broadcast { root: usize },
}

/// The one path of [`average_in_group`] and [`broadcast_in_group`]: nothing on one rank or an
/// empty selection; else flatten, agree on the layout, one collective, write back.
fn fused<M: Module>(
    module: M,
    selection: &ParamSelection,
    group: &Group,
    op: Fused,
) -> Result<M, AveragerError> {
    if group.size() == 1 {
        return Ok(module);
    }
    let mut flat = flatten_params(&module, selection)?;
    if flat.layout.is_empty() {
        return Ok(module);
    }
    check_agreement(group, &flat)?;
    match (&mut flat.buffer, op) {
        (FlatBuffer::F32(v), Fused::Average) => group.average_slice(v)?,
        (FlatBuffer::F64(v), Fused::Average) => group.average_slice(v)?,
        (FlatBuffer::F32(v), Fused::Broadcast { root }) => group.broadcast_slice(v, root)?,
        (FlatBuffer::F64(v), Fused::Broadcast { root }) => group.broadcast_slice(v, root)?,
    }
    Ok(write_params(module, &flat)?)
}

/// Overwrite `selection`'s tensors of `module` on every rank of `group` with those of group
/// rank `root` (PyTorch DDP's construction-time broadcast of rank 0's parameters and buffers,
/// and its per-iteration `broadcast_buffers`): one fused broadcast of the flat buffer, after
/// the same layout agreement check as [`average_in_group`] (ranks whose models differ in shape
/// get [`AveragerError::ParameterSetMismatch`] instead of a silently mixed model). A group of
/// one rank, or an empty selection, is a no-op without communication. Values arrive bit for bit;
/// every rank keeps its own `ParamId`s, dtype, device and `require_grad`.
pub fn broadcast_in_group<M: Module>(
    module: M,
    selection: &ParamSelection,
    group: &Group,
    root: usize,
) -> Result<M, AveragerError> {
    fused(module, selection, group, Fused::Broadcast { root })
}

/// [`average_in_group`] for a group this rank may not belong to: `None` (this rank is not a
/// member, see [`new_group`](crate::new_group)) returns `module` unchanged without communicating,
/// as the reference's `average` does for non-members.
pub fn average_if_member<M: Module>(
    module: M,
    selection: &ParamSelection,
    group: Option<&Group>,
) -> Result<M, AveragerError> {
    match group {
        Some(group) => average_in_group(module, selection, group),
        None => Ok(module),
    }
}

const WORDS: usize = 4;

/// All-gather `[fingerprint, tensor count, element count, element type]` and compare.
pub(crate) fn check_agreement(group: &Group, flat: &FlatParams) -> Result<(), AveragerError> {
    let (code, _) = element_type(&flat.buffer);
    let local = [
        flat.layout.fingerprint(),
        flat.layout.entries.len() as u64,
        flat.layout.total as u64,
        code,
    ];
    let all = group.all_gather_u64(&local)?;
    if all.chunks(WORDS).all(|words| words == local) {
        return Ok(());
    }
    let ranks = all
        .chunks(WORDS)
        .zip(group.world_ranks())
        .map(|(words, &rank)| RankParams {
            rank,
            params: words[1],
            elements: words[2],
            element_type: element_type_name(words[3]),
            fingerprint: words[0],
        })
        .collect();
    Err(AveragerError::ParameterSetMismatch {
        group: group.world_ranks().to_vec(),
        ranks,
    })
}

fn element_type(buffer: &FlatBuffer) -> (u64, &'static str) {
    match buffer {
        FlatBuffer::F32(_) => (32, "f32"),
        FlatBuffer::F64(_) => (64, "f64"),
    }
}

fn element_type_name(code: u64) -> &'static str {
    match code {
        32 => "f32",
        64 => "f64",
        _ => "unknown",
    }
}
