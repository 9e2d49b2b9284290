//! [`InFlightGrads`]: one iteration's gradients while their buckets may still be on the wire.

use crate::error::HookError;
use burn::module::Module;
use burn::optim::GradientsParams;
use localsgd_comm::Pending;
use localsgd_comm::params::{FlatBuffer, FlatLayout, FlatParams, ParamSelection, grads_from_flat};
use std::collections::VecDeque;

/// The gradients of one iteration, handed out bucket by bucket as their communication
/// completes (see [`GradientReducer::start`](crate::GradientReducer::start)).
///
/// Buckets come out in the order they were started (bucket 0, the module's last parameters,
/// first), each as the [`GradientsParams`] of its own parameters, so an optimizer can step the
/// parameters of bucket `i` while bucket `i + 1` is still being reduced. Stepping a burn
/// optimizer bucket by bucket gives the same result as one step over all of them: burn updates
/// exactly the parameters that have a gradient and keeps every parameter's state separately.
///
/// Dropping it with buckets still pending leaves those collectives unwaited: the reducer reports
/// them when it is [closed](crate::GradientReducer::close).
#[derive(Debug)]
pub struct InFlightGrads {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    /// Already reduced (the hook ran bucket by bucket, or communication was skipped): one part.
    Ready(Option<GradientsParams>),
    /// Averaged non-blocking, one entry per bucket, in start order.
    Buckets(VecDeque<BucketInFlight>),
}

#[derive(Debug)]
struct BucketInFlight {
    layout: FlatLayout,
    pending: PendingBuffer,
}

#[derive(Debug)]
pub(crate) enum PendingBuffer {
    F32(Pending<f32>),
    F64(Pending<f64>),
}

impl PendingBuffer {
    fn wait(self) -> Result<FlatBuffer, HookError> {
        Ok(match self {
            PendingBuffer::F32(p) => FlatBuffer::F32(p.wait()?),
            PendingBuffer::F64(p) => FlatBuffer::F64(p.wait()?),
        })
    }
}

impl InFlightGrads {
    /// Gradients that are already final.
    pub(crate) fn ready(grads: GradientsParams) -> Self {
        Self {
            inner: Inner::Ready(Some(grads)),
        }
    }

    /// An empty set of in-flight buckets (push them in start order).
    pub(crate) fn buckets() -> Self {
        Self {
            inner: Inner::Buckets(VecDeque::new()),
        }
    }

    pub(crate) fn push(&mut self, layout: FlatLayout, pending: PendingBuffer) {
        if let Inner::Buckets(q) = &mut self.inner {
            q.push_back(BucketInFlight { layout, pending });
        }
    }

    /// Whether the gradients arrive bucket by bucket (non-blocking averaging) rather than as one
    /// finished set.
    pub fn is_pipelined(&self) -> bool {
        matches!(self.inner, Inner::Buckets(_))
    }

    /// Parts not handed out yet.
    pub fn remaining(&self) -> usize {
        match &self.inner {
            Inner::Ready(g) => usize::from(g.is_some()),
            Inner::Buckets(q) => q.len(),
        }
    }

    /// The parameters that will have a gradient once every part is handed out (for
    /// [`ParamSelection::with_grads`]-style bookkeeping before the gradients are consumed).
    pub fn selection<M: Module>(&self, module: &M) -> ParamSelection {
        match &self.inner {
            Inner::Ready(Some(g)) => ParamSelection::with_grads(module, g),
            Inner::Ready(None) => ParamSelection::ids(std::iter::empty()),
            Inner::Buckets(q) => {
                ParamSelection::ids(q.iter().flat_map(|b| b.layout.entries.iter().map(|e| e.id)))
            }
        }
    }

    /// Wait for the next part and return its gradients; `None` when everything was handed out.
    pub fn next_part<M: Module>(
        &mut self,
        module: &M,
    ) -> Result<Option<GradientsParams>, HookError> {
        match &mut self.inner {
            Inner::Ready(g) => Ok(g.take()),
            Inner::Buckets(q) => match q.pop_front() {
                None => Ok(None),
                Some(b) => {
                    let flat = FlatParams {
                        buffer: b.pending.wait()?,
                        layout: b.layout,
                    };
                    Ok(Some(grads_from_flat(module, &flat)?))
                }
            },
        }
    }

    /// Wait for every remaining part and return all their gradients as one set.
    pub fn wait_all<M: Module>(self, module: &M) -> Result<GradientsParams, HookError> {
        let q = match self.inner {
            Inner::Ready(g) => return Ok(g.unwrap_or_default()),
            Inner::Buckets(q) => q,
        };
        // Buckets run in reverse traversal order and each covers a contiguous range: reversed,
        // they concatenate into the traversal-order flat gradient that `grads_from_flat` reads.
        let mut layout = FlatLayout::default();
        let mut parts = Vec::with_capacity(q.len());
        for b in q {
            parts.push((b.layout, b.pending.wait()?));
        }
        let wide = parts
            .iter()
            .any(|(_, buf)| matches!(buf, FlatBuffer::F64(_)));
        let mut buffer = if wide {
            FlatBuffer::F64(Vec::new())
        } else {
            FlatBuffer::F32(Vec::new())
        };
        for (part_layout, part) in parts.into_iter().rev() {
            for mut e in part_layout.entries {
                e.offset += layout.total;
                layout.entries.push(e);
            }
            layout.total += part_layout.total;
            match (&mut buffer, part) {
                (FlatBuffer::F32(all), FlatBuffer::F32(v)) => all.extend_from_slice(&v),
                (FlatBuffer::F64(all), FlatBuffer::F64(v)) => all.extend_from_slice(&v),
                (FlatBuffer::F64(all), FlatBuffer::F32(v)) => {
                    all.extend(v.iter().map(|&x| x as f64))
                }
                (FlatBuffer::F32(_), FlatBuffer::F64(_)) => {
                    return Err(HookError::InvalidBucket(
                        "an f64 bucket in an f32 gradient set".into(),
                    ));
                }
            }
        }
        Ok(grads_from_flat(module, &FlatParams { layout, buffer })?)
    }
}
