//! Overlapped model averaging (opt-in, beyond PyTorch): the average's all-reduce runs while the
//! next `delay` iterations compute, and the local progress made meanwhile is kept.
//!
//! # Semantics
//!
//! Let `t` be an averaging step of the schedule, `x_t` a rank's selected parameters after that
//! step's optimizer step, and `D = delay` (`1 <= D <= period`).
//!
//! 1. At step `t` (in the averaging phase, after the optimizer step) the rank keeps a copy
//!    `s = x_t` and *starts* the average `a = avg(x_t)` over the scheduled group (divide by the
//!    group size, then sum, as the blocking average). Its parameters are left unchanged, and
//!    training continues locally.
//! 2. At step `t + D` (again after the optimizer step, before any average that step starts), the
//!    rank waits for `a` and sets, element by element in the parameters' element type,
//!    `x <- a + (x_{t+D} - s)`: the average of the replicas as they were at `t`, plus this rank's
//!    own progress since then.
//! 3. With `D == period`, step 2 of one average and step 1 of the next happen in the same call,
//!    in that order.
//!
//! With `D = 1` this is "Overlap Local-SGD" (Wang et al., 2020) with an anchor of one step; the
//! delayed application is the overlapped communication of Streaming DiLoCo's
//! `fragment_sync_delay` (Douillard et al., 2025) without its outer optimizer. Ranks agree on
//! the parameter set before starting (the same fingerprint check as the blocking average), a
//! group of one rank communicates nothing (the average of one replica is itself), and the
//! selection is the one of the starting step.
//!
//! A pending average is never lost: [`AverageParameters::complete_pending`] applies it early
//! (at the end of training), and [`Overlap::wait_pending`] completes its collective without applying
//! it, so a checkpoint can record `s` and `a` ([`PendingAverage`]) and a resumed run applies it
//! at step `t + D` exactly as the uninterrupted run does.
//!
//! [`AverageParameters::complete_pending`]: crate::AverageParameters::complete_pending

use crate::average::check_agreement;
use crate::error::AveragerError;
use burn::module::Module;
use localsgd_comm::params::{FlatBuffer, FlatLayout, ParamSelection, flatten_params, write_params};
use localsgd_comm::{AsyncGroup, Group, Pending};

/// A started average, recorded for a checkpoint (its collective completed, not yet applied).
#[derive(Debug, Clone, PartialEq)]
pub struct PendingAverage {
    /// The averaging step that started it.
    pub started_at: u64,
    /// World ranks of the group it averaged over.
    pub group: Vec<usize>,
    /// Traversal indices (among all float parameters) of the averaged parameters.
    pub indices: Vec<usize>,
    /// This rank's parameters at the starting step (`s`).
    pub snapshot: FlatBuffer,
    /// The group's average of them (`a`).
    pub average: FlatBuffer,
}

impl PendingAverage {
    /// Apply this average to `module` as its completion step does: `x <- a + (x - s)` on the
    /// recorded parameters, element by element. For tools that finish a run offline (exporting
    /// a checkpoint's final model); a training run applies it through its averager.
    pub fn apply<M: Module>(&self, module: M) -> Result<M, AveragerError> {
        apply_average(
            module,
            self.started_at,
            &self.indices,
            &self.snapshot,
            &self.average,
        )
    }
}

/// `x <- a + (x - s)` on the parameters of `module` at `indices`.
fn apply_average<M: Module>(
    module: M,
    started_at: u64,
    indices: &[usize],
    snapshot: &FlatBuffer,
    average: &FlatBuffer,
) -> Result<M, AveragerError> {
    let mut current = flatten_params(&module, &selection_of_indices(&module, indices))?;
    match (snapshot, average, &mut current.buffer) {
        (FlatBuffer::F32(s), FlatBuffer::F32(a), FlatBuffer::F32(x))
            if x.len() == s.len() && a.len() == s.len() =>
        {
            mix(a, x, s)
        }
        (FlatBuffer::F64(s), FlatBuffer::F64(a), FlatBuffer::F64(x))
            if x.len() == s.len() && a.len() == s.len() =>
        {
            mix(a, x, s)
        }
        _ => {
            return Err(AveragerError::Overlap(format!(
                "the average started at step {started_at} covers {} elements; the module's \
                 parameters {indices:?} now have {} (of another type or length)",
                snapshot.len(),
                current.buffer.len()
            )));
        }
    }
    Ok(write_params(module, &current)?)
}

enum Transfer {
    F32(Pending<f32>),
    F64(Pending<f64>),
    Ready(FlatBuffer),
}

struct InFlight {
    started_at: u64,
    group: Vec<usize>,
    indices: Vec<usize>,
    snapshot: FlatBuffer,
    transfer: Transfer,
}

impl Transfer {
    /// Wait for the collective (if still running); its result.
    fn into_ready(self) -> Result<FlatBuffer, AveragerError> {
        Ok(match self {
            Transfer::F32(p) => FlatBuffer::F32(p.wait()?),
            Transfer::F64(p) => FlatBuffer::F64(p.wait()?),
            Transfer::Ready(b) => b,
        })
    }
}

impl InFlight {
    /// Wait for the collective (if still running) and keep its result.
    fn wait(&mut self) -> Result<&FlatBuffer, AveragerError> {
        let transfer =
            std::mem::replace(&mut self.transfer, Transfer::Ready(FlatBuffer::F32(vec![])));
        self.transfer = Transfer::Ready(transfer.into_ready()?);
        match &self.transfer {
            Transfer::Ready(b) => Ok(b),
            _ => unreachable!("just set to Ready"),
        }
    }
}

/// The overlap state of an averager: the delay, one [`AsyncGroup`] per group averaged over
/// (created collectively on first use), and at most one average in flight.
pub struct Overlap {
    delay: u64,
    groups: Vec<(Vec<usize>, AsyncGroup)>,
    pending: Option<InFlight>,
    /// The last applied average's buffer, reused for the next transfer: a fresh allocation of
    /// model size costs a page fault per page on first touch.
    spare: Option<FlatBuffer>,
}

impl std::fmt::Debug for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overlap")
            .field("delay", &self.delay)
            .field(
                "pending_since",
                &self.pending.as_ref().map(|p| p.started_at),
            )
            .finish()
    }
}

impl Overlap {
    /// Overlap with `delay` steps between starting and applying an average (checked by the
    /// averager that holds it).
    pub(crate) fn new(delay: u64) -> Self {
        Self {
            delay,
            groups: Vec::new(),
            pending: None,
            spare: None,
        }
    }

    /// Steps between starting an average and applying it.
    pub fn delay(&self) -> u64 {
        self.delay
    }

    /// The step of the average in flight, if any.
    pub fn pending_since(&self) -> Option<u64> {
        self.pending.as_ref().map(|p| p.started_at)
    }

    /// Complete the collective of the average in flight (without applying it) and return it for
    /// a checkpoint; `None` when nothing is pending.
    pub fn wait_pending(&mut self) -> Result<Option<PendingAverage>, AveragerError> {
        let Some(p) = self.pending.as_mut() else {
            return Ok(None);
        };
        let average = p.wait()?.clone();
        Ok(Some(PendingAverage {
            started_at: p.started_at,
            group: p.group.clone(),
            indices: p.indices.clone(),
            snapshot: p.snapshot.clone(),
            average,
        }))
    }

    /// Put back an average recorded by [`wait_pending`](Self::wait_pending) (on resume; before the next
    /// `average_parameters` call). Fails if one is already pending or its buffers disagree.
    pub fn restore(&mut self, saved: PendingAverage) -> Result<(), AveragerError> {
        if let Some(p) = &self.pending {
            return Err(AveragerError::Overlap(format!(
                "cannot restore the average started at step {}: the one started at step {} is \
                 still pending",
                saved.started_at, p.started_at
            )));
        }
        let same_type = matches!(
            (&saved.snapshot, &saved.average),
            (FlatBuffer::F32(_), FlatBuffer::F32(_)) | (FlatBuffer::F64(_), FlatBuffer::F64(_))
        );
        if !same_type || saved.snapshot.len() != saved.average.len() {
            return Err(AveragerError::Overlap(format!(
                "the recorded average started at step {} has a snapshot of {} and an average \
                 of {} elements of different types or lengths",
                saved.started_at,
                saved.snapshot.len(),
                saved.average.len()
            )));
        }
        self.pending = Some(InFlight {
            started_at: saved.started_at,
            group: saved.group,
            indices: saved.indices,
            snapshot: saved.snapshot,
            transfer: Transfer::Ready(saved.average),
        });
        Ok(())
    }

    /// Apply the pending average if `step` is its completion step. A pending average whose
    /// completion step has passed is an error (it can only happen after a step counter was
    /// moved under it).
    pub(crate) fn complete_due<M: Module>(
        &mut self,
        module: M,
        step: u64,
    ) -> Result<M, AveragerError> {
        let Some(started_at) = self.pending_since() else {
            return Ok(module);
        };
        let due = started_at + self.delay;
        if step < due {
            return Ok(module);
        }
        if step > due {
            return Err(AveragerError::Overlap(format!(
                "the average started at step {started_at} was due at step {due} and is still \
                 pending at step {step}"
            )));
        }
        self.complete_now(module)
    }

    /// Apply the pending average now, whatever the step (end of training).
    pub(crate) fn complete_now<M: Module>(&mut self, module: M) -> Result<M, AveragerError> {
        let Some(p) = self.pending.take() else {
            return Ok(module);
        };
        let average = p.transfer.into_ready()?;
        let module = apply_average(module, p.started_at, &p.indices, &p.snapshot, &average)?;
        // The average's buffer carries the next transfer (no fresh model-size allocation).
        self.spare = Some(average);
        Ok(module)
    }

    /// Start averaging `selection`'s parameters of `module` over `group` at `step`.
    pub(crate) fn start<M: Module>(
        &mut self,
        module: &M,
        selection: &ParamSelection,
        group: &Group,
        step: u64,
    ) -> Result<(), AveragerError> {
        if let Some(p) = &self.pending {
            return Err(AveragerError::Overlap(format!(
                "step {step} starts an average while the one started at step {} (due at step {}) \
                 is pending: the delay must not exceed the gap between averaging steps",
                p.started_at,
                p.started_at + self.delay
            )));
        }
        if group.size() == 1 {
            return Ok(());
        }
        let flat = flatten_params(module, selection)?;
        if flat.layout.is_empty() {
            return Ok(());
        }
        check_agreement(group, &flat)?;
        let members = group.world_ranks().to_vec();
        let i = match self.groups.iter().position(|(m, _)| *m == members) {
            Some(i) => i,
            None => {
                self.groups
                    .push((members.clone(), AsyncGroup::new(group.clone())?));
                self.groups.len() - 1
            }
        };
        let side = &mut self.groups[i].1;
        let indices = flat.layout.entries.iter().map(|e| e.index).collect();
        let transfer = match (&flat.buffer, self.spare.take()) {
            (FlatBuffer::F32(v), Some(FlatBuffer::F32(mut b))) if b.len() == v.len() => {
                b.copy_from_slice(v);
                Transfer::F32(side.start_average(b)?)
            }
            (FlatBuffer::F64(v), Some(FlatBuffer::F64(mut b))) if b.len() == v.len() => {
                b.copy_from_slice(v);
                Transfer::F64(side.start_average(b)?)
            }
            (FlatBuffer::F32(v), _) => Transfer::F32(side.start_average(v.clone())?),
            (FlatBuffer::F64(v), _) => Transfer::F64(side.start_average(v.clone())?),
        };
        self.pending = Some(InFlight {
            started_at: step,
            group: members,
            indices,
            snapshot: flat.buffer,
            transfer,
        });
        Ok(())
    }
}

/// `x <- a + (x - s)`, element by element.
fn mix<T: Copy + std::ops::Add<Output = T> + std::ops::Sub<Output = T>>(
    a: &[T],
    x: &mut [T],
    s: &[T],
) {
    for ((x, &a), &s) in x.iter_mut().zip(a).zip(s) {
        *x = a + (*x - s);
    }
}

/// The float parameters at these traversal indices (ids are per process, indices are not).
pub(crate) fn selection_of_indices<M: Module>(module: &M, indices: &[usize]) -> ParamSelection {
    let all = FlatLayout::of(module, &ParamSelection::All);
    ParamSelection::ids(
        all.entries
            .iter()
            .filter(|e| indices.contains(&e.index))
            .map(|e| e.id),
    )
}
