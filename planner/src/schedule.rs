//! Which collectives rank 0 issues in each iteration, following the pipeline's phases.

use crate::algorithm::Algorithm;
use crate::error::{PlanError, invalid};
use crate::workload::Workload;
use localsgd_averagers::outer::LossyExchange;
use localsgd_averagers::{AverageCompression, validate_levels};
use localsgd_comm::codec::quantized_mean_block;
use localsgd_pipeline::settings::Levels;

/// One collective of an iteration: group size, payload bytes, and whether it is float data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Collective {
    /// Ranks in each block that runs it.
    pub group: usize,
    /// Payload bytes each rank contributes.
    pub bytes: u64,
    /// Float data (gradients, parameters, losses) rather than control words.
    pub data: bool,
    /// Run behind the next iterations' compute (an overlapped average), not in sequence.
    pub overlapped: bool,
    /// An all-gather of `bytes` from every rank (a lossy codec's messages) rather than an
    /// all-reduce of `bytes`.
    pub gather: bool,
}

/// Which collectives every iteration issues.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    algorithm: Algorithm,
    world: usize,
    params: u64,
    warmup: u64,
    log_every: u64,
    compressed: bool,
    pipelined: bool,
}

impl Schedule {
    /// The schedule of `algorithm` on `world` ranks. Checks the settings.
    pub fn new(algorithm: &Algorithm, world: usize, work: &Workload) -> Result<Self, PlanError> {
        if world == 0 {
            return Err(invalid("ranks", 0, "at least 1 rank"));
        }
        match algorithm {
            Algorithm::Ddp => {}
            Algorithm::Outer {
                period,
                compression,
                slowmo,
            } => {
                if *period == 0 {
                    return Err(invalid("period", 0, "a period of at least 1"));
                }
                check_compression(*compression)?;
                // As `localsgd train` refuses it: SlowMo's slow step takes the averaged
                // parameters (delta of mean), which are not compressed.
                if let (true, Some(c)) = (slowmo, compression) {
                    return Err(invalid(
                        "average-compression",
                        c,
                        "none with slowmo, whose slow step takes the averaged parameters \
                         (delta of mean), not deltas",
                    ));
                }
            }
            Algorithm::Periodic {
                period,
                overlap,
                compression,
                ..
            } => {
                if *period == 0 {
                    return Err(invalid("period", 0, "a period of at least 1"));
                }
                check_compression(*compression)?;
                if *overlap > *period {
                    return Err(invalid(
                        "overlap",
                        overlap,
                        &format!("0 (blocking) to the period {period}"),
                    ));
                }
                if *overlap > 0 && compression.is_some() {
                    return Err(invalid(
                        "overlap",
                        overlap,
                        "0 with average-compression: a compressed average is applied at its own step",
                    ));
                }
            }
            Algorithm::Hierarchical {
                levels,
                compression,
            } => {
                check_compression(*compression)?;
                let text = format!("{:?}", Levels::from(levels.clone()).to_string());
                validate_levels(levels, world)
                    .map_err(|e| invalid("levels", &text, &format!("{e} ({world} ranks)")))?;
                // The averager takes any increasing periods; the model's schedule repeats
                // every last period only when each period divides the next.
                if levels
                    .windows(2)
                    .any(|w| !w[1].period.is_multiple_of(w[0].period))
                {
                    return Err(invalid(
                        "levels",
                        &text,
                        "each period a multiple of the previous (the cost model's schedule \
                         repeats every last period)",
                    ));
                }
            }
        }
        Ok(Self {
            algorithm: algorithm.clone(),
            world,
            params: work.params,
            warmup: work.warmup,
            log_every: work.log_every,
            compressed: work.compressed,
            pipelined: work.pipelined,
        })
    }

    /// The collectives rank 0 issues in iteration `i` (0-based), in order.
    pub fn iteration(&self, i: u64) -> Vec<Collective> {
        let w = self.world;
        let grad_bytes = self
            .params
            .saturating_mul(if self.compressed { 2 } else { 4 });
        let params_f32 = self.params.saturating_mul(4);
        let mut out = vec![Collective {
            group: w,
            bytes: 8,
            data: false,
            overlapped: false,
            gather: false,
        }];
        let gradients = |out: &mut Vec<Collective>| {
            // Gradients are first averaged in iteration 0 whenever they are averaged at all.
            if self.pipelined && !self.compressed && w > 1 && i == 0 {
                out.push(Collective {
                    group: w,
                    bytes: 8,
                    data: false,
                    overlapped: false,
                    gather: false,
                });
            }
            // A plain mean over one rank is the identity: the reducer hands the gradients on
            // untouched (compressed gradients still run the hook, bucket by bucket).
            if w <= 1 && !self.compressed {
                return;
            }
            out.push(Collective {
                group: w,
                bytes: grad_bytes,
                data: true,
                overlapped: false,
                gather: false,
            })
        };
        // `parts`: the sync's data collectives ([`sync_parts`]), each rank's payload (4 a
        // parameter; less for compressed pseudo-gradients) and whether it is all-gathered (a
        // lossy codec's messages, or blocks of the quantized all-reduce) rather than
        // all-reduced.
        let average =
            |out: &mut Vec<Collective>, group: usize, overlapped: bool, parts: Vec<(u64, bool)>| {
                // Averaging over one rank is the identity and communicates nothing.
                if group <= 1 {
                    return;
                }
                out.push(Collective {
                    group,
                    bytes: 32,
                    data: false,
                    overlapped: false,
                    gather: false,
                });
                for (bytes, gather) in parts {
                    out.push(Collective {
                        group,
                        bytes,
                        data: true,
                        overlapped,
                        gather,
                    });
                }
            };
        match &self.algorithm {
            Algorithm::Ddp => gradients(&mut out),
            Algorithm::Periodic {
                period,
                gradient_warmup,
                overlap,
                compression,
            } => {
                if i < self.warmup {
                    if *gradient_warmup {
                        gradients(&mut out);
                    }
                } else if (i - self.warmup).is_multiple_of(*period) {
                    if *overlap > 0 && i == self.warmup && w > 1 {
                        // The first overlapped average creates the helper's communicator.
                        out.push(Collective {
                            group: w,
                            bytes: 8,
                            data: false,
                            overlapped: false,
                            gather: false,
                        });
                    }
                    // Compressed (overlap 0): the delta from the last average, as a sync's
                    // pseudo-gradient.
                    average(
                        &mut out,
                        w,
                        *overlap > 0,
                        sync_parts(*compression, self.params, w),
                    );
                }
            }
            Algorithm::Outer {
                period,
                compression,
                ..
            } => {
                if i < self.warmup {
                    gradients(&mut out);
                } else if (i - self.warmup + 1).is_multiple_of(*period) {
                    average(&mut out, w, false, sync_parts(*compression, self.params, w));
                }
            }
            Algorithm::Hierarchical {
                levels,
                compression,
            } => {
                if i < self.warmup {
                    gradients(&mut out);
                } else if let Some(level) = levels.iter().rev().find(|l| i.is_multiple_of(l.period))
                {
                    // Only the world's averages are compressed; smaller groups send f32.
                    if level.group_size == w && compression.is_some() {
                        average(&mut out, w, false, sync_parts(*compression, self.params, w));
                    } else {
                        average(&mut out, level.group_size, false, vec![(params_f32, false)]);
                    }
                }
            }
        }
        if self.log_every > 0 && (i + 1).is_multiple_of(self.log_every) {
            out.push(Collective {
                group: w,
                bytes: 8,
                data: true,
                overlapped: false,
                gather: false,
            });
        }
        out
    }

    /// Rank 0's payload bytes in iteration `i`: `(all, float data)`, as `metrics.csv` counts
    /// them (`bytes`, `data_bytes`).
    pub fn payload(&self, i: u64) -> (u64, u64) {
        self.iteration(i).iter().fold((0, 0), |(a, d), c| {
            (a + c.bytes, d + if c.data { c.bytes } else { 0 })
        })
    }

    /// Iterations after which the post-warmup schedule repeats.
    pub fn cycle(&self) -> u64 {
        let mut c = match &self.algorithm {
            Algorithm::Ddp => 1,
            Algorithm::Periodic { period, .. } | Algorithm::Outer { period, .. } => *period,
            Algorithm::Hierarchical { levels, .. } => levels.last().map_or(1, |l| l.period),
        };
        if self.log_every > 0 {
            c = lcm(c, self.log_every);
        }
        c
    }
}

/// An `average-compression` the averagers would refuse, named as the setting.
fn check_compression(compression: Option<AverageCompression>) -> Result<(), PlanError> {
    if let Some(c) = compression
        && let Err(e) = c.validate()
    {
        return Err(invalid("average-compression", c, &e.to_string()));
    }
    Ok(())
}

/// Whether compressed averages are all-gathered (a lossy codec's messages) rather than
/// all-reduced.
fn is_lossy(compression: Option<AverageCompression>) -> bool {
    matches!(compression, Some(AverageCompression::Lossy { .. }))
}

/// The data collectives of one sync of `params` values on `world` ranks, as `(payload bytes,
/// all-gathered)`: one all-reduce of the values (f32 or half precision), one all-gather of a
/// lossy codec's messages, or, where the codec's exchange is the quantized all-reduce
/// ([`LossyExchange::resolve`]), its all-to-all and its all-gather of one block each (both
/// move `world − 1` blocks per rank, as an all-gather of a block does).
pub(crate) fn sync_parts(
    compression: Option<AverageCompression>,
    params: u64,
    world: usize,
) -> Vec<(u64, bool)> {
    if let Some(AverageCompression::Lossy { spec, exchange, .. }) = compression {
        let n = usize::try_from(params).unwrap_or(usize::MAX);
        if exchange.resolve(&spec, n, world) == LossyExchange::AllReduce {
            let block = quantized_mean_block(&spec, n, world) as u64;
            return vec![(block, true), (block, true)];
        }
    }
    vec![(
        pseudo_gradient_bytes(compression, params),
        is_lossy(compression),
    )]
}

/// Bytes one rank sends of a sync's pseudo-gradient of `params` values: 4 a value in f32, 2 in
/// half precision, a lossy codec's message ([`AverageCompression::wire_bytes`], taken chunk by
/// chunk so that no count overflows).
pub(crate) fn pseudo_gradient_bytes(compression: Option<AverageCompression>, params: u64) -> u64 {
    match compression {
        None => params.saturating_mul(4),
        Some(AverageCompression::Half(_)) => params.saturating_mul(2),
        Some(c @ AverageCompression::Lossy { spec, .. }) => {
            // A message is its full chunks' bytes plus the last, shorter chunk's.
            let chunk = spec.chunk.max(1) as u64;
            let (full, tail) = (params / chunk, params % chunk);
            full.saturating_mul(c.wire_bytes(chunk as usize) as u64)
                .saturating_add(c.wire_bytes(tail as usize) as u64)
        }
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    (a / gcd(a, b).max(1)).saturating_mul(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::predict;
    use crate::test_util::{close, two_hosts, work};
    use localsgd_averagers::Level;

    #[test]
    fn pipelined_gradient_sync_creates_its_communicator_in_iteration_zero() {
        let pipelined = |compressed| Workload {
            pipelined: true,
            compressed,
            ..work(1000, 1e-3)
        };
        let s = Schedule::new(&Algorithm::Ddp, 2, &pipelined(false)).unwrap();
        assert_eq!(s.payload(0), (8 + 8 + 4000, 4000));
        assert_eq!(s.payload(1), (8 + 4000, 4000));
        // One rank needs no helper, and its mean is the identity: no gradient collective.
        let one = Schedule::new(&Algorithm::Ddp, 1, &pipelined(false)).unwrap();
        assert_eq!(one.payload(0), (8, 0));
        // Compressed gradients run the hook, bucket by bucket, even on one rank.
        let one_half = Schedule::new(&Algorithm::Ddp, 1, &pipelined(true)).unwrap();
        assert_eq!(one_half.payload(0), (8 + 2000, 2000));
        let half = Schedule::new(&Algorithm::Ddp, 2, &pipelined(true)).unwrap();
        assert_eq!(half.payload(0), (8 + 2000, 2000));
    }

    #[test]
    fn periodic_averages_once_a_period() {
        let a = Algorithm::Periodic {
            period: 4,
            gradient_warmup: true,
            overlap: 0,
            compression: None,
        };
        let w = Workload {
            warmup: 3,
            ..work(1000, 1e-3)
        };
        let s = Schedule::new(&a, 2, &w).unwrap();
        // Warmup: has-data flag + gradients; then an average at 3, 7, 11, ...
        assert_eq!(s.payload(0), (8 + 4000, 4000));
        assert_eq!(s.payload(2), (8 + 4000, 4000));
        assert_eq!(s.payload(3), (8 + 32 + 4000, 4000));
        assert_eq!(s.payload(4), (8, 0));
        assert_eq!(s.payload(7), (8 + 32 + 4000, 4000));
        let p = predict(&a, &w, &two_hosts(1)).unwrap();
        close(p.payload_bytes, (4.0 * 8.0 + 32.0 + 4000.0) / 4.0);
        close(p.payload_data_bytes, 1000.0);
        // Local SGD: no gradients in the warmup.
        let l = Schedule::new(
            &Algorithm::Periodic {
                period: 4,
                gradient_warmup: false,
                overlap: 0,
                compression: None,
            },
            2,
            &w,
        )
        .unwrap();
        assert_eq!(l.payload(0), (8, 0));
    }

    #[test]
    fn hierarchical_uses_the_largest_period_dividing_the_step() {
        // 2 hosts x 2 ranks, pairs (inside a host) every 4, the world every 16.
        let a = Algorithm::Hierarchical {
            levels: [(4, 2), (16, 4)].into_iter().map(Level::from).collect(),
            compression: None,
        };
        let w = work(1000, 1e-3);
        let s = Schedule::new(&a, 4, &w).unwrap();
        assert_eq!(s.iteration(0)[2].group, 4);
        assert_eq!(s.iteration(4)[2].group, 2);
        assert_eq!(s.iteration(16)[2].group, 4);
        assert_eq!(s.iteration(5).len(), 1);
        let c = two_hosts(2);
        let p = predict(&a, &w, &c).unwrap();
        // Only the world average (1 in 16 steps) crosses the links, 2 * 1/2 * 4000 bytes on
        // each: 2 hosts, whatever their ranks (veth counters in the benchmark matrix, 2 hosts x
        // 2 ranks: 1.02-1.07 times the buffer per host link; a flat 4-rank ring: 1.5 times).
        close(p.link_bytes, 4000.0 / 16.0);
        let intra = 3.0 * (5e-6 + 5e-6 + 4000.0 / 5e9) / 16.0;
        let world = (50e-6 + 50e-6 + 4000.0 / c.link.goodput()) / 16.0;
        close(p.comm_s, 50e-6 + intra + world);
    }

    #[test]
    fn a_level_of_one_rank_sends_nothing() {
        // Levels 2:1, 4:2 on 2 ranks: steps 2, 6, ... average alone (the identity, nothing sent),
        // steps 0, 4, 8, ... over both ranks (4-word check + 4P bytes).
        let a = Algorithm::Hierarchical {
            levels: [(2, 1), (4, 2)].into_iter().map(Level::from).collect(),
            compression: None,
        };
        let s = Schedule::new(&a, 2, &work(1000, 1e-3)).unwrap();
        assert_eq!(s.payload(2), (8, 0));
        assert_eq!(s.payload(6), (8, 0));
        assert_eq!(s.payload(4), (8 + 32 + 4000, 4000));
    }

    #[test]
    fn an_outer_sync_sends_the_pseudo_gradient_in_its_wire_format() {
        use localsgd_comm::Precision;
        use localsgd_comm::codec::{CodecSpec, Rounding};
        let outer = |compression| Algorithm::Outer {
            period: 3,
            slowmo: false,
            compression,
        };
        let lossy = |codec: &str, chunk| {
            Some(AverageCompression::Lossy {
                spec: CodecSpec {
                    codec: codec.parse().unwrap(),
                    chunk,
                    rounding: Rounding::Nearest,
                },
                error_feedback: true,
                exchange: LossyExchange::Auto,
            })
        };
        let w = work(1000, 1e-3);
        // (compression, bytes each rank sends per sync, all-gathered).
        for (compression, bytes, gather) in [
            (None, 4000, false),
            (Some(Precision::Fp16.into()), 2000, false),
            (Some(Precision::Bf16.into()), 2000, false),
            // 7 chunks of 128 values and one of 104: 1 byte a value, a 4-byte scale a chunk.
            (lossy("int8", 128), 1000 + 8 * 4, true),
            (lossy("int4", 128), 500 + 8 * 4, true),
            // ceil(0.01 * 1000) = 10 values of the one chunk, a u16 offset and an f32 each.
            (lossy("topk:0.01", 1024), 10 * 6, true),
            // 7 chunks of 13 kept (ceil 12.8) and one of 11 (ceil 10.4), with int4 values.
            (
                lossy("topk:0.1+int4", 128),
                7 * (4 + 26 + 7) + (4 + 22 + 6),
                true,
            ),
        ] {
            let s = Schedule::new(&outer(compression), 2, &w).unwrap();
            assert_eq!(s.payload(1), (8, 0));
            assert_eq!(s.payload(2), (8 + 32 + bytes, bytes), "{compression:?}");
            let sync = s.iteration(2)[2];
            assert_eq!(
                (sync.bytes, sync.gather),
                (bytes, gather),
                "{compression:?}"
            );
            assert_eq!(pseudo_gradient_bytes(compression, 1000), bytes);
            if let Some(c) = compression {
                assert_eq!(c.wire_bytes(1000) as u64, bytes);
            }
        }
        // A count too large for one message's arithmetic saturates rather than overflowing.
        assert_eq!(pseudo_gradient_bytes(lossy("int8", 1), u64::MAX), u64::MAX);
        // A codec the averager would refuse is refused here too.
        let e = Schedule::new(&outer(lossy("topk:0.5", 0)), 2, &w).unwrap_err();
        assert!(
            e.to_string()
                .contains("`average-compression` = topk:0.5 (chunk 0): codec chunk 0 is invalid"),
            "{e}"
        );
        // One rank sends nothing.
        let s = Schedule::new(&outer(lossy("int8", 128)), 1, &w).unwrap();
        assert_eq!(s.payload(2), (8, 0));
    }

    /// `int8` with chunks of 128, error feedback on.
    fn int8() -> AverageCompression {
        use localsgd_comm::codec::{CodecSpec, Rounding};
        AverageCompression::Lossy {
            spec: CodecSpec {
                codec: "int8".parse().unwrap(),
                chunk: 128,
                rounding: Rounding::Nearest,
            },
            error_feedback: true,
            exchange: LossyExchange::Auto,
        }
    }

    /// From 3 ranks on, `auto` takes the quantized all-reduce: an all-to-all and an all-gather
    /// of one block each, where the block is the longest shard's message (int8, chunks of 128,
    /// 1000 values on 8 ranks: one chunk a shard, 128 + 4 bytes); `all-gather` keeps the whole
    /// message (1000 + 8 · 4 bytes).
    #[test]
    fn a_lossy_sync_on_eight_ranks_is_the_quantized_all_reduce_unless_set_otherwise() {
        let outer = |compression| Algorithm::Outer {
            period: 3,
            slowmo: false,
            compression: Some(compression),
        };
        let w = work(1000, 1e-3);
        let auto = Schedule::new(&outer(int8()), 8, &w).unwrap();
        let sync: Vec<(u64, bool)> = auto.iteration(2)[2..]
            .iter()
            .map(|c| (c.bytes, c.gather))
            .collect();
        assert_eq!(sync, [(132, true), (132, true)]);
        assert_eq!(auto.payload(2), (8 + 32 + 2 * 132, 2 * 132));
        let AverageCompression::Lossy { spec, .. } = int8() else {
            unreachable!()
        };
        let gather = AverageCompression::Lossy {
            spec,
            error_feedback: true,
            exchange: LossyExchange::AllGather,
        };
        let s = Schedule::new(&outer(gather), 8, &w).unwrap();
        assert_eq!(s.payload(2), (8 + 32 + 1032, 1032));
        // On 2 ranks the two move the same bytes: `auto` keeps one quantization.
        let two = Schedule::new(&outer(int8()), 2, &w).unwrap();
        assert_eq!(two.payload(2), (8 + 32 + 1032, 1032));
    }

    #[test]
    fn a_compressed_average_sends_what_a_diloco_sync_does() {
        use localsgd_comm::Precision;
        use localsgd_comm::codec::wire_bytes;
        let w = Workload {
            warmup: 3,
            ..work(1000, 1e-3)
        };
        let AverageCompression::Lossy { spec, .. } = int8() else {
            unreachable!()
        };
        // 7 chunks of 128 values and one of 104: 1 byte a value, a 4-byte scale a chunk.
        let int8_bytes = 1000 + 8 * 4;
        assert_eq!(
            (7 * wire_bytes(&spec, 128) + wire_bytes(&spec, 104)) as u64,
            int8_bytes
        );
        let post_local = |compression| Algorithm::Periodic {
            period: 4,
            gradient_warmup: true,
            overlap: 0,
            compression,
        };
        let diloco = Algorithm::Outer {
            period: 4,
            slowmo: false,
            compression: Some(int8()),
        };
        let s = Schedule::new(&post_local(Some(int8())), 2, &w).unwrap();
        let d = Schedule::new(&diloco, 2, &w).unwrap();
        // The warmup all-reduces f32 gradients as before.
        assert_eq!(s.payload(0), (8 + 4000, 4000));
        assert_eq!(s.payload(2), (8 + 4000, 4000));
        // Averages at 3, 7, 11, ...: the layout check, then every rank's message all-gathered,
        // as DiLoCo's syncs (at 6, 10, ...); nothing else in between.
        for (avg, sync) in [(3, 6), (7, 10), (11, 14)] {
            assert_eq!(s.payload(avg), (8 + 32 + int8_bytes, int8_bytes));
            assert_eq!(s.payload(avg), d.payload(sync));
            assert_eq!(s.iteration(avg), d.iteration(sync));
            let data = s.iteration(avg)[2];
            assert_eq!((data.group, data.gather, data.overlapped), (2, true, false));
        }
        assert_eq!(s.payload(4), (8, 0));
        // Half precision: 2 bytes a parameter, all-reduced.
        for p in [Precision::Fp16, Precision::Bf16] {
            let h = Schedule::new(&post_local(Some(p.into())), 2, &w).unwrap();
            assert_eq!(h.payload(3), (8 + 32 + 2000, 2000));
            assert!(!h.iteration(3)[2].gather);
        }
        // Local SGD likewise, with nothing in its warmup.
        let l = Algorithm::Periodic {
            period: 4,
            gradient_warmup: false,
            overlap: 0,
            compression: Some(int8()),
        };
        let l = Schedule::new(&l, 2, &w).unwrap();
        assert_eq!(l.payload(0), (8, 0));
        assert_eq!(l.payload(7), (8 + 32 + int8_bytes, int8_bytes));
        // Over the steady cycle, the bytes a prediction counts.
        let p = predict(&post_local(Some(int8())), &w, &two_hosts(1)).unwrap();
        close(p.payload_data_bytes, int8_bytes as f64 / 4.0);
    }

    #[test]
    fn hierarchical_compresses_only_the_world_level() {
        // 2 hosts x 2 ranks: pairs every 4 (f32, all-reduced), the world every 16 (int8, the
        // quantized all-reduce on 4 ranks: each owner's shard is 2 chunks of 128, one block
        // 2 · (128 + 4) bytes, all-to-all then all-gathered).
        let a = Algorithm::Hierarchical {
            levels: [(4, 2), (16, 4)].into_iter().map(Level::from).collect(),
            compression: Some(int8()),
        };
        let block = 2 * (128 + 4);
        let s = Schedule::new(&a, 4, &work(1000, 1e-3)).unwrap();
        for i in [0, 16, 32] {
            assert_eq!(s.payload(i), (8 + 32 + 2 * block, 2 * block), "step {i}");
            for data in &s.iteration(i)[2..4] {
                assert_eq!((data.group, data.bytes, data.gather), (4, block, true));
            }
        }
        for i in [4, 8, 12, 20] {
            assert_eq!(s.payload(i), (8 + 32 + 4000, 4000), "step {i}");
            let data = s.iteration(i)[2];
            assert_eq!((data.group, data.bytes, data.gather), (2, 4000, false));
        }
        assert_eq!(s.payload(5), (8, 0));
        // A one-level hierarchy over the world compresses every average.
        let world = Algorithm::Hierarchical {
            levels: vec![Level::from((4, 2))],
            compression: Some(AverageCompression::from(localsgd_comm::Precision::Bf16)),
        };
        let s = Schedule::new(&world, 2, &work(1000, 1e-3)).unwrap();
        assert_eq!(s.payload(4), (8 + 32 + 2000, 2000));
        // A codec the averager would refuse is refused here too.
        let mut bad = int8();
        if let AverageCompression::Lossy { spec, .. } = &mut bad {
            spec.chunk = 0;
        }
        let e = Schedule::new(
            &Algorithm::Hierarchical {
                levels: vec![Level::from((4, 2))],
                compression: Some(bad),
            },
            2,
            &work(1000, 1e-3),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("`average-compression` = int8"),
            "{e}"
        );
    }

    #[test]
    fn a_compressed_average_does_not_overlap() {
        let periodic = |overlap, compression| Algorithm::Periodic {
            period: 4,
            gradient_warmup: false,
            overlap,
            compression,
        };
        let w = work(1000, 1e-3);
        for overlap in [1, 4] {
            let e = Schedule::new(&periodic(overlap, Some(int8())), 2, &w)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("`overlap` = {overlap}")) && e.contains("average-compression"),
                "{e}"
            );
        }
        // Without compression, as before; with it, blocking.
        assert!(Schedule::new(&periodic(1, None), 2, &w).is_ok());
        let s = Schedule::new(&periodic(0, Some(int8())), 2, &w).unwrap();
        assert!(s.iteration(0).iter().all(|c| !c.overlapped));
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let e = Schedule::new(
            &Algorithm::Hierarchical {
                levels: [(2, 2), (4, 3)].into_iter().map(Level::from).collect(),
                compression: None,
            },
            4,
            &work(10, 0.0),
        )
        .unwrap_err();
        assert!(e.to_string().contains("`levels`"), "{e}");
        let e = predict(&Algorithm::Ddp, &work(10, f64::NAN), &two_hosts(1)).unwrap_err();
        assert!(e.to_string().contains("compute-ms"), "{e}");
    }
}
