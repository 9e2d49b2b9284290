//! The machines: hosts and ranks ([`Layout`]), and what a collective costs on them
//! ([`Cluster`]): inside a host, across host links, in the MPI backend's pieces.

use crate::link::Link;
use localsgd_comm::MPI_PIECE_BYTES;
use serde::Serialize;

/// Hosts and ranks: ranks `h * ranks_per_host .. (h + 1) * ranks_per_host` run on host `h`
/// (`mpirun --map-by slot`, torchrun's node ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Number of hosts.
    pub hosts: usize,
    /// Ranks on each host.
    pub ranks_per_host: usize,
}

impl Layout {
    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.hosts * self.ranks_per_host
    }

    /// Whether a level of the ranks of each host lies between one rank and the world: several
    /// hosts with several ranks each.
    pub fn has_host_level(&self) -> bool {
        self.hosts > 1 && self.ranks_per_host > 1
    }
}

/// The machines: a layout, the link of every host, and what ranks on one host share.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cluster {
    /// Hosts and ranks.
    pub layout: Layout,
    /// Every host's link to the switch.
    pub link: Link,
    /// Bandwidth between ranks on one host (shared memory or loopback), bytes per second.
    pub intra_bytes_per_second: f64,
    /// Time of one small collective inside a host, seconds.
    pub intra_latency_s: f64,
    /// Largest piece of one all-reduce, bytes: the MPI backend runs every all-reduce as pieces
    /// of at most [`MPI_PIECE_BYTES`] one after the other; 0: the whole buffer at once (the
    /// thread and NCCL backends).
    pub piece_bytes: f64,
    /// Time each further piece of an all-reduce across hosts adds: one small collective with
    /// every rank already inside the all-reduce (`localsgd bench-comm --gap-us`), where
    /// [`Link::latency_s`] also waits for ranks arriving from their compute. Inside a host a
    /// piece adds [`intra_latency_s`](Self::intra_latency_s).
    pub piece_latency_s: f64,
}

impl Cluster {
    /// A cluster with the default intra-host figures (5 GB/s, 5 µs) and the MPI backend's
    /// pieces, each adding the link's latency.
    pub fn new(layout: Layout, link: Link) -> Self {
        Self {
            layout,
            link,
            intra_bytes_per_second: 5e9,
            intra_latency_s: 5e-6,
            piece_bytes: MPI_PIECE_BYTES as f64,
            piece_latency_s: link.latency_s,
        }
    }

    /// Pieces of an all-reduce of `bytes` less the first (see [`piece_bytes`](Self::piece_bytes)).
    fn further_pieces(&self, bytes: f64) -> f64 {
        if self.piece_bytes > 0.0 && bytes > self.piece_bytes {
            (bytes / self.piece_bytes).ceil() - 1.0
        } else {
            0.0
        }
    }

    /// Number of hosts the block of ranks `first .. first + size` touches.
    fn hosts_spanned(&self, first: usize, size: usize) -> usize {
        let r = self.layout.ranks_per_host.max(1);
        if size == 0 {
            return 0;
        }
        (first + size - 1) / r - first / r + 1
    }

    /// The most hosts any block of `size` consecutive ranks touches.
    fn max_spanned(&self, size: usize) -> usize {
        let blocks = self.layout.world() / size.max(1);
        (0..blocks.max(1))
            .map(|b| self.hosts_spanned(b * size, size))
            .max()
            .unwrap_or(1)
    }

    /// Seconds to all-reduce `bytes` in every block of `size` consecutive ranks at once (the
    /// slowest block counts) over links without burst credit, and the bytes each host link
    /// carries in one direction.
    pub(crate) fn allreduce(&self, size: usize, bytes: f64) -> (f64, f64) {
        if size <= 1 {
            return (0.0, 0.0);
        }
        let hosts = self.max_spanned(size);
        let further = self.further_pieces(bytes);
        if hosts <= 1 {
            let share = 2.0 * (size as f64 - 1.0) / size as f64 * bytes;
            (
                (1.0 + further) * self.intra_latency_s + share / self.intra_bytes_per_second,
                0.0,
            )
        } else {
            // Across hosts only the hosts count (the module documentation: what Open MPI's
            // recursive halving sends); a host's ranks exchange their part over shared memory.
            let share = 2.0 * (hosts as f64 - 1.0) / hosts as f64 * bytes;
            (
                self.link.latency_s + further * self.piece_latency_s + share / self.link.goodput(),
                share,
            )
        }
    }

    /// Seconds to all-gather `bytes` from every rank in every block of `size` consecutive ranks
    /// at once (a lossy codec's pseudo-gradient messages; one call, in no pieces), and the bytes
    /// each host link carries in one direction. Every rank receives the others' messages: inside
    /// a host `(size − 1)·bytes` each; across hosts, as for an all-reduce, only the hosts count,
    /// each link carrying the messages of the other hosts' ranks once,
    /// `(hosts − 1)/hosts · size · bytes` (not yet measured against the backends).
    pub(crate) fn allgather(&self, size: usize, bytes: f64) -> (f64, f64) {
        if size <= 1 {
            return (0.0, 0.0);
        }
        let hosts = self.max_spanned(size);
        if hosts <= 1 {
            let share = (size as f64 - 1.0) * bytes;
            (
                self.intra_latency_s + share / self.intra_bytes_per_second,
                0.0,
            )
        } else {
            let share = (hosts as f64 - 1.0) / hosts as f64 * size as f64 * bytes;
            (self.link.latency_s + share / self.link.goodput(), share)
        }
    }

    /// Seconds of a control collective (a few words) in blocks of `size` ranks.
    pub(crate) fn control(&self, size: usize) -> f64 {
        if size <= 1 {
            0.0
        } else if self.max_spanned(size) <= 1 {
            self.intra_latency_s
        } else {
            self.link.latency_s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{close, two_hosts};

    #[test]
    fn every_piece_after_the_first_adds_a_small_collective() {
        let mut c = two_hosts(2);
        c.piece_latency_s = 600e-6;
        let wire = |bytes: f64| bytes / c.link.goodput();
        // Up to one piece: the latency alone (2 hosts: 2 * 1/2 of the buffer on each link).
        close(c.allreduce(4, 262_144.0).0, 50e-6 + wire(262_144.0));
        // One byte more: a second piece.
        close(
            c.allreduce(4, 262_145.0).0,
            50e-6 + 600e-6 + wire(262_145.0),
        );
        // The wide MLP's 10.65 MB: 41 pieces, 40 after the first.
        close(
            c.allreduce(4, 10_647_600.0).0,
            50e-6 + 40.0 * 600e-6 + wire(10_647_600.0),
        );
        // Inside a host each piece adds the intra-host latency.
        close(c.allreduce(2, 524_288.0).0, 2.0 * 5e-6 + 524_288.0 / 5e9);
        // The whole buffer at once (threads, NCCL): one latency.
        c.piece_bytes = 0.0;
        close(c.allreduce(4, 10_647_600.0).0, 50e-6 + wire(10_647_600.0));
    }

    #[test]
    fn groups_that_straddle_hosts_use_the_link() {
        let c = Cluster::new(
            Layout {
                hosts: 4,
                ranks_per_host: 1,
            },
            Link::gbit(1.0, 50e-6),
        );
        assert_eq!(c.hosts_spanned(0, 2), 2);
        let (_, bytes) = c.allreduce(2, 1000.0);
        close(bytes, 1000.0);
        // 4 hosts x 1 rank: the ring's 2 * 3/4 of the buffer on every link (veth counters in
        // the benchmark matrix: 1.57 times the digits MLP's gradients per host and iteration,
        // headers and control collectives included).
        close(c.allreduce(4, 1000.0).1, 1500.0);
        // 4 hosts x 2 ranks: still 2 * 3/4 (hosts, not ranks; a flat 8-rank ring: 2 * 7/8).
        let c8 = Cluster::new(
            Layout {
                hosts: 4,
                ranks_per_host: 2,
            },
            Link::gbit(1.0, 50e-6),
        );
        close(c8.allreduce(8, 1000.0).1, 1500.0);
        // A group of 4 in it spans 2 hosts: 2 * 1/2.
        close(c8.allreduce(4, 1000.0).1, 1000.0);
        // A pair stays inside a host: nothing on the links, shared-memory time.
        let (t, bytes) = c8.allreduce(2, 1000.0);
        close(bytes, 0.0);
        close(t, 5e-6 + 1000.0 / 5e9);
        // The world's time: its latency and its 1500 link bytes at goodput.
        close(
            c8.allreduce(8, 1000.0).0,
            50e-6 + 1500.0 / c8.link.goodput(),
        );
        let c2 = two_hosts(2);
        assert_eq!(c2.hosts_spanned(2, 2), 1);
        assert_eq!(c2.allreduce(2, 1000.0).1, 0.0);
        assert_eq!(c2.allreduce(1, 1000.0), (0.0, 0.0));
    }

    #[test]
    fn an_all_gather_brings_every_other_hosts_messages_over_each_link() {
        // 4 hosts x 2 ranks, 1000 bytes from each rank: the 6 messages of the other 3 hosts
        // cross each link once, in one call (no pieces, whatever the piece size).
        let mut c8 = Cluster::new(
            Layout {
                hosts: 4,
                ranks_per_host: 2,
            },
            Link::gbit(1.0, 50e-6),
        );
        c8.piece_bytes = 100.0;
        let (t, bytes) = c8.allgather(8, 1000.0);
        close(bytes, 6000.0);
        close(t, 50e-6 + 6000.0 / c8.link.goodput());
        // A group of 4 spans 2 hosts: the other host's 2 messages.
        close(c8.allgather(4, 1000.0).1, 2000.0);
        // Inside a host: each rank takes the other's message over shared memory.
        let (t, bytes) = c8.allgather(2, 1000.0);
        close(bytes, 0.0);
        close(t, 5e-6 + 1000.0 / 5e9);
        assert_eq!(c8.allgather(1, 1000.0), (0.0, 0.0));
        // Half an all-reduce's bytes per rank cross the links as an all-gather of the world's
        // messages: 2 hosts x 2 ranks, int8 (1 byte a value) against fp16 (2 bytes a value).
        let c4 = two_hosts(2);
        close(c4.allgather(4, 1000.0).1, c4.allreduce(4, 2000.0).1);
    }
}
