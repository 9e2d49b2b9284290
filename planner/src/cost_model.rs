//! An algorithm's schedule on a cluster with the workload's costs: what any one iteration costs
//! and carries, the links' token bucket carried from one iteration to the next.

use crate::algorithm::Algorithm;
use crate::cluster::Cluster;
use crate::error::{PlanError, invalid};
use crate::link::{ETHERNET_HEADER, TCP_IP_HEADERS};
use crate::schedule::Schedule;
use crate::token_bucket::TokenBucket;
use crate::workload::Workload;

/// What one iteration costs and carries besides its compute and overhead.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Figures {
    /// Seconds in collectives (and their copies).
    pub(crate) comm_s: f64,
    /// Bytes on the busiest host link, one direction.
    pub(crate) link_bytes: f64,
    /// Rank 0's payload bytes.
    pub(crate) payload_bytes: f64,
    /// Of that, float data.
    pub(crate) data_bytes: f64,
}

impl Figures {
    pub(crate) fn add(&mut self, other: &Self) {
        self.comm_s += other.comm_s;
        self.link_bytes += other.link_bytes;
        self.payload_bytes += other.payload_bytes;
        self.data_bytes += other.data_bytes;
    }
}

/// An algorithm's schedule on a cluster, with the workload's costs: the figures of any
/// iteration (every setting checked by [`CostModel::new`]).
pub(crate) struct CostModel<'a> {
    pub(crate) schedule: Schedule,
    work: &'a Workload,
    cluster: &'a Cluster,
    overlap: u64,
}

impl<'a> CostModel<'a> {
    pub(crate) fn new(
        algorithm: &Algorithm,
        work: &'a Workload,
        cluster: &'a Cluster,
    ) -> Result<Self, PlanError> {
        if !(work.compute_s.is_finite() && work.compute_s >= 0.0) {
            return Err(invalid(
                "compute-ms",
                work.compute_s * 1e3,
                "a non-negative number of milliseconds",
            ));
        }
        let link = cluster.link;
        if !(link.bits_per_second.is_finite() && link.bits_per_second > 0.0) {
            return Err(invalid(
                "link-gbit",
                link.bits_per_second / 1e9,
                "a positive rate",
            ));
        }
        if !link.mtu.is_finite() || link.mtu <= TCP_IP_HEADERS {
            return Err(invalid("mtu", link.mtu, "more than 52 bytes"));
        }
        let layout = cluster.layout;
        if layout.hosts == 0 || layout.ranks_per_host == 0 {
            return Err(invalid(
                "hosts x ranks-per-host",
                format!("{}x{}", layout.hosts, layout.ranks_per_host),
                "at least one host with at least one rank",
            ));
        }
        let schedule = Schedule::new(algorithm, layout.world(), work)?;
        let overlap = match algorithm {
            Algorithm::Periodic { overlap, .. } => *overlap,
            _ => 0,
        };
        if !(work.overhead_s.is_finite() && work.overhead_s >= 0.0) {
            return Err(invalid(
                "overhead-ms",
                work.overhead_s * 1e3,
                "a non-negative number of milliseconds",
            ));
        }
        if work.copy_bytes_per_second.is_nan() || work.copy_bytes_per_second <= 0.0 {
            return Err(invalid(
                "copy-gbps",
                work.copy_bytes_per_second / 1e9,
                "a positive rate (GB/s)",
            ));
        }

        Ok(Self {
            schedule,
            work,
            cluster,
            overlap,
        })
    }

    /// An empty bucket of this cluster's links.
    pub(crate) fn bucket(&self) -> TokenBucket {
        let link = self.cluster.link;
        let efficiency = (link.mtu - TCP_IP_HEADERS) / (link.mtu + ETHERNET_HEADER);
        TokenBucket {
            burst: link.burst_bytes.max(0.0) * efficiency,
            refill: link.bits_per_second / 8.0 * efficiency,
            tokens: 0.0,
            idle: 0.0,
        }
    }

    /// Iteration `i`'s figures; the links' token bucket carries over from one to the next.
    pub(crate) fn iteration(&self, i: u64, bucket: &mut TokenBucket) -> Figures {
        let (work, cluster) = (self.work, self.cluster);
        let mut comm = 0.0;
        let mut link_bytes = 0.0;
        bucket.idle += work.compute_s + work.overhead_s;
        for c in self.schedule.iteration(i) {
            if c.data && c.bytes > 8 {
                let (t, b) = if c.gather {
                    cluster.allgather(c.group, c.bytes as f64)
                } else {
                    cluster.allreduce(c.group, c.bytes as f64)
                };
                // Flatten before the data flows, write back after: half the copy each side. A
                // gathered message is flattened and written back as f32 values (the codec's
                // encoding and decoding are not modelled).
                let copied = if c.gather {
                    (work.params as f64) * 4.0
                } else {
                    c.bytes as f64
                };
                let copy = copied / work.copy_bytes_per_second;
                let t = if b > 0.0 {
                    let credit = bucket.spend(b, cluster.link.latency_s + copy / 2.0, copy / 2.0);
                    // The credit passes at the path's rate rather than the goodput (never
                    // slower: a path slower than the link would be the link).
                    let saved = (1.0 / cluster.link.goodput()
                        - 1.0 / cluster.link.burst_bytes_per_second)
                        .max(0.0);
                    t - credit * saved
                } else {
                    bucket.idle += t + copy;
                    t
                };
                let t = t + copy;
                // An overlapped average waits only for what the next `overlap` iterations'
                // compute does not cover (the helper's own CPU use is not modelled).
                comm += if c.overlapped {
                    (t - self.overlap as f64 * (work.compute_s + work.overhead_s)).max(0.0)
                } else {
                    t
                };
                link_bytes += b;
            } else {
                let t = cluster.control(c.group);
                bucket.idle += t;
                comm += t;
            }
        }
        let (payload, data) = self.schedule.payload(i);
        Figures {
            comm_s: comm,
            link_bytes,
            payload_bytes: payload as f64,
            data_bytes: data as f64,
        }
    }
}
