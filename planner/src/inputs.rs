//! What `localsgd plan` is asked, in the units of its flags: checked, turned into a
//! [`Cluster`] and a [`Workload`], and planned for every algorithm named ([`PlanInputs::plan`]).

use crate::algorithm::Algorithm;
use crate::cluster::{Cluster, Layout};
use crate::error::{PlanError, invalid_input};
use crate::link::Link;
use crate::predict::{Prediction, predict, run_seconds};
use crate::recommend::{recommend_levels, recommend_period};
use crate::schedule::Schedule;
use crate::workload::Workload;
use localsgd_averagers::{AverageCompression, Level};
use localsgd_comm::codec::CodecError;

/// The most iterations a [`RunListing`] lists (three numbers each).
pub const MAX_LISTED_STEPS: u64 = 1_000_000;

/// The longest averaging period the recommendations consider.
const MAX_RECOMMENDED_PERIOD: u64 = 4096;

/// The algorithm names [`PlanInputs::algorithms`] takes.
const ALGORITHM_NAMES: &str = "ddp, local-sgd, post-local-sgd, hierarchical, diloco, slowmo";

/// What `localsgd plan` is asked, in the units of its flags (milliseconds, microseconds, Gbit/s,
/// GB/s, KiB). [`plan`](Self::plan) checks every input, naming the flag of one out of range
/// ([`PlanError::Input`]), and predicts each algorithm.
///
/// ```
/// use localsgd_planner::PlanInputs;
///
/// let inputs = PlanInputs {
///     params: 600_000,
///     compute_ms: 5.0,
///     hosts: 2,
///     ranks_per_host: 1,
///     algorithms: vec!["ddp".into(), "post-local-sgd".into()],
///     ..PlanInputs::default()
/// };
/// let plan = inputs.plan()?;
/// assert_eq!(plan.predictions[1].0.label(), "post-local-sgd period 4");
/// assert!(plan.predictions[0].1.comm_s > plan.predictions[1].1.comm_s);
/// assert!(plan.recommended_period.is_some());
///
/// let bad = PlanInputs { link_gbit: 0.0, ..inputs };
/// assert_eq!(bad.plan().unwrap_err().to_string(), "invalid --link-gbit 0: must be a positive number");
/// # Ok::<(), localsgd_planner::PlanError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PlanInputs {
    /// Number of f32 parameters (at least 1).
    pub params: u64,
    /// Measured compute per iteration (forward, backward, optimizer step), ms.
    pub compute_ms: f64,
    /// The pipeline's own fixed cost per iteration, ms.
    pub overhead_ms: f64,
    /// GB/s of buffer the pipeline handles around a data collective (flatten, mean, write
    /// back); `f64::INFINITY`: free.
    pub copy_gbps: f64,
    /// Token-bucket burst of the links in bytes; 0 for a real NIC.
    pub burst_bytes: f64,
    /// GB/s of payload at which that burst passes; `f64::INFINITY`: at once.
    pub burst_gbps: f64,
    /// Number of hosts (at least 1).
    pub hosts: usize,
    /// Ranks on each host (at least 1).
    pub ranks_per_host: usize,
    /// Each host's link rate to the switch, Gbit/s.
    pub link_gbit: f64,
    /// Time of one small collective across hosts between steps, µs (below 0: 0).
    pub latency_us: f64,
    /// Largest piece of one all-reduce, KiB; 0: the whole buffer at once.
    pub piece_kib: f64,
    /// Time each piece after the first adds across hosts, µs; `None`: `latency_us`.
    pub piece_latency_us: Option<f64>,
    /// Link MTU in bytes.
    pub mtu: f64,
    /// Bandwidth between ranks on one host, GB/s.
    pub intra_gbps: f64,
    /// Time of one small collective inside a host, µs (below 0: 0).
    pub intra_latency_us: f64,
    /// Algorithm names: ddp, local-sgd, post-local-sgd, hierarchical, diloco, slowmo.
    pub algorithms: Vec<String>,
    /// Averaging period (local-sgd, post-local-sgd; diloco and slowmo: local steps between
    /// outer steps; hierarchical: the period of [`default_levels`]).
    pub period: u64,
    /// Overlapped averaging delay of local-sgd and post-local-sgd (0: blocking).
    pub overlap: u64,
    /// Hierarchical levels; empty: [`default_levels`].
    pub levels: Vec<Level>,
    /// Warmup iterations.
    pub warmup: u64,
    /// Loss all-reduce every this many iterations (0: never).
    pub log_every: u64,
    /// Gradients compressed to fp16/bf16.
    pub compressed: bool,
    /// DiLoCo's and SlowMo's pseudo-gradients, and the averages of local-sgd, post-local-sgd
    /// and hierarchical's world level (each the delta from the last average), on the wire
    /// (`None`: f32): half precision, or a lossy codec (its bytes per sync
    /// [`AverageCompression::wire_bytes`], all-gathered). Also the recommendations' averages.
    /// Refused where every algorithm named is ddp, which has nothing to compress.
    pub average_compression: Option<AverageCompression>,
    /// Pipelined gradient sync.
    pub pipelined: bool,
    /// Target share of communication in a steady iteration, for the recommendations.
    pub target_comm_share: f64,
    /// Iterations of a run to list (at most [`MAX_LISTED_STEPS`]); `None`: none.
    pub steps: Option<u64>,
}

impl Default for PlanInputs {
    /// The defaults of `localsgd plan`'s flags, with 1 parameter and no compute.
    fn default() -> Self {
        Self {
            params: 1,
            compute_ms: 0.0,
            overhead_ms: 0.0,
            copy_gbps: f64::INFINITY,
            burst_bytes: 0.0,
            burst_gbps: f64::INFINITY,
            hosts: 1,
            ranks_per_host: 2,
            link_gbit: 1.0,
            latency_us: 50.0,
            piece_kib: (localsgd_comm::MPI_PIECE_BYTES / 1024) as f64,
            piece_latency_us: None,
            mtu: 1500.0,
            intra_gbps: 5.0,
            intra_latency_us: 5.0,
            algorithms: ["ddp", "post-local-sgd", "hierarchical"]
                .map(String::from)
                .to_vec(),
            period: 4,
            overlap: 0,
            levels: Vec::new(),
            warmup: 0,
            log_every: 0,
            compressed: false,
            average_compression: None,
            pipelined: true,
            target_comm_share: 0.1,
            steps: None,
        }
    }
}

/// What [`PlanInputs::plan`] predicts.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Number of f32 parameters.
    pub params: u64,
    /// The machines the inputs describe.
    pub cluster: Cluster,
    /// What is trained.
    pub workload: Workload,
    /// Every algorithm asked for, in order, with its figures.
    pub predictions: Vec<(Algorithm, Prediction)>,
    /// The smallest post-local SGD period (up to 4096) that meets the target share, its
    /// averages in [`PlanInputs::average_compression`] ([`recommend_period`]).
    pub recommended_period: Option<u64>,
    /// Two hierarchical levels that meet the target share, the world's averages in
    /// [`PlanInputs::average_compression`] ([`recommend_levels`]); `None` without a host level or
    /// when no pair meets it.
    pub recommended_levels: Option<Vec<Level>>,
}

/// One algorithm's run of a number of iterations, iteration by iteration ([`Plan::run`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunListing {
    /// Rank 0's payload bytes of each iteration, `(all, float data)`, as `metrics.csv` counts
    /// them ([`Schedule::payload`]).
    pub payload_per_iteration: Vec<(u64, u64)>,
    /// Bytes per iteration on the busiest host link over the run, warmup included.
    pub link_bytes_per_iteration: f64,
    /// Each iteration's predicted seconds, the links' token buckets full at the start
    /// ([`run_seconds`]).
    pub iteration_seconds: Vec<f64>,
}

impl RunListing {
    /// The run's predicted seconds: the sum of its iterations'.
    pub fn seconds(&self) -> f64 {
        self.iteration_seconds.iter().sum()
    }
}

impl PlanInputs {
    /// Check the inputs and predict every algorithm named, with the recommendations.
    pub fn plan(&self) -> Result<Plan, PlanError> {
        if self.hosts == 0 || self.ranks_per_host == 0 {
            return Err(PlanError::Layout {
                hosts: self.hosts,
                ranks_per_host: self.ranks_per_host,
            });
        }
        if !(self.compute_ms.is_finite() && self.compute_ms >= 0.0) {
            return Err(invalid_input(
                "compute-ms",
                self.compute_ms,
                "a non-negative number of milliseconds (measure it with `localsgd bench-step`)",
            ));
        }
        if let Some(steps) = self.steps {
            check_listed_steps(steps)?;
        }
        if self.params == 0 {
            return Err(invalid_input("params", 0, "at least 1 parameter"));
        }
        if let Some(c) = self.average_compression
            && let (Err(e), AverageCompression::Lossy { spec, .. }) = (c.validate(), c)
        {
            return Err(match e {
                CodecError::ZeroChunk | CodecError::ChunkTooLarge { .. } => {
                    invalid_input("average-compression-chunk", spec.chunk, &e.to_string())
                }
                e => invalid_input("average-compression", spec.codec, &e.to_string()),
            });
        }
        let cluster = self.cluster()?;
        let workload = self.workload()?;
        if self.algorithms.is_empty() {
            return Err(invalid_input(
                "algorithms",
                "\"\"",
                &format!("name at least one of {ALGORITHM_NAMES}"),
            ));
        }
        let algorithms = self
            .algorithms
            .iter()
            .map(|name| self.algorithm(name.trim(), cluster.layout))
            .collect::<Result<Vec<_>, _>>()?;
        // DDP averages no models: a compression that applies to none of the algorithms named is
        // refused rather than ignored (beside others, ddp is planned as it is).
        if let Some(c) = self.average_compression
            && algorithms.iter().all(|a| *a == Algorithm::Ddp)
        {
            let value = match c {
                AverageCompression::Lossy { spec, .. } => spec.codec.to_string(),
                half => half.to_string(),
            };
            return Err(invalid_input(
                "average-compression",
                value,
                "none with ddp, which averages no models (it compresses diloco's \
                 pseudo-gradients and the averages of local-sgd, post-local-sgd and \
                 hierarchical's world level)",
            ));
        }
        let mut predictions = Vec::with_capacity(algorithms.len());
        for algorithm in algorithms {
            let prediction = predict(&algorithm, &workload, &cluster)?;
            predictions.push((algorithm, prediction));
        }
        let target = self.target_comm_share;
        let compression = self.average_compression;
        let recommended_period = recommend_period(
            &workload,
            &cluster,
            compression,
            target,
            MAX_RECOMMENDED_PERIOD,
        )?;
        let recommended_levels = recommend_levels(
            &workload,
            &cluster,
            compression,
            target,
            MAX_RECOMMENDED_PERIOD,
        )?;
        Ok(Plan {
            params: self.params,
            cluster,
            workload,
            predictions,
            recommended_period,
            recommended_levels,
        })
    }

    /// The layout and links, each rate checked.
    fn cluster(&self) -> Result<Cluster, PlanError> {
        let latency_s = self.latency_us.max(0.0) * 1e-6;
        Ok(Cluster {
            layout: Layout {
                hosts: self.hosts,
                ranks_per_host: self.ranks_per_host,
            },
            link: Link {
                bits_per_second: positive("link-gbit", self.link_gbit)? * 1e9,
                latency_s,
                mtu: self.mtu,
                burst_bytes: self.burst_bytes,
                burst_bytes_per_second: bytes_per_second_or_unlimited(
                    "burst-gbps",
                    self.burst_gbps,
                )?,
            },
            intra_bytes_per_second: positive("intra-gbps", self.intra_gbps)? * 1e9,
            intra_latency_s: self.intra_latency_us.max(0.0) * 1e-6,
            piece_bytes: non_negative("piece-kib", self.piece_kib)? * 1024.0,
            piece_latency_s: match self.piece_latency_us {
                Some(us) => non_negative("piece-latency-us", us)? * 1e-6,
                None => latency_s,
            },
        })
    }

    /// What is trained, the copy rate checked.
    fn workload(&self) -> Result<Workload, PlanError> {
        Ok(Workload {
            params: self.params,
            compute_s: self.compute_ms * 1e-3,
            overhead_s: self.overhead_ms * 1e-3,
            // Infinite means the pipeline's own copies are free.
            copy_bytes_per_second: bytes_per_second_or_unlimited("copy-gbps", self.copy_gbps)?,
            warmup: self.warmup,
            log_every: self.log_every,
            compressed: self.compressed,
            pipelined: self.pipelined,
        })
    }

    /// The algorithm of a name, with these inputs' period, overlap, levels and outer
    /// compression.
    fn algorithm(&self, name: &str, layout: Layout) -> Result<Algorithm, PlanError> {
        Ok(match name {
            "ddp" => Algorithm::Ddp,
            "local-sgd" | "post-local-sgd" => Algorithm::Periodic {
                period: self.period,
                gradient_warmup: name == "post-local-sgd",
                overlap: self.overlap,
                compression: self.average_compression,
            },
            "hierarchical" => Algorithm::Hierarchical {
                levels: if self.levels.is_empty() {
                    default_levels(layout, self.period)
                } else {
                    self.levels.clone()
                },
                compression: self.average_compression,
            },
            "streaming-diloco" => return Err(PlanError::StreamingDiloco),
            "diloco" | "slowmo" => Algorithm::Outer {
                period: self.period,
                slowmo: name == "slowmo",
                compression: self.average_compression,
            },
            other => {
                return Err(PlanError::UnknownAlgorithm {
                    name: other.to_string(),
                });
            }
        })
    }
}

impl Plan {
    /// A run of `steps` iterations (at most [`MAX_LISTED_STEPS`]) of one of the planned
    /// algorithms, iteration by iteration; `prediction` is the algorithm's
    /// ([`predictions`](Self::predictions)).
    pub fn run(
        &self,
        algorithm: &Algorithm,
        prediction: &Prediction,
        steps: u64,
    ) -> Result<RunListing, PlanError> {
        check_listed_steps(steps)?;
        let work = &self.workload;
        let schedule = Schedule::new(algorithm, self.cluster.layout.world(), work)?;
        let warm = steps.min(work.warmup) as f64;
        Ok(RunListing {
            payload_per_iteration: (0..steps).map(|i| schedule.payload(i)).collect(),
            link_bytes_per_iteration: (warm * prediction.warmup_link_bytes
                + (steps as f64 - warm) * prediction.link_bytes)
                / steps.max(1) as f64,
            iteration_seconds: run_seconds(algorithm, work, &self.cluster, steps)?,
        })
    }
}

/// The ranks of a host every `period`, the world every `4 * period`; on an even number (more
/// than 2) of one-rank hosts, pairs of hosts every `period` and the world every `4 * period`;
/// otherwise the world every `period`: the levels `localsgd plan` gives hierarchical averaging
/// when none are named (`bench/bench-matrix` uses the same rule).
pub fn default_levels(layout: Layout, period: u64) -> Vec<Level> {
    let w = layout.world();
    let pairs = if layout.has_host_level() {
        vec![(period, layout.ranks_per_host), (4 * period, w)]
    } else if layout.ranks_per_host == 1 && layout.hosts > 2 && w.is_multiple_of(2) {
        vec![(period, 2), (4 * period, w)]
    } else {
        vec![(period, w)]
    };
    pairs.into_iter().map(Level::from).collect()
}

fn check_listed_steps(steps: u64) -> Result<(), PlanError> {
    if steps > MAX_LISTED_STEPS {
        return Err(invalid_input(
            "steps",
            steps,
            &format!("at most {MAX_LISTED_STEPS} (the JSON lists every iteration's bytes)"),
        ));
    }
    Ok(())
}

fn non_negative(flag: &'static str, v: f64) -> Result<f64, PlanError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(invalid_input(flag, v, "must be a number at least 0"))
    }
}

fn positive(flag: &'static str, v: f64) -> Result<f64, PlanError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(invalid_input(flag, v, "must be a positive number"))
    }
}

/// A rate in GB/s as bytes per second: positive, or `f64::INFINITY` for no limit.
fn bytes_per_second_or_unlimited(flag: &'static str, gbps: f64) -> Result<f64, PlanError> {
    if gbps == f64::INFINITY {
        Ok(gbps)
    } else {
        Ok(positive(flag, gbps)? * 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use localsgd_comm::Precision;

    fn inputs() -> PlanInputs {
        PlanInputs {
            params: 4810,
            compute_ms: 1.0,
            ..PlanInputs::default()
        }
    }

    #[test]
    fn inputs_out_of_range_name_their_flag() {
        let err = |i: PlanInputs| i.plan().unwrap_err().to_string();
        assert_eq!(
            err(PlanInputs {
                hosts: 0,
                ..inputs()
            }),
            "invalid layout --hosts 0 --ranks-per-host 2: both must be at least 1"
        );
        assert_eq!(
            err(PlanInputs {
                compute_ms: -1.0,
                ..inputs()
            }),
            "invalid --compute-ms -1: a non-negative number of milliseconds (measure it with \
             `localsgd bench-step`)"
        );
        assert_eq!(
            err(PlanInputs {
                steps: Some(MAX_LISTED_STEPS + 1),
                ..inputs()
            }),
            "invalid --steps 1000001: at most 1000000 (the JSON lists every iteration's bytes)"
        );
        assert_eq!(
            err(PlanInputs {
                params: 0,
                ..inputs()
            }),
            "invalid --params 0: at least 1 parameter"
        );
        assert_eq!(
            err(PlanInputs {
                intra_gbps: f64::NAN,
                ..inputs()
            }),
            "invalid --intra-gbps NaN: must be a positive number"
        );
        assert_eq!(
            err(PlanInputs {
                piece_latency_us: Some(f64::INFINITY),
                ..inputs()
            }),
            "invalid --piece-latency-us inf: must be a number at least 0"
        );
        assert_eq!(
            err(PlanInputs {
                algorithms: Vec::new(),
                ..inputs()
            }),
            "invalid --algorithms \"\": name at least one of ddp, local-sgd, post-local-sgd, \
             hierarchical, diloco, slowmo"
        );
        assert_eq!(
            err(PlanInputs {
                algorithms: vec!["foo".into()],
                ..inputs()
            }),
            "invalid --algorithms entry \"foo\": valid: ddp, local-sgd, post-local-sgd, \
             hierarchical, diloco, slowmo"
        );
        assert_eq!(
            err(PlanInputs {
                algorithms: vec!["streaming-diloco".into()],
                ..inputs()
            }),
            PlanError::StreamingDiloco.to_string()
        );
        // A lossy codec's chunk and fraction, named as the flags that give them.
        let lossy = |codec: &str, chunk| {
            let mut c = AverageCompression::lossy(codec.parse().unwrap());
            if let AverageCompression::Lossy { spec, .. } = &mut c {
                spec.chunk = chunk;
            }
            Some(c)
        };
        assert_eq!(
            err(PlanInputs {
                average_compression: lossy("int8", 0),
                ..inputs()
            }),
            "invalid --average-compression-chunk 0: codec chunk 0 is invalid (valid: chunk >= 1)"
        );
        assert!(
            err(PlanInputs {
                average_compression: lossy("topk:0.1", 70000),
                ..inputs()
            })
            .starts_with(
                "invalid --average-compression-chunk 70000: codec chunk 70000 is too large"
            )
        );
        // The cost model's own checks come through as they are.
        assert!(
            err(PlanInputs {
                period: 0,
                ..inputs()
            })
            .contains("`period` = 0")
        );
    }

    #[test]
    fn names_become_algorithms_with_the_inputs_settings() {
        let i = PlanInputs {
            hosts: 4,
            ranks_per_host: 2,
            overlap: 1,
            algorithms: [
                " ddp",
                "local-sgd",
                "post-local-sgd",
                "hierarchical",
                "diloco",
            ]
            .map(String::from)
            .to_vec(),
            ..inputs()
        };
        let plan = i.plan().unwrap();
        let labels: Vec<String> = plan.predictions.iter().map(|(a, _)| a.label()).collect();
        assert_eq!(
            labels,
            [
                "ddp",
                "local-sgd period 4 overlap 1",
                "post-local-sgd period 4 overlap 1",
                "hierarchical 4:2,16:8",
                "diloco period 4",
            ]
        );
        // The outer compression goes to every algorithm that averages models (blocking: an
        // overlap is refused with it); ddp, beside them, is planned as it is.
        let half = Some(Precision::Fp16.into());
        let plan = PlanInputs {
            overlap: 0,
            average_compression: half,
            ..i.clone()
        }
        .plan()
        .unwrap();
        let algorithms: Vec<Algorithm> = plan.predictions.into_iter().map(|(a, _)| a).collect();
        assert_eq!(
            algorithms,
            [
                Algorithm::Ddp,
                Algorithm::Periodic {
                    period: 4,
                    gradient_warmup: false,
                    overlap: 0,
                    compression: half,
                },
                Algorithm::Periodic {
                    period: 4,
                    gradient_warmup: true,
                    overlap: 0,
                    compression: half,
                },
                Algorithm::Hierarchical {
                    levels: vec![Level::from((4, 2)), Level::from((16, 8))],
                    compression: half,
                },
                Algorithm::Outer {
                    period: 4,
                    slowmo: false,
                    compression: half,
                },
            ]
        );
        // Given levels win over the default ones.
        let given = vec![Level::from((2, 2)), Level::from((8, 8))];
        let plan = PlanInputs {
            algorithms: vec!["hierarchical".into()],
            levels: given.clone(),
            ..i
        }
        .plan()
        .unwrap();
        assert_eq!(
            plan.predictions[0].0,
            Algorithm::Hierarchical {
                levels: given,
                compression: None
            }
        );
    }

    #[test]
    fn average_compression_needs_an_algorithm_that_averages_models() {
        let lossy = |codec: &str| Some(AverageCompression::lossy(codec.parse().unwrap()));
        let err = |algorithms: &[&str], average_compression, overlap| {
            PlanInputs {
                algorithms: algorithms.iter().map(|&a| a.into()).collect(),
                average_compression,
                overlap,
                ..inputs()
            }
            .plan()
            .unwrap_err()
            .to_string()
        };
        // DDP alone has nothing to compress: refused, naming the value and what takes it.
        let e = err(&["ddp"], lossy("int8"), 0);
        assert!(
            e.starts_with("invalid --average-compression int8: none with ddp"),
            "{e}"
        );
        assert!(
            e.contains("local-sgd, post-local-sgd and hierarchical's world level"),
            "{e}"
        );
        let e = err(&["ddp", " ddp"], Some(Precision::Bf16.into()), 0);
        assert!(
            e.starts_with("invalid --average-compression bf16: none with ddp"),
            "{e}"
        );
        // SlowMo's slow step takes the averaged parameters: refused, as `localsgd train` does.
        let e = err(&["slowmo"], lossy("int8"), 0);
        assert!(e.contains("none with slowmo"), "{e}");
        // A compressed average blocks: an overlap is refused, named.
        for name in ["local-sgd", "post-local-sgd"] {
            let e = err(&[name], lossy("int4"), 1);
            assert!(
                e.contains("`overlap` = 1: 0 with average-compression"),
                "{name}: {e}"
            );
        }
        // The recommendations average in the same wire format: int8 sends about a quarter of
        // f32's bytes, so the recommended post-local SGD period is no longer.
        let plan = |average_compression| {
            PlanInputs {
                params: 600_000,
                compute_ms: 5.0,
                hosts: 2,
                ranks_per_host: 2,
                algorithms: vec!["post-local-sgd".into()],
                average_compression,
                ..PlanInputs::default()
            }
            .plan()
            .unwrap()
        };
        let (f32, int8) = (plan(None), plan(lossy("int8")));
        let (p32, p8) = (
            f32.recommended_period.unwrap(),
            int8.recommended_period.unwrap(),
        );
        assert!(p8 < p32, "int8 {p8}, f32 {p32}");
        let world = |p: &Plan| p.recommended_levels.as_ref().unwrap()[1].period;
        assert!(
            world(&int8) < world(&f32),
            "int8 {}, f32 {}",
            world(&int8),
            world(&f32)
        );
    }

    #[test]
    fn default_levels_follow_the_layout() {
        let levels = |hosts, ranks_per_host| {
            let l = default_levels(
                Layout {
                    hosts,
                    ranks_per_host,
                },
                4,
            );
            l.iter()
                .map(|l| (l.period, l.group_size))
                .collect::<Vec<_>>()
        };
        assert_eq!(levels(2, 2), [(4, 2), (16, 4)]);
        assert_eq!(levels(4, 1), [(4, 2), (16, 4)]);
        assert_eq!(levels(3, 1), [(4, 3)]);
        assert_eq!(levels(1, 4), [(4, 4)]);
    }

    #[test]
    fn a_run_lists_every_iteration() {
        let i = PlanInputs {
            hosts: 2,
            ranks_per_host: 1,
            warmup: 3,
            algorithms: vec!["post-local-sgd".into()],
            ..inputs()
        };
        let plan = i.plan().unwrap();
        let (a, p) = &plan.predictions[0];
        let run = plan.run(a, p, 10).unwrap();
        assert_eq!(run.payload_per_iteration.len(), 10);
        assert_eq!(run.iteration_seconds.len(), 10);
        let schedule = Schedule::new(a, 2, &plan.workload).unwrap();
        assert_eq!(run.payload_per_iteration[3], schedule.payload(3));
        let want = (3.0 * p.warmup_link_bytes + 7.0 * p.link_bytes) / 10.0;
        assert!((run.link_bytes_per_iteration - want).abs() < 1e-9);
        assert!((run.seconds() - run.iteration_seconds.iter().sum::<f64>()).abs() < 1e-15);
        assert!(plan.run(a, p, MAX_LISTED_STEPS + 1).is_err());
    }
}
