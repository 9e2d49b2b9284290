//! Per-group traffic accounting: number of collectives and payload bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a group's traffic counters, as seen by one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Collectives this rank issued on the group (and on subgroups created from it).
    pub collectives: u64,
    /// Payload bytes this rank contributed to those collectives (buffer length x element size).
    pub bytes: u64,
}

impl std::ops::Sub for Traffic {
    type Output = Traffic;
    fn sub(self, rhs: Traffic) -> Traffic {
        Traffic {
            collectives: self.collectives - rhs.collectives,
            bytes: self.bytes - rhs.bytes,
        }
    }
}

/// Live counters of one group on one rank.
#[derive(Debug, Default)]
pub struct TrafficCounter {
    collectives: AtomicU64,
    bytes: AtomicU64,
}

impl TrafficCounter {
    /// Current values.
    pub fn snapshot(&self) -> Traffic {
        Traffic {
            collectives: self.collectives.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
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

    /// Record one collective of `bytes` payload bytes.
    pub fn record(&self, bytes: u64) {
        for c in &self.counters {
            c.collectives.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
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
