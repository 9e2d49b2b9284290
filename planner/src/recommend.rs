//! The averaging period, or the two hierarchical levels, that keep communication within a target
//! share of a steady iteration.

use crate::algorithm::Algorithm;
use crate::cluster::Cluster;
use crate::error::{PlanError, invalid};
use crate::predict::predict;
use crate::workload::Workload;
use localsgd_averagers::{AverageCompression, Level};

/// A target communication share must be a fraction strictly between 0 and 1.
fn check_target(target: f64) -> Result<(), PlanError> {
    if target > 0.0 && target < 1.0 {
        Ok(())
    } else {
        Err(invalid(
            "target-comm-share",
            target,
            "a fraction strictly between 0 and 1",
        ))
    }
}

/// The smallest averaging period up to `max_period` whose steady communication share is at
/// most `target` (periodic averaging over the world, its averages in `compression`'s wire
/// format, found by bisection, as the share falls with the period), or `None` when even
/// `max_period` does not reach it (the per-iteration control collectives alone exceed it).
pub fn recommend_period(
    work: &Workload,
    cluster: &Cluster,
    compression: Option<AverageCompression>,
    target: f64,
    max_period: u64,
) -> Result<Option<u64>, PlanError> {
    check_target(target)?;
    let share = |period: u64| -> Result<f64, PlanError> {
        Ok(predict(
            &Algorithm::Periodic {
                period,
                gradient_warmup: true,
                overlap: 0,
                compression,
            },
            work,
            cluster,
        )?
        .comm_share)
    };
    // The share falls as the period grows (fewer averages per iteration): bisect.
    let (mut lo, mut hi) = (1, max_period.max(1));
    if share(hi)? > target {
        return Ok(None);
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if share(mid)? <= target {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(Some(lo))
}

/// Two hierarchical levels whose steady communication share is at most `target`: the ranks of
/// each host every `host_period` (a power of two) and the world every `world_period` (a
/// multiple of it, up to `max_period`), with the world level as frequent as the target allows
/// and, for that, the host level as frequent as it allows: the world average is the one that
/// keeps all ranks' models together, the host average the cheap one in between; the world's
/// averages in `compression`'s wire format. `None` where there is no host level (one host, or
/// one rank per host) or no pair reaches the target.
pub fn recommend_levels(
    work: &Workload,
    cluster: &Cluster,
    compression: Option<AverageCompression>,
    target: f64,
    max_period: u64,
) -> Result<Option<Vec<Level>>, PlanError> {
    check_target(target)?;
    let layout = cluster.layout;
    if !layout.has_host_level() {
        return Ok(None);
    }
    let levels = |host: u64, world: u64| {
        vec![
            Level::from((host, layout.ranks_per_host)),
            Level::from((world, layout.world())),
        ]
    };
    let share = |host: u64, world: u64| -> Result<f64, PlanError> {
        Ok(predict(
            &Algorithm::Hierarchical {
                levels: levels(host, world),
                compression,
            },
            work,
            cluster,
        )?
        .comm_share)
    };
    let mut best: Option<(u64, u64)> = None;
    let mut host = 1;
    while 2 * host <= max_period {
        // For this host period, the smallest world period, a multiple of it (as the model's
        // schedule needs), that meets the target; bisection over the multiple, as the share
        // falls when world averages give way to host ones.
        let (mut lo, mut hi) = (2, max_period / host);
        if share(host, hi * host)? <= target {
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if share(host, mid * host)? <= target {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            let world = lo * host;
            if best.is_none_or(|(_, w)| world < w) {
                best = Some((host, world));
            }
        }
        host *= 2;
    }
    Ok(best.map(|(host, world)| levels(host, world)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Layout;
    use crate::link::Link;
    use crate::test_util::{two_hosts, work};

    #[test]
    fn recommended_levels_are_the_most_frequent_world_average_that_meets_the_target() {
        // 600k parameters, 5 ms of compute, 2 hosts x 2 ranks at 1 Gbit/s: every pair of a
        // power-of-two host period and a multiple of it up to 64, checked by brute force.
        let w = work(600_000, 5e-3);
        let c = two_hosts(2);
        let share = |host: u64, world: u64| {
            predict(
                &Algorithm::Hierarchical {
                    levels: vec![Level::from((host, 2)), Level::from((world, 4))],
                    compression: None,
                },
                &w,
                &c,
            )
            .unwrap()
            .comm_share
        };
        for target in [0.05, 0.1, 0.2, 0.3] {
            let mut best: Option<(u64, u64)> = None;
            for host in [1, 2, 4, 8, 16, 32] {
                for world in (2 * host..=64).step_by(host as usize) {
                    if share(host, world) <= target
                        && best.is_none_or(|(h, wp)| world < wp || (world == wp && host < h))
                    {
                        best = Some((host, world));
                    }
                }
            }
            let got = recommend_levels(&w, &c, None, target, 64).unwrap();
            let want = best.map(|(h, wp)| vec![Level::from((h, 2)), Level::from((wp, 4))]);
            assert_eq!(got, want, "target {target}");
        }
        // A 10% target is met (the world every 20 steps or so), a 1% one is not up to 64.
        assert!(recommend_levels(&w, &c, None, 0.1, 64).unwrap().is_some());
        assert_eq!(recommend_levels(&w, &c, None, 0.01, 64).unwrap(), None);
        // No host level: one rank per host, or one host.
        assert_eq!(
            recommend_levels(&w, &two_hosts(1), None, 0.1, 64).unwrap(),
            None
        );
        let one_host = Cluster::new(
            Layout {
                hosts: 1,
                ranks_per_host: 4,
            },
            Link::gbit(1.0, 50e-6),
        );
        assert_eq!(
            recommend_levels(&w, &one_host, None, 0.1, 64).unwrap(),
            None
        );
        assert!(recommend_levels(&w, &c, None, 1.0, 64).is_err());
    }

    #[test]
    fn recommended_period_meets_the_target() {
        let w = work(600_000, 5e-3);
        let c = two_hosts(1);
        let p = recommend_period(&w, &c, None, 0.5, 1024).unwrap().unwrap();
        let at = |period| {
            predict(
                &Algorithm::Periodic {
                    period,
                    gradient_warmup: true,
                    overlap: 0,
                    compression: None,
                },
                &w,
                &c,
            )
            .unwrap()
            .comm_share
        };
        assert!(at(p) <= 0.5 && at(p - 1) > 0.5, "period {p}");
        assert!(recommend_period(&w, &c, None, 1.5, 8).is_err());
    }
}
