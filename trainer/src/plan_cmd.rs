//! `localsgd plan` (part of the binary): the cost model of `localsgd_planner` as a command. From
//! the model size, a measured compute time per iteration (`localsgd bench-step`), the layout and
//! the links it prints predicted milliseconds and bytes per iteration for each algorithm and
//! recommends an averaging period for a target communication share, and, with several ranks on
//! each of several hosts, two hierarchical levels for it. The planner checks the inputs
//! (`PlanInputs`); this file reads the flags and prints.

use anyhow::{Context, Result};
use localsgd_averagers::AverageCompression;
use localsgd_averagers::outer::LossyExchange;
use localsgd_models::mlp::MlpConfig;
use localsgd_planner::{Plan, PlanError, PlanInputs};
use localsgd_trainer::config::{AverageCompressionKind, GradientCompression, Levels};
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
    #[arg(long, value_parser = localsgd_trainer::lists::parse_widths, default_value = "64")]
    hidden: localsgd_trainer::lists::Widths,
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
    compression: GradientCompression,
    /// diloco: pseudo-gradient compression; local-sgd, post-local-sgd and hierarchical's world
    /// level: the averages' (each the delta from the last average; --overlap 0), as `localsgd
    /// train --average-compression`: none, fp16, bf16 (2 bytes a parameter per sync,
    /// all-reduced), int8, int4, topk:F, topk:F+int8, topk:F+int4 (the codec's message per sync,
    /// all-gathered). The recommendations average in it too; refused when ddp is the only
    /// algorithm.
    #[arg(long, default_value = "none", alias = "outer-compression")]
    average_compression: AverageCompressionKind,
    /// A lossy --average-compression's chunk, as `localsgd train
    /// --average-compression-chunk` (4 bytes of scale per chunk; default 1024).
    #[arg(long, alias = "outer-compression-chunk")]
    average_compression_chunk: Option<usize>,
    /// How a lossy --average-compression's messages become the mean, as `localsgd train
    /// --average-exchange`: auto (default: the fewer bytes per rank), all-gather (W − 1
    /// messages per rank), all-reduce (the quantized all-reduce: about 2 (W − 1) / W of a
    /// message per rank). Give each to compare their predictions.
    #[arg(long, value_enum)]
    average_exchange: Option<LossyExchange>,
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

impl PlanFlags {
    /// Number of f32 parameters: `--params`, or the MLP of `--input`, `--hidden`, `--classes`.
    fn params(&self) -> Result<u64> {
        if let Some(params) = self.params {
            return Ok(params); // 0 is refused by the planner, naming the flag
        }
        let m = MlpConfig {
            input: self.input,
            hidden: self.hidden.0.clone(),
            classes: self.classes,
        };
        m.validate()
            .map_err(|e| anyhow::anyhow!("invalid --input/--hidden/--classes: {e}"))?;
        Ok(m.num_params())
    }

    /// The planner's inputs of these flags, for a model of `params` parameters.
    fn inputs(&self, params: u64) -> PlanInputs {
        PlanInputs {
            params,
            compute_ms: self.compute_ms,
            overhead_ms: self.overhead_ms,
            copy_gbps: self.copy_gbps,
            burst_bytes: self.burst_bytes,
            burst_gbps: self.burst_gbps,
            hosts: self.hosts,
            ranks_per_host: self.ranks_per_host,
            link_gbit: self.link_gbit,
            latency_us: self.latency_us,
            piece_kib: self.piece_kib,
            piece_latency_us: self.piece_latency_us,
            mtu: self.mtu,
            intra_gbps: self.intra_gbps,
            intra_latency_us: self.intra_latency_us,
            algorithms: self.algorithms.clone(),
            period: self.period,
            overlap: self.overlap,
            levels: self.levels.as_slice().to_vec(),
            warmup: self.warmup,
            log_every: self.log_every,
            compressed: self.compression != GradientCompression::None,
            average_compression: self.average_compression.compression().map(|c| match c {
                AverageCompression::Lossy {
                    mut spec,
                    error_feedback,
                    exchange,
                } => {
                    spec.chunk = self.average_compression_chunk.unwrap_or(spec.chunk);
                    AverageCompression::Lossy {
                        spec,
                        error_feedback,
                        exchange: self.average_exchange.unwrap_or(exchange),
                    }
                }
                half => half,
            }),
            pipelined: self.pipeline_buckets,
            target_comm_share: self.target_comm_share,
            steps: self.steps,
        }
    }
}

pub(crate) fn run(flags: &PlanFlags) -> Result<()> {
    if let (Some(chunk), AverageCompressionKind::None | AverageCompressionKind::Half(_)) =
        (flags.average_compression_chunk, flags.average_compression)
    {
        anyhow::bail!(
            "invalid --average-compression-chunk {chunk}: leave it out with --average-compression {}; \
             chunks are the lossy codecs' (int8, int4, topk:F, topk:F+int8, topk:F+int4)",
            flags.average_compression
        );
    }
    if let (Some(exchange), AverageCompressionKind::None | AverageCompressionKind::Half(_)) =
        (flags.average_exchange, flags.average_compression)
    {
        anyhow::bail!(
            "invalid --average-exchange {exchange}: leave it out with --average-compression {}; \
             the exchange is the lossy codecs' (int8, int4, topk:F, topk:F+int8, topk:F+int4)",
            flags.average_compression
        );
    }
    let params = match flags.params() {
        Ok(params) => params,
        Err(mlp) => {
            // The layout, the compute time and the listed steps are checked before the model's
            // size: a bad one of those is named first.
            return match flags.inputs(1).plan() {
                Err(
                    e @ (PlanError::Layout { .. }
                    | PlanError::Input {
                        flag: "compute-ms" | "steps",
                        ..
                    }),
                ) => Err(e.into()),
                _ => Err(mlp),
            };
        }
    };
    let plan = flags.inputs(params).plan()?;
    let recommended_levels = plan
        .recommended_levels
        .clone()
        .map(|levels| Levels::from(levels).to_string());
    println!(
        "plan: {} parameters ({:.2} MB f32), compute {:.3} ms/iteration, {} host(s) x {} rank(s), link {} Gbit/s (goodput {:.1} MB/s), small collective {} µs",
        plan.params,
        4.0 * plan.params as f64 / 1e6,
        flags.compute_ms,
        flags.hosts,
        flags.ranks_per_host,
        flags.link_gbit,
        plan.cluster.link.goodput() / 1e6,
        flags.latency_us
    );
    println!(
        "{:<28} {:>11} {:>9} {:>11} {:>13} {:>13} {:>12}",
        "algorithm", "ms/iter", "comm %", "bound ms", "payload B/it", "link B/it", "warmup ms"
    );
    for (a, p) in &plan.predictions {
        println!(
            "{:<28} {:>11.3} {:>8.1}% {:>11.3} {:>13.0} {:>13.0} {:>12.3}",
            a.label(),
            p.steady_s * 1e3,
            100.0 * p.comm_share,
            p.lower_bound_s * 1e3,
            p.payload_bytes,
            p.link_bytes,
            p.warmup_s * 1e3
        );
    }
    match plan.recommended_period {
        Some(period) => println!(
            "recommended: post-local SGD period {period} keeps communication at or below {:.0}% of a steady iteration",
            100.0 * flags.target_comm_share
        ),
        None => println!(
            "recommended: no period up to 4096 gets communication below {:.0}% (the per-iteration has-data collective alone costs more); consider larger batches",
            100.0 * flags.target_comm_share
        ),
    }
    if plan.cluster.layout.has_host_level() {
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
            "params": plan.params,
            "cluster": plan.cluster,
            "workload": plan.workload,
            "predictions": predictions_json(&plan, flags.steps)?,
            "recommended_period": plan.recommended_period,
            "recommended_levels": recommended_levels,
            "target_comm_share": flags.target_comm_share,
        });
        localsgd_pipeline::atomic::write_atomic(path, format!("{out:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Each prediction with its algorithm's settings and, with `--steps`, the run listed iteration
/// by iteration.
fn predictions_json(plan: &Plan, steps: Option<u64>) -> Result<Vec<serde_json::Value>> {
    plan.predictions
        .iter()
        .map(|(a, p)| {
            let mut v = serde_json::json!({"spec": a, "prediction": p});
            if let Some(steps) = steps {
                let run = plan.run(a, p, steps)?;
                v["steps"] = serde_json::json!(steps);
                v["payload_per_iteration"] = serde_json::json!(run.payload_per_iteration);
                v["run_link_bytes_per_iteration"] = serde_json::json!(run.link_bytes_per_iteration);
                v["run_seconds"] = serde_json::json!(run.seconds());
                v["iteration_seconds"] = serde_json::json!(run.iteration_seconds);
            }
            Ok(v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: PlanFlags,
    }

    /// The planner's `PlanInputs::default()` says it has the flags' defaults.
    #[test]
    fn the_planners_defaults_are_the_flags_defaults() {
        let cli = Cli::try_parse_from(["plan", "--compute-ms", "0"]).unwrap();
        assert_eq!(cli.flags.inputs(1), PlanInputs::default());
    }
}
