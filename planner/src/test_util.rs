//! Helpers of the unit tests.

use crate::cluster::{Cluster, Layout};
use crate::link::Link;
use crate::workload::Workload;

pub(crate) fn close(a: f64, b: f64) {
    assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} != {b}");
}

pub(crate) fn work(params: u64, compute_s: f64) -> Workload {
    Workload {
        params,
        compute_s,
        overhead_s: 0.0,
        copy_bytes_per_second: f64::INFINITY,
        warmup: 0,
        log_every: 0,
        compressed: false,
        pipelined: false,
    }
}

pub(crate) fn two_hosts(ranks: usize) -> Cluster {
    Cluster::new(
        Layout {
            hosts: 2,
            ranks_per_host: ranks,
        },
        Link::gbit(1.0, 50e-6),
    )
}
