//! `localsgd bench-comm --wire ...`: the time of one average of `floats` values in each wire
//! format — the f32 all-reduce, fp16, and the lossy codecs through the quantized all-reduce or
//! the all-gather of whole messages (`average-exchange`) — on the same group, so that their
//! ratio is measured in one run (issue 57's target: the quantized all-reduce's int8 at most 0.6×
//! the fp16 all-reduce's time between two hosts at 100 Mbit/s).

use anyhow::{Context, Result, bail};
use localsgd_comm::codec::{
    CodecSpec, Rounding, encode, mean_of_messages, message_len, quantized_mean,
    quantized_mean_wire_bytes,
};
use localsgd_comm::{CallSignature, Group, GroupExt, Precision, ReduceOp, average_compressed};
use std::time::Instant;

/// One wire format of `--wire`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Wire {
    /// The f32 all-reduce (divide, then sum).
    F32,
    /// Rounded to half precision, all-reduced in it.
    Half(Precision),
    /// A lossy codec (chunk 1024, nearest rounding), its messages all-gathered (`gather`) or
    /// through the quantized all-reduce.
    Lossy { spec: CodecSpec, gather: bool },
}

impl std::str::FromStr for Wire {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (codec, gather) = match s.strip_suffix("-gather") {
            Some(c) => (c, true),
            None => (s, false),
        };
        Ok(match codec {
            "f32" if !gather => Wire::F32,
            "fp16" if !gather => Wire::Half(Precision::Fp16),
            "bf16" if !gather => Wire::Half(Precision::Bf16),
            codec => Wire::Lossy {
                spec: CodecSpec {
                    codec: codec.parse().map_err(|e| {
                        format!(
                            "{s:?}: {e}; or f32, fp16, bf16 (a lossy codec may end in -gather: \
                             all-gathered instead of the quantized all-reduce)"
                        )
                    })?,
                    chunk: localsgd_averagers::outer::DEFAULT_CHUNK,
                    rounding: Rounding::Nearest,
                },
                gather,
            },
        })
    }
}

impl std::fmt::Display for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wire::F32 => f.write_str("f32"),
            Wire::Half(p) => write!(f, "{p}"),
            Wire::Lossy { spec, gather: true } => write!(f, "{}-gather", spec.codec),
            Wire::Lossy { spec, .. } => write!(f, "{}", spec.codec),
        }
    }
}

/// One format's figures.
#[derive(Debug, Clone)]
pub(crate) struct WireRow {
    pub wire: String,
    pub workers: usize,
    pub floats: usize,
    /// The slowest rank's time of the fastest repetition.
    pub seconds: f64,
    /// Bytes a rank sends under the collective's bandwidth-optimal algorithm.
    pub wire_bytes: u64,
}

/// Every format on `group` for each length: `reps` averages each (the best counts, the slowest
/// rank's). Collective.
pub(crate) fn measure(
    group: &Group,
    wires: &[Wire],
    floats: &[usize],
    reps: usize,
) -> Result<Vec<WireRow>> {
    let (w, rank) = (group.size(), group.rank());
    let mut rows = Vec::new();
    for &n in floats {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7 + rank * 13) as f32 * 0.001).sin() * 1e-2)
            .collect();
        for wire in wires {
            let mut best = f64::INFINITY;
            for _ in 0..reps.max(1) {
                group.barrier().context("barrier")?;
                let t = Instant::now();
                average_once(group, wire, &x)?;
                let mut secs = [t.elapsed().as_secs_f64()];
                group.all_reduce_slice(&mut secs, ReduceOp::Max)?;
                best = best.min(secs[0]);
            }
            rows.push(WireRow {
                wire: wire.to_string(),
                workers: w,
                floats: n,
                seconds: best,
                wire_bytes: wire_bytes(wire, n, w),
            });
        }
    }
    Ok(rows)
}

fn average_once(group: &Group, wire: &Wire, x: &[f32]) -> Result<()> {
    let n = x.len();
    match wire {
        Wire::F32 => {
            let mut v = x.to_vec();
            group.average_slice(&mut v)?;
        }
        Wire::Half(p) => {
            let mut v = x.to_vec();
            average_compressed(&**group, &mut v, *p)?;
        }
        Wire::Lossy { spec, gather: true } => {
            let mut msg = Vec::new();
            encode(spec, x, 0, group.rank(), &mut msg)?;
            let mut all = vec![0u8; msg.len() * group.size()];
            group.all_gather_bytes(&msg, &mut all)?;
            let mut mean = vec![0.0f32; n];
            mean_of_messages(spec, &all, group.size(), n, &mut mean)?;
        }
        Wire::Lossy { spec, .. } => {
            let mut mean = vec![0.0f32; n];
            quantized_mean(&**group, spec, x, None, 0, &mut mean)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    Ok(())
}

fn wire_bytes(wire: &Wire, n: usize, w: usize) -> u64 {
    match wire {
        Wire::F32 => {
            CallSignature::all_reduce(ReduceOp::Sum, localsgd_comm::buffer::ElementType::F32, n)
                .wire_bytes(w)
        }
        Wire::Half(_) => {
            CallSignature::all_reduce(ReduceOp::Sum, localsgd_comm::buffer::ElementType::F16, n)
                .wire_bytes(w)
        }
        Wire::Lossy { spec, gather: true } => {
            CallSignature::all_gather_bytes(message_len(spec, n)).wire_bytes(w)
        }
        Wire::Lossy { spec, .. } => quantized_mean_wire_bytes(spec, n, w),
    }
}

/// Print `rows` with each format's time against the first format's of the same length.
pub(crate) fn print(rows: &[WireRow]) -> Result<()> {
    if rows.is_empty() {
        bail!("no wire format measured");
    }
    println!(
        "{:<14} {:>7} {:>10} {:>12} {:>14} {:>10}",
        "wire", "workers", "floats", "ms/average", "wire MB/rank", "time vs 1st"
    );
    for r in rows {
        let first = rows
            .iter()
            .find(|b| b.floats == r.floats && b.workers == r.workers)
            .map_or(r.seconds, |b| b.seconds);
        println!(
            "{:<14} {:>7} {:>10} {:>12.3} {:>14.3} {:>10.3}",
            r.wire,
            r.workers,
            r.floats,
            r.seconds * 1e3,
            r.wire_bytes as f64 / 1e6,
            r.seconds / first
        );
    }
    println!(
        "(one average of the buffer per repetition, the slowest rank's time, the best repetition; \
         lossy codecs: chunk 1024, nearest rounding; wire bytes as the traffic counters count them)"
    );
    Ok(())
}
