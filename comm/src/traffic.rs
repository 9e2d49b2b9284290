//! Per-group traffic accounting: number of collectives and payload bytes, with the model and
//! gradient data (float all-reduces and broadcasts, byte all-gathers of compressed payloads)
//! counted apart from control traffic (the `u64` all-gathers that agree on flags and
//! fingerprints).
//!
//! What a collective adds to `bytes` is [`CallSignature::payload_bytes`]: the bytes *this rank
//! contributes* (its buffer), not what the algorithm moves over the wire. An all-reduce of `n`
//! bytes counts `n`; an all-gather of `len` bytes per rank counts `len`. What it adds to
//! `wire_bytes` is [`CallSignature::wire_bytes`]: what this rank sends (and receives as much)
//! under the collective's bandwidth-optimal algorithm — `2 (size - 1) / size * n` for the ring
//! all-reduce, `(size - 1) * len` for the ring all-gather. The two agree at 2 ranks (except for
//! broadcasts); from 4 ranks on, compressed averages sent as all-gathers cost more on the wire
//! than their payload says.

use crate::buffer::ElementType;
use crate::signature::CallSignature;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a group's traffic counters, as seen by one rank. Snapshots subtract (the traffic
/// between two: `after - before`, as a pipeline iteration reports its own) and add up (`+`, `+=`,
/// `Iterator::sum`: the total of per-iteration reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Collectives this rank issued on the group (and on subgroups created from it).
    pub collectives: u64,
    /// Payload bytes this rank contributed to those collectives (buffer length x element size;
    /// for an all-gather, this rank's own part: see [`CallSignature::payload_bytes`]).
    pub bytes: u64,
    /// The part of `bytes` that is bulk data: all-reduces and broadcasts of `f32`, `f64`, `f16`,
    /// `bf16` buffers (gradients, parameters, losses), byte all-gathers
    /// ([`all_gather_bytes`](crate::ProcessGroup::all_gather_bytes): compressed
    /// pseudo-gradients) and byte all-to-alls
    /// ([`all_to_all_bytes`](crate::ProcessGroup::all_to_all_bytes): the quantized
    /// all-reduce's shards). The rest is control traffic: `u64` all-gathers (has-data flags,
    /// parameter-set fingerprints, subgroup creation).
    pub data_bytes: u64,
    /// Bytes this rank sends under each collective's bandwidth-optimal algorithm (it receives
    /// as many): [`CallSignature::wire_bytes`]. A backend's own algorithm may move more (MPI
    /// picks its algorithm by message size and launcher settings).
    pub wire_bytes: u64,
}

impl std::ops::Sub for Traffic {
    type Output = Traffic;
    fn sub(self, rhs: Traffic) -> Traffic {
        Traffic {
            collectives: self.collectives - rhs.collectives,
            bytes: self.bytes - rhs.bytes,
            data_bytes: self.data_bytes - rhs.data_bytes,
            wire_bytes: self.wire_bytes - rhs.wire_bytes,
        }
    }
}

impl std::ops::Add for Traffic {
    type Output = Traffic;
    fn add(self, rhs: Traffic) -> Traffic {
        Traffic {
            collectives: self.collectives + rhs.collectives,
            bytes: self.bytes + rhs.bytes,
            data_bytes: self.data_bytes + rhs.data_bytes,
            wire_bytes: self.wire_bytes + rhs.wire_bytes,
        }
    }
}

impl std::ops::AddAssign for Traffic {
    fn add_assign(&mut self, rhs: Traffic) {
        *self = *self + rhs;
    }
}

/// The total of per-iteration reports (`reports.iter().map(|r| r.traffic).sum()`).
impl std::iter::Sum for Traffic {
    fn sum<I: Iterator<Item = Traffic>>(iter: I) -> Traffic {
        iter.fold(Traffic::default(), |total, t| total + t)
    }
}

/// The total of borrowed snapshots (`traffics.iter().sum()`).
impl<'a> std::iter::Sum<&'a Traffic> for Traffic {
    fn sum<I: Iterator<Item = &'a Traffic>>(iter: I) -> Traffic {
        iter.copied().sum()
    }
}

/// Live counters of one group on one rank.
#[derive(Debug, Default)]
pub struct TrafficCounter {
    collectives: AtomicU64,
    bytes: AtomicU64,
    data_bytes: AtomicU64,
    wire_bytes: AtomicU64,
}

impl TrafficCounter {
    /// Current values.
    pub fn snapshot(&self) -> Traffic {
        Traffic {
            collectives: self.collectives.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            data_bytes: self.data_bytes.load(Ordering::Relaxed),
            wire_bytes: self.wire_bytes.load(Ordering::Relaxed),
        }
    }
}

/// The counters a group charges: its own, then each ancestor's (a subgroup's traffic also shows
/// in the group it was split from, so the world group's counter is the rank's total).
#[derive(Debug, Clone, Default)]
pub struct TrafficChain {
    counters: Vec<Arc<TrafficCounter>>,
}

impl TrafficChain {
    /// A root chain with one fresh counter.
    pub fn root() -> Self {
        Self {
            counters: vec![Arc::new(TrafficCounter::default())],
        }
    }

    /// A chain for a child group: a fresh counter followed by this chain.
    pub fn child(&self) -> Self {
        let mut counters = Vec::with_capacity(self.counters.len() + 1);
        counters.push(Arc::new(TrafficCounter::default()));
        counters.extend(self.counters.iter().cloned());
        Self { counters }
    }

    /// Record one collective on a group of `group_size` ranks (its payload, whether that
    /// payload is float data, and what it moves on the wire).
    pub fn record(&self, sig: &CallSignature, group_size: usize) {
        let bytes = sig.payload_bytes();
        let wire = sig.wire_bytes(group_size);
        let data = match sig.element {
            Some(
                ElementType::F32
                | ElementType::F64
                | ElementType::F16
                | ElementType::BF16
                | ElementType::U8,
            ) => bytes,
            Some(ElementType::U64) | None => 0,
        };
        for c in &self.counters {
            c.collectives.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
            c.data_bytes.fetch_add(data, Ordering::Relaxed);
            c.wire_bytes.fetch_add(wire, Ordering::Relaxed);
        }
    }

    /// This group's own counter.
    pub fn snapshot(&self) -> Traffic {
        self.counters
            .first()
            .map(|c| c.snapshot())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::Traffic;

    fn t(collectives: u64, bytes: u64, data_bytes: u64) -> Traffic {
        Traffic {
            collectives,
            bytes,
            data_bytes,
            wire_bytes: 2 * bytes,
        }
    }

    #[test]
    fn traffic_adds_and_sums_field_by_field() {
        let (a, b) = (t(1, 40, 32), t(2, 16, 0));
        assert_eq!(a + b, t(3, 56, 32));
        let mut c = a;
        c += b;
        assert_eq!(c, t(3, 56, 32));
        assert_eq!(c - b, a);
        let reports = [a, b, t(0, 8, 8)];
        assert_eq!(reports.iter().sum::<Traffic>(), t(3, 64, 40));
        assert_eq!(reports.into_iter().sum::<Traffic>(), t(3, 64, 40));
        assert_eq!(
            std::iter::empty::<Traffic>().sum::<Traffic>(),
            Traffic::default()
        );
    }
}
