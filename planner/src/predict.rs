//! The model's figures for one algorithm: the steady iteration, the warmup, the lower bound, and
//! each iteration of a run in order.

use crate::algorithm::Algorithm;
use crate::cluster::Cluster;
use crate::cost_model::{CostModel, Figures};
use crate::error::{PlanError, invalid};
use crate::workload::Workload;
use serde::Serialize;

/// The longest schedule cycle the model walks (the least common multiple of the averaging
/// period and `log_every`).
const MAX_CYCLE: u64 = 1_000_000;

/// The model's figures for one algorithm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// `localsgd train --algorithm` name.
    pub algorithm: String,
    /// Seconds per iteration after the warmup (mean over one schedule cycle).
    pub steady_s: f64,
    /// Seconds per warmup iteration (0 when there is no warmup).
    pub warmup_s: f64,
    /// Of `steady_s`, the part spent in collectives.
    pub comm_s: f64,
    /// `comm_s / steady_s`.
    pub comm_share: f64,
    /// Rank 0's payload bytes per steady iteration (what `metrics.csv` counts in `bytes`).
    pub payload_bytes: f64,
    /// Of that, float data (`data_bytes`).
    pub payload_data_bytes: f64,
    /// Bytes per steady iteration on the busiest host link, one direction.
    pub link_bytes: f64,
    /// Bytes per warmup iteration on the busiest host link, one direction.
    pub warmup_link_bytes: f64,
    /// Bytes per steady iteration sent onto all host links together (what the links' transmit
    /// counters of all hosts add up to, less packet headers).
    pub wire_bytes: f64,
    /// `link_bytes / goodput`: the busiest link's busy time per steady iteration.
    pub wire_s: f64,
    /// `max(compute, wire_s)`: the iteration with every collective hidden.
    pub lower_bound_s: f64,
}

/// Predict one algorithm's figures.
pub fn predict(
    algorithm: &Algorithm,
    work: &Workload,
    cluster: &Cluster,
) -> Result<Prediction, PlanError> {
    let model = CostModel::new(algorithm, work, cluster)?;
    let mut bucket = model.bucket();
    let warmup_figures = if work.warmup > 0 {
        // A warmup iteration once the burst is spent: from an empty bucket, the second one.
        model.iteration(0, &mut bucket);
        Some(model.iteration(0, &mut bucket))
    } else {
        None
    };
    let cycle = model.schedule.cycle();
    if cycle > MAX_CYCLE {
        return Err(invalid(
            "period / log-every",
            cycle,
            "a schedule that repeats within 1,000,000 iterations (the least common multiple of the period and log-every)",
        ));
    }
    let mut sum = Figures::default();
    // Two passes over consecutive cycles from an empty bucket; the second (steady) one counts
    // (it also leaves out one-time collectives at the first averaging step).
    bucket.tokens = 0.0;
    for pass in 0..2 {
        let start = work.warmup + pass * cycle;
        for i in start..start + cycle {
            let f = model.iteration(i, &mut bucket);
            if pass == 1 {
                sum.add(&f);
            }
        }
    }
    let n = cycle as f64;
    let (comm, link_bytes, payload, data) = (
        sum.comm_s / n,
        sum.link_bytes / n,
        sum.payload_bytes / n,
        sum.data_bytes / n,
    );
    let (warmup_s, warmup_link_bytes) = match warmup_figures {
        Some(f) => (work.compute_s + work.overhead_s + f.comm_s, f.link_bytes),
        None => (0.0, 0.0),
    };
    let steady = work.compute_s + work.overhead_s + comm;
    // Every host sends `link_bytes` onto its link when the busiest block spans all hosts;
    // blocks inside one host send nothing.
    let wire = link_bytes * cluster.layout.hosts as f64;
    let link = cluster.link;
    Ok(Prediction {
        algorithm: algorithm.name().to_string(),
        steady_s: steady,
        warmup_s,
        comm_s: comm,
        comm_share: if steady > 0.0 { comm / steady } else { 0.0 },
        payload_bytes: payload,
        payload_data_bytes: data,
        link_bytes,
        warmup_link_bytes,
        wire_bytes: wire,
        wire_s: link_bytes / link.goodput(),
        lower_bound_s: work.compute_s.max(link_bytes / link.goodput()),
    })
}

/// Seconds of each iteration `0 .. steps` of one run, in order, the warmup included, with the
/// links' token buckets full at the start (see [`Link::burst_bytes`](crate::Link::burst_bytes)): what a run of `steps`
/// iterations over a freshly shaped link measures iteration by iteration. Over a long run its
/// iterations approach [`Prediction::steady_s`] once the burst is spent; over a short one they
/// can be faster, as the shaper lets the first burst through at once. (One `f64` per step.)
pub fn run_seconds(
    algorithm: &Algorithm,
    work: &Workload,
    cluster: &Cluster,
    steps: u64,
) -> Result<Vec<f64>, PlanError> {
    let model = CostModel::new(algorithm, work, cluster)?;
    let mut bucket = model.bucket();
    bucket.tokens = bucket.burst;
    Ok((0..steps)
        .map(|i| work.compute_s + work.overhead_s + model.iteration(i, &mut bucket).comm_s)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Layout;
    use crate::link::Link;
    use crate::schedule::Schedule;
    use crate::test_util::{close, two_hosts, work};

    #[test]
    fn ddp_two_hosts_by_hand() {
        // 600k parameters = 2.4 MB; a 2-rank ring sends 2 * 1/2 * 2.4 MB over the link, in
        // 10 pieces of at most 256 KiB: 9 more small collectives (50 µs each) after the first.
        let p = predict(&Algorithm::Ddp, &work(600_000, 5e-3), &two_hosts(1)).unwrap();
        let wire = 2.4e6 / (125e6 * 1448.0 / 1514.0);
        let pieces = 9.0 * 50e-6;
        close(p.comm_s, 50e-6 + 50e-6 + pieces + wire);
        close(p.steady_s, 5e-3 + 100e-6 + pieces + wire);
        close(p.payload_bytes, 2_400_008.0);
        close(p.payload_data_bytes, 2_400_000.0);
        close(p.link_bytes, 2.4e6);
        close(p.wire_bytes, 4.8e6);
        close(p.wire_s, wire);
        close(p.lower_bound_s, wire);
    }

    #[test]
    fn overlap_hides_the_average_behind_the_next_iterations() {
        // 600k parameters on 2 hosts x 1 rank at 1 Gbit/s: the average (2.4 MB in 10 pieces)
        // takes 10 x 50 us + 2.4 MB / goodput ~ 20.6 ms, a control collective 50 us. Period 4,
        // compute 5 ms.
        let w = work(600_000, 5e-3);
        let wire = 2.4e6 / (125e6 * 1448.0 / 1514.0);
        let avg = 10.0 * 50e-6 + wire;
        let control = 50e-6;
        let periodic = |overlap| Algorithm::Periodic {
            period: 4,
            gradient_warmup: false,
            overlap,
            compression: None,
        };
        let blocking = predict(&periodic(0), &w, &two_hosts(1)).unwrap();
        // Per 4 iterations: 4 has-data flags, one fingerprint, the average in sequence.
        close(
            blocking.steady_s,
            5e-3 + (4.0 * control + control + avg) / 4.0,
        );
        // Delay 1 hides one iteration of compute, delay 4 four (20 ms: all but 0.58 ms of the
        // average); with 6 ms of compute, delay 4 hides all of it.
        let one = predict(&periodic(1), &w, &two_hosts(1)).unwrap();
        close(
            one.steady_s,
            5e-3 + (4.0 * control + control + avg - 5e-3) / 4.0,
        );
        let four = predict(&periodic(4), &w, &two_hosts(1)).unwrap();
        close(
            four.steady_s,
            5e-3 + (4.0 * control + control + avg - 20e-3) / 4.0,
        );
        let slower = predict(&periodic(4), &work(600_000, 6e-3), &two_hosts(1)).unwrap();
        close(slower.steady_s, 6e-3 + (4.0 * control + control) / 4.0);
        // Same bytes as blocking, plus the helper's communicator once, at the first average.
        let s = Schedule::new(&periodic(1), 2, &w).unwrap();
        assert_eq!(s.payload(0), (8 + 8 + 32 + 2_400_000, 2_400_000));
        assert_eq!(s.payload(4), (8 + 32 + 2_400_000, 2_400_000));
        close(one.payload_bytes, blocking.payload_bytes);
        // A delay past the period is refused, naming the bound.
        let e = Schedule::new(&periodic(5), 2, &w).unwrap_err().to_string();
        assert!(e.contains("overlap") && e.contains("period 4"), "{e}");
    }

    #[test]
    fn overhead_copies_and_burst_by_hand() {
        // 1000 parameters = 4000 B; 2 hosts x 1 rank; copies at 4 GB/s cost 1 µs per average.
        let w = Workload {
            overhead_s: 0.1e-3,
            copy_bytes_per_second: 4e9,
            ..work(1000, 1e-3)
        };
        let mut c = two_hosts(1);
        let ddp = predict(&Algorithm::Ddp, &w, &c).unwrap();
        let wire = 4000.0 / c.link.goodput();
        close(ddp.steady_s, 1e-3 + 0.1e-3 + 50e-6 + 50e-6 + wire + 1e-6);
        // A 256 KiB burst covers the whole 4000 B (1.1 ms of idle refills far more than that).
        c.link.burst_bytes = 262_144.0;
        let ddp = predict(&Algorithm::Ddp, &w, &c).unwrap();
        close(ddp.steady_s, 1e-3 + 0.1e-3 + 50e-6 + 50e-6 + 1e-6);
        // A 2.4 MB all-reduce: the link has been idle for the compute and overhead (1.1 ms),
        // the has-data all-gather and the all-reduce's own latency (50 µs each), and the
        // write-back and flatten halves of the 0.6 ms copy (0.3 ms each): 1.8 ms of refill,
        // less than the burst; credit in payload bytes.
        let big = Workload {
            params: 600_000,
            ..w
        };
        let eff: f64 = 1448.0 / 1514.0;
        let idle = 1.1e-3 + 50e-6 + 50e-6 + 0.3e-3 + 0.3e-3;
        let credit = (262_144.0 * eff).min(idle * 125e6 * eff);
        assert!(credit < 262_144.0 * eff);
        let p = predict(&Algorithm::Ddp, &big, &c).unwrap();
        // 9 pieces after the first, 50 µs each.
        close(
            p.comm_s,
            50e-6 + 50e-6 + 9.0 * 50e-6 + (2.4e6 - credit) / c.link.goodput() + 2.4e6 / 4e9,
        );
    }

    #[test]
    fn the_burst_passes_at_the_path_rate() {
        // 1 Gbit/s (goodput 1448/1514 * 125 MB/s), a 256 KiB burst, 4000 B all-reduced per
        // iteration (all of it covered by the credit): at once, the wire costs nothing; through
        // a path of 1 GB/s it costs 4000 B / 1 GB/s = 4 µs; a path slower than the goodput
        // would be the link itself, so it saves nothing.
        let w = work(1000, 1e-3);
        let mut c = two_hosts(1);
        c.link.burst_bytes = 262_144.0;
        let steady = |c: &Cluster| predict(&Algorithm::Ddp, &w, c).unwrap().steady_s;
        let at_once = steady(&c);
        close(at_once, 1e-3 + 50e-6 + 50e-6);
        c.link.burst_bytes_per_second = 1e9;
        close(steady(&c), at_once + 4e-6);
        c.link.burst_bytes_per_second = 100e6;
        close(steady(&c), at_once + 4000.0 / c.link.goodput());
    }

    /// 2 hosts x 1 rank at 100 Mbit/s with a 1 ms latency and a shaper's `burst` bytes.
    fn two_hosts_at_100_mbit(burst: f64) -> Cluster {
        let mut c = Cluster::new(
            Layout {
                hosts: 2,
                ranks_per_host: 1,
            },
            Link::gbit(0.1, 1e-3),
        );
        c.link.burst_bytes = burst;
        c
    }

    #[test]
    fn the_bucket_refills_during_latency() {
        // 7500 parameters = 30 KB over 2 hosts x 1 rank at 100 Mbit/s, 0.3 ms of compute, a
        // 1 ms latency (ranks waiting for one the scheduler has not run): the link is idle
        // for the compute, the has-data all-gather and the all-reduce's own latency, 2.3 ms,
        // which refills 2.3 ms x 12.5 MB/s x 1448/1514 = 27.5 KB of the 256 KiB burst.
        let c = two_hosts_at_100_mbit(262_144.0);
        let p = predict(&Algorithm::Ddp, &work(7500, 0.3e-3), &c).unwrap();
        let eff: f64 = 1448.0 / 1514.0;
        let credit = 2.3e-3 * 12.5e6 * eff;
        close(
            p.steady_s,
            0.3e-3 + 1e-3 + 1e-3 + (30_000.0 - credit) / (12.5e6 * eff),
        );
        // 0.21 ms of it is left on the wire: 2.51 ms in all, where refilling during the compute
        // alone would leave 2.21 ms on the wire (4.51 ms).
        assert!((p.steady_s - 2.509e-3).abs() < 0.001e-3, "{}", p.steady_s);
    }

    #[test]
    fn a_run_spends_the_full_bucket_first() {
        // The setting of `the_bucket_refills_during_latency` with a 100 kB burst: each
        // iteration sends 30 kB and refills 2.3 ms x 12.5 MB/s x 1448/1514 = 27.50 kB, so a
        // bucket full at the start loses 2.50 kB per iteration and covers the whole all-reduce
        // while it holds 30 kB: iterations 0 ..= 26 ((95.64 - 30) / 2.50 = 26.2), part of
        // iteration 27 (28.05 kB), and from iteration 28 on the refill alone (the steady state).
        let mut c = two_hosts_at_100_mbit(100_000.0);
        let w = work(7500, 0.3e-3);
        let eff: f64 = 1448.0 / 1514.0;
        let goodput = 12.5e6 * eff;
        let refill = 2.3e-3 * goodput;
        let seconds = run_seconds(&Algorithm::Ddp, &w, &c, 40).unwrap();
        assert_eq!(seconds.len(), 40);
        let free = 0.3e-3 + 1e-3 + 1e-3;
        for (i, s) in seconds.iter().enumerate().take(27) {
            assert!((s - free).abs() < 1e-12, "iteration {i}: {s}");
        }
        let left = 100_000.0 * eff - 27.0 * (30_000.0 - refill);
        close(seconds[27], free + (30_000.0 - left) / goodput);
        let steady = predict(&Algorithm::Ddp, &w, &c).unwrap().steady_s;
        close(steady, free + (30_000.0 - refill) / goodput);
        for s in &seconds[28..] {
            close(*s, steady);
        }
        // No burst (a real NIC): every iteration is the steady one.
        c.link.burst_bytes = 0.0;
        let seconds = run_seconds(&Algorithm::Ddp, &w, &c, 5).unwrap();
        let steady = predict(&Algorithm::Ddp, &w, &c).unwrap().steady_s;
        close(steady, free + 30_000.0 / goodput);
        for s in &seconds {
            close(*s, steady);
        }
    }
}
