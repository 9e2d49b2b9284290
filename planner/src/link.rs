//! A host's network link: its rate, latency, MTU and a shaper's burst, and the goodput TCP gets
//! through it.

use serde::Serialize;

/// TCP (with timestamps) and IPv4 header bytes per segment.
pub(crate) const TCP_IP_HEADERS: f64 = 52.0;
/// Ethernet header bytes per frame, as a queueing discipline on a veth or NIC counts them.
pub(crate) const ETHERNET_HEADER: f64 = 14.0;

/// A network link between a host and the switch (full duplex: this rate in each direction).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Link {
    /// Line rate in bits per second.
    pub bits_per_second: f64,
    /// Time of one small collective across hosts (latency of a few round trips), seconds.
    pub latency_s: f64,
    /// Maximum transmission unit in bytes (1500 on Ethernet).
    pub mtu: f64,
    /// Bytes a token-bucket shaper (`tc ... tbf burst`) lets through unshaped after the link
    /// has been idle; 0 for a real NIC.
    pub burst_bytes: f64,
    /// Payload bytes per second at which that burst passes: what the hosts' network path (the
    /// network stack, the virtual cable) moves when the shaper does not hold it back;
    /// infinite: at once. Between two network namespaces of a 2-vCPU VM an all-reduce of
    /// 240 kB took 97 µs unshaped, 108 µs through a 10 Gbit/s `tbf` with its bucket full and
    /// 200 µs with it empty.
    pub burst_bytes_per_second: f64,
}

impl Link {
    /// A link of `gbit` Gbit/s with a small-collective time of `latency_s`, MTU 1500.
    pub fn gbit(gbit: f64, latency_s: f64) -> Self {
        Self {
            bits_per_second: gbit * 1e9,
            latency_s,
            mtu: 1500.0,
            burst_bytes: 0.0,
            burst_bytes_per_second: f64::INFINITY,
        }
    }

    /// Payload bytes per second that TCP gets through this link.
    pub fn goodput(&self) -> f64 {
        self.bits_per_second / 8.0 * (self.mtu - TCP_IP_HEADERS) / (self.mtu + ETHERNET_HEADER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::close;

    #[test]
    fn goodput_is_the_rate_less_headers() {
        // 1 Gbit/s = 125e6 B/s; 1448 payload bytes per 1514-byte frame.
        close(Link::gbit(1.0, 0.0).goodput(), 125e6 * 1448.0 / 1514.0);
    }
}
