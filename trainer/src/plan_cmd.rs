//! `localsgd plan` (part of the binary): the cost model of [`localsgd_trainer::plan`] as a
//! command. From the model size, a measured compute time per iteration (`localsgd bench-step`),
//! the layout and the links it prints predicted milliseconds and bytes per iteration for each
//! algorithm and recommends an averaging period for a target communication share, and, with
//! several ranks on each of several hosts, two hierarchical levels for it.

use anyhow::{Context, Result, bail};
use localsgd_averagers::Level;
use localsgd_planner::{
    Algorithm, Cluster, Layout, Link, Prediction, Schedule, Workload, predict, recommend_levels,
    recommend_period, run_seconds,
};
use localsgd_trainer::config::{Compression, Levels};
use localsgd_trainer::model::MlpConfig;
use std::path::PathBuf;

/// Flags of `localsgd plan`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PlanFlags {
    /// Number of f32 parameters (default: the MLP of --input, --hidden, --classes).
    #[arg(long)]
    params: Option<u64>,
    /// MLP input width (64: digits, 784: 28x28 IDX images).
    #[arg(long, default_value_t = 64)]
    input: usize,
    /// MLP hidden widths, comma-separated ("" for none).
    #[arg(long, value_parser = localsgd_trainer::cli::parse_widths, default_value = "64")]
    hidden: localsgd_trainer::cli::Widths,
    /// MLP classes.
    #[arg(long, default_value_t = 10)]
    classes: usize,
    /// Measured compute per iteration in ms: forward, backward, optimizer step (`localsgd bench-step`).
    #[arg(long, allow_negative_numbers = true)]
    compute_ms: f64,
    /// The pipeline's own fixed cost per iteration in ms (the non-compute phases of a one-rank
    /// local-SGD run that never averages).
    #[arg(long, default_value_t = 0.0)]
    overhead_ms: f64,
    /// The pipeline's handling of a gradient all-reduce or model average (flatten, write back),
    /// GB/s of buffer our side handles around a data collective (flatten, mean, write back:
    /// `localsgd bench-step` prints it); inf: free.
    #[arg(long, default_value_t = f64::INFINITY)]
    copy_gbps: f64,
    /// Token-bucket burst of the links in bytes (`tc ... tbf burst`); 0 for a real NIC.
    #[arg(long, default_value_t = 0.0)]
    burst_bytes: f64,
    /// GB/s of payload at which that burst passes: what the hosts' network path moves
    /// unshaped (an all-reduce between the hosts with no shaper: `localsgd bench-comm`); inf:
    /// at once.
    #[arg(long, default_value_t = f64::INFINITY)]
    burst_gbps: f64,
    /// Number of hosts.
    #[arg(long, default_value_t = 1)]
    hosts: usize,
    /// Ranks on each host.
    #[arg(long, default_value_t = 2)]
    ranks_per_host: usize,
    /// Each host's link rate to the switch, Gbit/s (full duplex).
    #[arg(long, default_value_t = 1.0)]
    link_gbit: f64,
    /// Time of one small collective across hosts between steps, µs (`localsgd bench-step
    /// --backend mpi`: its step-and-all-reduce cycle less its mean step).
    #[arg(long, default_value_t = 50.0)]
    latency_us: f64,
    /// Largest piece of one all-reduce, KiB: the MPI backend runs every all-reduce in pieces of
    /// at most 256 KiB, one after the other, each piece after the first adding
    /// --piece-latency-us; 0: the whole buffer at once (threads, NCCL).
    #[arg(long, default_value_t = (localsgd_comm::MPI_PIECE_BYTES / 1024) as f64)]
    piece_kib: f64,
    /// Time each piece after the first adds across hosts, µs: one small collective with every
    /// rank already inside (`localsgd bench-comm --gap-us`); default: --latency-us.
    #[arg(long)]
    piece_latency_us: Option<f64>,
    /// Link MTU in bytes.
    #[arg(long, default_value_t = 1500.0)]
    mtu: f64,
    /// Bandwidth between ranks on one host, GB/s.
    #[arg(long, default_value_t = 5.0)]
    intra_gbps: f64,
    /// Time of one small collective inside a host, µs.
    #[arg(long, default_value_t = 5.0)]
    intra_latency_us: f64,
    /// Algorithms, comma-separated: ddp, local-sgd, post-local-sgd, hierarchical, diloco,
    /// slowmo.
    #[arg(
        long,
        alias = "algorithm",
        value_delimiter = ',',
        default_value = "ddp,post-local-sgd,hierarchical"
    )]
    algorithms: Vec<String>,
    /// Averaging period (local-sgd, post-local-sgd; diloco and slowmo: local steps between
    /// outer steps).
    #[arg(long, default_value_t = 4)]
    period: u64,
    /// Overlapped averaging delay for local-sgd and post-local-sgd (0: blocking; at most
    /// --period).
    #[arg(long, default_value_t = 0)]
    overlap: u64,
    /// Hierarchical levels "period:group-size,..." (default: the ranks of a host every
    /// --period, the world every 4 x --period; on an even number (> 2) of one-rank hosts, pairs
    /// of hosts every --period; otherwise the world every --period).
    #[arg(long, default_value = "")]
    levels: Levels,
    /// Warmup iterations (gradient all-reduce; also the averagers' warmup).
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Loss all-reduce every N iterations (0: never).
    #[arg(long, default_value_t = 0)]
    log_every: u64,
    /// Gradient compression.
    #[arg(long, value_enum, default_value = "none")]
    compression: Compression,
    /// diloco: pseudo-gradient compression (2 bytes a parameter per sync).
    #[arg(long, value_enum, default_value = "none")]
    outer_compression: Compression,
    /// Pipelined gradient sync (true: the binary's `--pipeline-buckets on`, or `auto` with ranks
    /// on more than one host and no rank sharing cores; false: `off`, or `auto` on one host or
    /// where ranks share cores).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pipeline_buckets: bool,
    /// Target share of communication in a steady iteration, for the recommended period.
    #[arg(long, default_value_t = 0.1)]
    target_comm_share: f64,
    /// Iterations of a run: the JSON then lists rank 0's payload bytes of each of them
    /// (`[bytes, data_bytes]`, as `metrics.csv` counts them), each one's predicted seconds
    /// (`iteration_seconds`: a run that starts with the links' token buckets full, as over a
    /// freshly shaped link; see `--burst-bytes`) and their sum, the predicted run time.
    #[arg(long)]
    steps: Option<u64>,
    /// Also write the predictions as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn non_negative(name: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        bail!("invalid --{name} {v}: must be a number at least 0")
    }
}

fn positive(name: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        bail!("invalid --{name} {v}: must be a positive number")
    }
}

/// A rate flag in GB/s as bytes per second: positive, or `inf` for no limit.
fn bytes_per_second_or_unlimited(name: &str, gbps: f64) -> Result<f64> {
    if gbps == f64::INFINITY {
        Ok(gbps)
    } else {
        Ok(positive(name, gbps)? * 1e9)
    }
}

fn algorithm(name: &str, flags: &PlanFlags, layout: Layout) -> Result<Algorithm> {
    Ok(match name {
        "ddp" => Algorithm::Ddp,
        "local-sgd" => Algorithm::Periodic {
            period: flags.period,
            gradient_warmup: false,
            overlap: flags.overlap,
        },
        "post-local-sgd" => Algorithm::Periodic {
            period: flags.period,
            gradient_warmup: true,
            overlap: flags.overlap,
        },
        "hierarchical" => {
            let levels = if flags.levels.is_empty() {
                default_levels(layout, flags.period)
            } else {
                flags.levels.as_slice().to_vec()
            };
            Algorithm::Hierarchical { levels }
        }
        "streaming-diloco" => bail!(
            "--algorithms streaming-diloco: the cost model does not know the fragments yet \
             (their sizes follow the model's tensors); plan `diloco` for the traffic of the whole \
             model every period"
        ),
        "diloco" | "slowmo" => Algorithm::Outer {
            period: flags.period,
            slowmo: name == "slowmo",
            compressed: flags.outer_compression != Compression::None,
        },
        other => bail!(
            "invalid --algorithms entry {other:?}: valid: ddp, local-sgd, post-local-sgd, hierarchical, diloco, slowmo"
        ),
    })
}

/// The ranks of a host every `period`, the world every `4 * period`; on an even number (more
/// than 2) of one-rank hosts, pairs of hosts every `period` and the world every `4 * period`;
/// otherwise the world every `period`. (`scripts/bench-matrix` uses the same rule.)
pub(crate) fn default_levels(layout: Layout, period: u64) -> Vec<Level> {
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

/// The most iterations `--steps` lists (about 40 bytes of JSON each).
const MAX_LISTED_STEPS: u64 = 1_000_000;

pub(crate) fn run(flags: &PlanFlags) -> Result<()> {
    if flags.hosts == 0 || flags.ranks_per_host == 0 {
        bail!(
            "invalid layout --hosts {} --ranks-per-host {}: both must be at least 1",
            flags.hosts,
            flags.ranks_per_host
        );
    }
    if !(flags.compute_ms.is_finite() && flags.compute_ms >= 0.0) {
        bail!(
            "invalid --compute-ms {}: a non-negative number of milliseconds (measure it with `localsgd bench-step`)",
            flags.compute_ms
        );
    }
    if let Some(steps) = flags.steps
        && steps > MAX_LISTED_STEPS
    {
        bail!(
            "invalid --steps {steps}: at most {MAX_LISTED_STEPS} (the JSON lists every iteration's bytes)"
        );
    }
    let params = match flags.params {
        Some(0) => bail!("invalid --params 0: at least 1 parameter"),
        Some(p) => p,
        None => {
            let m = MlpConfig {
                input: flags.input,
                hidden: flags.hidden.0.clone(),
                classes: flags.classes,
            };
            m.validate()
                .map_err(|e| anyhow::anyhow!("invalid --input/--hidden/--classes: {e}"))?;
            m.num_params()
        }
    };
    let layout = Layout {
        hosts: flags.hosts,
        ranks_per_host: flags.ranks_per_host,
    };
    let cluster = Cluster {
        layout,
        link: Link {
            bits_per_second: positive("link-gbit", flags.link_gbit)? * 1e9,
            latency_s: flags.latency_us.max(0.0) * 1e-6,
            mtu: flags.mtu,
            burst_bytes: flags.burst_bytes,
            burst_bytes_per_second: bytes_per_second_or_unlimited("burst-gbps", flags.burst_gbps)?,
        },
        intra_bytes_per_second: positive("intra-gbps", flags.intra_gbps)? * 1e9,
        intra_latency_s: flags.intra_latency_us.max(0.0) * 1e-6,
        piece_bytes: non_negative("piece-kib", flags.piece_kib)? * 1024.0,
        piece_latency_s: match flags.piece_latency_us {
            Some(us) => non_negative("piece-latency-us", us)? * 1e-6,
            None => flags.latency_us.max(0.0) * 1e-6,
        },
    };
    let work = Workload {
        params,
        compute_s: flags.compute_ms * 1e-3,
        overhead_s: flags.overhead_ms * 1e-3,
        // Infinite (the default) means the pipeline's own copies are free.
        copy_bytes_per_second: bytes_per_second_or_unlimited("copy-gbps", flags.copy_gbps)?,
        warmup: flags.warmup,
        log_every: flags.log_every,
        compressed: flags.compression != Compression::None,
        pipelined: flags.pipeline_buckets,
    };
    if flags.algorithms.is_empty() {
        bail!(
            "invalid --algorithms \"\": name at least one of ddp, local-sgd, post-local-sgd, hierarchical, diloco, slowmo"
        );
    }
    let mut rows: Vec<(Algorithm, Prediction)> = Vec::new();
    for name in &flags.algorithms {
        let a = algorithm(name.trim(), flags, layout)?;
        let p = predict(&a, &work, &cluster)?;
        rows.push((a, p));
    }
    let recommended = recommend_period(&work, &cluster, flags.target_comm_share, 4096)?;
    let recommended_levels = recommend_levels(&work, &cluster, flags.target_comm_share, 4096)?
        .map(|levels| Levels::from(levels).to_string());

    println!(
        "plan: {params} parameters ({:.2} MB f32), compute {:.3} ms/iteration, {} host(s) x {} rank(s), link {} Gbit/s (goodput {:.1} MB/s), small collective {} µs",
        4.0 * params as f64 / 1e6,
        flags.compute_ms,
        flags.hosts,
        flags.ranks_per_host,
        flags.link_gbit,
        cluster.link.goodput() / 1e6,
        flags.latency_us
    );
    println!(
        "{:<28} {:>11} {:>9} {:>11} {:>13} {:>13} {:>12}",
        "algorithm", "ms/iter", "comm %", "bound ms", "payload B/it", "link B/it", "warmup ms"
    );
    for (a, p) in &rows {
        let name = match a {
            Algorithm::Periodic {
                period, overlap: 0, ..
            } => format!("{} period {period}", a.name()),
            Algorithm::Periodic {
                period, overlap, ..
            } => format!("{} period {period} overlap {overlap}", a.name()),
            Algorithm::Hierarchical { levels } => {
                format!("hierarchical {}", Levels::from(levels.clone()))
            }
            Algorithm::Outer { period, .. } => format!("{} period {period}", a.name()),
            Algorithm::Ddp => "ddp".to_string(),
        };
        println!(
            "{:<28} {:>11.3} {:>8.1}% {:>11.3} {:>13.0} {:>13.0} {:>12.3}",
            name,
            p.steady_s * 1e3,
            100.0 * p.comm_share,
            p.lower_bound_s * 1e3,
            p.payload_bytes,
            p.link_bytes,
            p.warmup_s * 1e3
        );
    }
    match recommended {
        Some(period) => println!(
            "recommended: post-local SGD period {period} keeps communication at or below {:.0}% of a steady iteration",
            100.0 * flags.target_comm_share
        ),
        None => println!(
            "recommended: no period up to 4096 gets communication below {:.0}% (the per-iteration has-data collective alone costs more); consider larger batches",
            100.0 * flags.target_comm_share
        ),
    }
    if layout.has_host_level() {
        match &recommended_levels {
            Some(levels) => println!(
                "recommended: hierarchical --levels {levels} (a host's ranks, then the world) keeps communication at or below {:.0}%",
                100.0 * flags.target_comm_share
            ),
            None => println!(
                "recommended: no hierarchical levels (a power-of-two host period, a world period up to 4096) get communication below {:.0}%",
                100.0 * flags.target_comm_share
            ),
        }
    }
    if let Some(path) = &flags.json {
        let out = serde_json::json!({
            "params": params,
            "cluster": cluster,
            "workload": work,
            "predictions": rows
                .iter()
                .map(|(a, p)| -> Result<serde_json::Value> {
                    let mut v = serde_json::json!({"spec": a, "prediction": p});
                    if let Some(steps) = flags.steps {
                        let schedule = Schedule::new(a, layout.world(), &work)?;
                        let payload: Vec<(u64, u64)> = (0..steps).map(|i| schedule.payload(i)).collect();
                        let warm = steps.min(work.warmup) as f64;
                        v["steps"] = serde_json::json!(steps);
                        v["payload_per_iteration"] = serde_json::json!(payload);
                        v["run_link_bytes_per_iteration"] = serde_json::json!(
                            (warm * p.warmup_link_bytes + (steps as f64 - warm) * p.link_bytes)
                                / steps.max(1) as f64
                        );
                        let seconds = run_seconds(a, &work, &cluster, steps)?;
                        v["run_seconds"] = serde_json::json!(seconds.iter().sum::<f64>());
                        v["iteration_seconds"] = serde_json::json!(seconds);
                    }
                    Ok(v)
                })
                .collect::<Result<Vec<_>>>()?,
            "recommended_period": recommended,
            "recommended_levels": recommended_levels,
            "target_comm_share": flags.target_comm_share,
        });
        localsgd_trainer::atomic::write_atomic(path, format!("{out:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
