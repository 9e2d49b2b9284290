//! The outer averager with a lossy codec (int8, int4, top-k; semantics §11) against the codec
//! applied by hand: each rank's pseudo-gradient `θ − x_r` plus its residual encoded, the
//! messages' mean in rank order, `θ ← θ − mean` (outer SGD, lr 1); the residual carried over a
//! checkpoint; the bytes a sync sends; and the settings it refuses.

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::DType;
use localsgd_averagers::comm::ThreadWorld;
use localsgd_averagers::comm::codec::{
    Codec, CodecSpec, Rounding, decode, encode, mean_of_messages, message_len,
};
use localsgd_averagers::comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_averagers::outer::{LossyExchange, StreamingConfig};
use localsgd_averagers::{
    AverageCompression, AverageParameters, ModelAverager, OuterAverager, OuterSgdConfig,
    OuterState, PseudoGradient,
};

const N: usize = 300;
const WORLD: usize = 3;

#[derive(Module, Debug)]
struct Flat {
    w: Param<Tensor<1>>,
}

fn model(values: &[f32], dtype: DType) -> Flat {
    let device = Device::flex();
    let t = Tensor::<1>::from_data(TensorData::new(values.to_vec(), [values.len()]), &device);
    Flat {
        w: Param::from_tensor(t.cast(dtype)),
    }
}

fn values(m: &Flat) -> Vec<f32> {
    match flatten_params(m, &ParamSelection::All)
        .expect("flatten")
        .buffer
    {
        FlatBuffer::F32(v) => v,
        FlatBuffer::F64(v) => v.into_iter().map(|x| x as f32).collect(),
    }
}

fn theta0() -> Vec<f32> {
    (0..N).map(|i| (i as f32 * 0.37).sin()).collect()
}

/// Rank `r`'s local progress in round `k`: what its inner steps moved the model by.
fn progress(r: usize, k: u64) -> Vec<f32> {
    (0..N)
        .map(|i| 0.01 * ((i * (r + 1)) as f32 * 0.11 + k as f32).cos() * (1.0 + (i % 7) as f32))
        .collect()
}

fn spec(codec: &str, chunk: usize, rounding: Rounding) -> CodecSpec {
    CodecSpec {
        codec: codec.parse::<Codec>().expect("a codec"),
        chunk,
        rounding,
    }
}

/// `rounds` outer steps through the averager on `WORLD` thread ranks (every rank's θ after
/// each), the averager's state saved after `save_after` rounds and the run continued from it
/// when given.
fn through_averager(
    compression: AverageCompression,
    rounds: u64,
    resume_after: Option<u64>,
) -> Vec<Vec<Vec<f32>>> {
    ThreadWorld::new(WORLD)
        .expect("world")
        .run(move |world| {
            let r = world.rank();
            let build = || {
                OuterAverager::periodic(1, 0, OuterSgdConfig::sgd(1.0).into(), world.clone())
                    .and_then(|a| a.with_compression(Some(compression)))
                    .expect("averager")
            };
            let mut a = build();
            let mut m = model(&theta0(), DType::F32);
            a.reset_global(&m, &ParamSelection::All).expect("θ");
            let mut thetas = Vec::new();
            for k in 0..rounds {
                if resume_after == Some(k) {
                    let bytes = a
                        .global_state()
                        .expect("state")
                        .expect("θ taken")
                        .to_bytes();
                    let saved = OuterState::from_bytes(&bytes).expect("decoded");
                    assert!(
                        saved.fragments[0].residual.is_some(),
                        "the residual is saved"
                    );
                    let step_state = a.state();
                    a = build();
                    a.load_state(&step_state).expect("counters");
                    a.load_global_state(&saved).expect("restored");
                }
                let x: Vec<f32> = values(&m)
                    .iter()
                    .zip(progress(r, k))
                    .map(|(t, d)| t - d)
                    .collect();
                m = a
                    .average_parameters(model(&x, DType::F32), &ParamSelection::All)
                    .expect("sync");
                thetas.push(values(&m));
            }
            thetas
        })
        .expect("run")
}

/// The same rounds by hand, from the codec's functions: every rank's message of its
/// pseudo-gradient plus residual, their mean in rank order, `θ − mean`.
fn by_hand(spec: &CodecSpec, feedback: bool, rounds: u64) -> Vec<Vec<f32>> {
    let mut theta = theta0();
    let mut residual = vec![vec![0.0f32; N]; WORLD];
    let mut out = Vec::new();
    for k in 0..rounds {
        let mut gathered = Vec::new();
        for (r, res) in residual.iter_mut().enumerate() {
            let x: Vec<f32> = theta
                .iter()
                .zip(progress(r, k))
                .map(|(t, d)| t - d)
                .collect();
            let delta: Vec<f32> = theta.iter().zip(&x).map(|(t, x)| t - x).collect();
            let y: Vec<f32> = if feedback {
                delta.iter().zip(res.iter()).map(|(d, e)| d + e).collect()
            } else {
                delta
            };
            let mut msg = Vec::new();
            encode(spec, &y, k, r, &mut msg).expect("encode");
            if feedback {
                let mut sent = vec![0.0f32; N];
                decode(spec, &msg, N, &mut sent).expect("decode");
                for ((e, y), s) in res.iter_mut().zip(&y).zip(&sent) {
                    *e = y - s;
                }
            }
            gathered.extend_from_slice(&msg);
        }
        let mut mean = vec![0.0f32; N];
        mean_of_messages(spec, &gathered, WORLD, N, &mut mean).expect("mean");
        for (t, m) in theta.iter_mut().zip(&mean) {
            *t -= m;
        }
        out.push(theta.clone());
    }
    out
}

fn assert_same(what: &str, got: &[f32], want: &[f32]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}[{i}]: {g} vs {w} by hand");
    }
}

#[test]
fn lossy_outer_steps_are_the_codecs_mean_of_every_ranks_message() {
    let cases = [
        ("int8", 64, Rounding::Nearest, true),
        ("int4", 64, Rounding::Nearest, true),
        ("int4", 1024, Rounding::Stochastic { seed: 7 }, true),
        ("topk:0.05+int4", 100, Rounding::Nearest, true),
        ("topk:0.05+int4", 100, Rounding::Nearest, false),
        ("topk:0.1", 64, Rounding::Nearest, true),
    ];
    for (codec, chunk, rounding, error_feedback) in cases {
        let spec = spec(codec, chunk, rounding);
        let compression = AverageCompression::Lossy {
            spec,
            error_feedback,
            exchange: LossyExchange::AllGather,
        };
        let ranks = through_averager(compression, 4, None);
        let want = by_hand(&spec, error_feedback, 4);
        for (r, thetas) in ranks.iter().enumerate() {
            for (k, theta) in thetas.iter().enumerate() {
                assert_same(
                    &format!("{compression}, rank {r}, round {k}"),
                    theta,
                    &want[k],
                );
            }
        }
    }
    // Error feedback changes the result (the residual is sent later), and not by nothing.
    let s = spec("topk:0.05+int4", 100, Rounding::Nearest);
    assert_ne!(by_hand(&s, true, 3)[2], by_hand(&s, false, 3)[2]);
}

#[test]
fn the_residual_survives_a_checkpoint_exactly() {
    let compression = AverageCompression::Lossy {
        spec: spec("topk:0.05+int8", 128, Rounding::Stochastic { seed: 3 }),
        error_feedback: true,
        exchange: LossyExchange::AllGather,
    };
    let straight = through_averager(compression, 4, None);
    let resumed = through_averager(compression, 4, Some(2));
    for (r, (a, b)) in straight.iter().zip(&resumed).enumerate() {
        assert_same(&format!("rank {r}, last round"), &b[3], &a[3]);
    }
}

#[test]
fn a_lossy_sync_sends_its_message_and_streaming_gathers_it_in_the_background() {
    let spec = spec("int4", 64, Rounding::Nearest);
    let compression = AverageCompression::Lossy {
        spec,
        error_feedback: true,
        exchange: LossyExchange::AllGather,
    };
    // One sync, two ranks: each contributes one message (the codec's length).
    let bytes = ThreadWorld::new(2)
        .expect("world")
        .run(move |world| {
            let mut a =
                OuterAverager::periodic(1, 0, OuterSgdConfig::diloco().into(), world.clone())
                    .and_then(|a| a.with_compression(Some(compression)))
                    .expect("averager");
            let m = model(&theta0(), DType::F32);
            a.reset_global(&m, &ParamSelection::All).expect("θ");
            let before = world.traffic();
            let x: Vec<f32> = theta0().iter().map(|t| t - 0.01).collect();
            a.average_parameters(model(&x, DType::F32), &ParamSelection::All)
                .expect("sync");
            (world.traffic() - before).data_bytes
        })
        .expect("run");
    assert_eq!(bytes, vec![message_len(&spec, N) as u64; 2]);
    assert!(message_len(&spec, N) < N / 2 + 4 * N.div_ceil(64) + 1);

    // Streaming DiLoCo with a delay gathers on its second communicator; the ranks agree.
    let ends = ThreadWorld::new(2)
        .expect("world")
        .run(move |world| {
            let config = StreamingConfig {
                sync_every: 4,
                fragments: 1,
                delay: 1,
                alpha: 0.0,
            };
            let mut a =
                OuterAverager::streaming(config, 0, OuterSgdConfig::diloco(), world.clone())
                    .and_then(|a| a.with_compression(Some(compression)))
                    .expect("averager");
            let mut m = model(&theta0(), DType::F32);
            a.reset_global(&m, &ParamSelection::All).expect("θ");
            for k in 0..12 {
                let x: Vec<f32> = values(&m)
                    .iter()
                    .zip(progress(world.rank(), k))
                    .map(|(t, d)| t - 0.1 * d)
                    .collect();
                m = a
                    .average_parameters(model(&x, DType::F32), &ParamSelection::All)
                    .expect("step");
            }
            a.finish().expect("finish");
            values(&m)
        })
        .expect("run");
    assert_same("streaming, rank 1 against rank 0", &ends[1], &ends[0]);
    assert_ne!(ends[0], theta0(), "the outer steps moved θ");
}

#[test]
fn lossy_compression_refuses_what_it_cannot_do() {
    let int8 = AverageCompression::lossy("int8".parse().expect("a codec"));
    let world = ThreadWorld::new(1).expect("world");
    let errors = world
        .run(move |g| {
            let diloco =
                || OuterAverager::periodic(2, 0, OuterSgdConfig::diloco().into(), g.clone());
            let mut out = Vec::new();
            // f64 parameters: the codecs encode f32.
            let mut a = diloco()
                .and_then(|a| a.with_compression(Some(int8)))
                .expect("a");
            let m = model(&theta0(), DType::F64);
            a.reset_global(&m, &ParamSelection::All).expect("θ");
            let m = a
                .average_parameters(m, &ParamSelection::All)
                .expect("step 0");
            out.push(a.average_parameters(m, &ParamSelection::All).map(|_| ()));
            // Delta of mean averages the parameters: nothing to compress.
            out.push(
                diloco()
                    .and_then(|a| a.with_compression(Some(int8)))
                    .and_then(|a| a.with_reduce(PseudoGradient::DeltaOfMean))
                    .map(|_| ()),
            );
            // A chunk of 0.
            let zero = AverageCompression::Lossy {
                spec: spec("int4", 0, Rounding::Nearest),
                error_feedback: true,
                exchange: LossyExchange::AllGather,
            };
            out.push(
                diloco()
                    .and_then(|a| a.with_compression(Some(zero)))
                    .map(|_| ()),
            );
            out.into_iter()
                .map(|r| r.expect_err("refused").to_string())
                .collect::<Vec<_>>()
        })
        .expect("run")
        .remove(0);
    assert!(errors[0].contains("f64"), "{}", errors[0]);
    assert!(errors[1].contains("mean-of-deltas"), "{}", errors[1]);
    assert!(errors[2].contains('0'), "{}", errors[2]);
}

/// What one sync moves on the wire (`Traffic::wire_bytes`), per rank, with `compression` on
/// `world` thread ranks and a model of `n` values.
fn sync_wire_bytes(compression: AverageCompression, world: usize, n: usize) -> u64 {
    let theta: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let per_rank = ThreadWorld::new(world)
        .expect("world")
        .run(move |group| {
            let mut a =
                OuterAverager::periodic(1, 0, OuterSgdConfig::diloco().into(), group.clone())
                    .and_then(|a| a.with_compression(Some(compression)))
                    .expect("averager");
            let m = model(&theta, DType::F32);
            a.reset_global(&m, &ParamSelection::All).expect("θ");
            let x: Vec<f32> = theta.iter().map(|t| t - 0.01).collect();
            let before = group.traffic();
            a.average_parameters(model(&x, DType::F32), &ParamSelection::All)
                .expect("sync");
            (group.traffic() - before).wire_bytes
        })
        .expect("run");
    assert!(per_rank.windows(2).all(|w| w[0] == w[1]), "{per_rank:?}");
    per_rank[0]
}

/// The quantized all-reduce's bytes do not grow with the world: against an fp16 ring
/// all-reduce, int8 costs at most 0.55× and int4 at most 0.30× on 8 and 16 ranks (issue 57's
/// targets; the ideal is 0.5× and 0.25×, plus 4 bytes of scale per chunk of 1024 and the
/// padding of the shards' blocks), where the all-gather costs 2.0×/1.0× and 4.0×/2.0×. `auto`
/// takes it there, and keeps the all-gather on 2 ranks, where both move one message.
#[test]
fn the_quantized_all_reduce_keeps_compressed_averages_cheap_on_8_and_16_ranks() {
    let n = 1 << 16;
    let auto = |codec: &str| AverageCompression::lossy(codec.parse().expect("codec"));
    let fp16 = AverageCompression::Half(localsgd_averagers::comm::Precision::Fp16);
    for world in [8, 16] {
        let half = sync_wire_bytes(fp16, world, n) as f64;
        let (r8, r4) = (
            sync_wire_bytes(auto("int8"), world, n) as f64 / half,
            sync_wire_bytes(auto("int4"), world, n) as f64 / half,
        );
        assert!((0.5..=0.55).contains(&r8), "{world} ranks: int8 {r8}");
        assert!((0.25..=0.30).contains(&r4), "{world} ranks: int4 {r4}");
    }
    let gathered = sync_wire_bytes(
        AverageCompression::Lossy {
            spec: spec("int8", 1024, Rounding::Nearest),
            error_feedback: true,
            exchange: LossyExchange::AllGather,
        },
        2,
        n,
    );
    assert_eq!(sync_wire_bytes(auto("int8"), 2, n), gathered);
}

/// Through the averager, the quantized all-reduce is `codec::quantized_mean` (checked against
/// the numpy reference in `comm`) on each rank's pseudo-gradient with the averager's two
/// residuals: 4 outer steps (SGD, lr 1) on 3 ranks, each rank's `θ` bit-identical to a loop
/// that calls it by hand, the ranks identical to each other; and the owner's residual is part
/// of the checkpoint (a resume after 2 steps ends the same).
#[test]
fn the_averager_takes_the_quantized_all_reduce_with_both_residuals() {
    use localsgd_averagers::comm::codec::{ErrorFeedback, QuantizedFeedback, quantized_mean};
    for (codec, chunk, rounding) in [
        ("int8", 64, Rounding::Nearest),
        ("int4", 32, Rounding::Stochastic { seed: 11 }),
        ("topk:0.1+int8", 50, Rounding::Nearest),
    ] {
        let spec = spec(codec, chunk, rounding);
        let compression = AverageCompression::Lossy {
            spec,
            error_feedback: true,
            exchange: LossyExchange::Auto,
        };
        let ranks = through_averager(compression, 4, None);
        let resumed = through_averager(compression, 4, Some(2));
        let by_hand = ThreadWorld::new(WORLD)
            .expect("world")
            .run(move |group| {
                let r = group.rank();
                let mut theta = theta0();
                let (mut sent, mut owned) = (ErrorFeedback::new(N), ErrorFeedback::new(N));
                let mut out = Vec::new();
                for k in 0..4 {
                    let delta = progress(r, k);
                    // θ − x with x = θ − progress, as the averager computes it.
                    let x: Vec<f32> = theta.iter().zip(&delta).map(|(t, d)| t - d).collect();
                    let d: Vec<f32> = theta.iter().zip(&x).map(|(t, x)| t - x).collect();
                    let mut mean = vec![0.0f32; N];
                    let feedback = QuantizedFeedback {
                        sent: &mut sent,
                        owned: &mut owned,
                    };
                    quantized_mean(&*group, &spec, &d, Some(feedback), k, &mut mean).expect("mean");
                    for (t, m) in theta.iter_mut().zip(&mean) {
                        *t -= m;
                    }
                    out.push(theta.clone());
                }
                out
            })
            .expect("run");
        for r in 0..WORLD {
            for k in 0..4 {
                let what = format!("{codec}, rank {r}, round {k}");
                assert_same(&what, &ranks[r][k], &by_hand[r][k]);
                assert_same(&what, &ranks[r][k], &ranks[0][k]);
            }
            assert_same(
                &format!("{codec}, resumed rank {r}"),
                &resumed[r][3],
                &ranks[r][3],
            );
        }
    }
}

/// The figures issue 57 states for today's all-gather of compressed pseudo-gradients, by the
/// wire count: against an fp16 ring all-reduce, int8 costs 2.0× and int4 1.0× at 8 ranks, 4.0×
/// and 2.0× at 16 (the codecs' scales, 4 bytes per chunk of 1024, add under 1%). At 2 ranks an
/// all-gather moves its one message and the all-reduce its buffer: int8 is half of fp16.
#[test]
fn compressed_averages_cost_world_minus_one_messages_on_the_wire() {
    let n = 1 << 16;
    let int = |codec: &str| match AverageCompression::lossy(codec.parse().expect("codec")) {
        AverageCompression::Lossy {
            spec,
            error_feedback,
            ..
        } => AverageCompression::Lossy {
            spec,
            error_feedback,
            exchange: LossyExchange::AllGather,
        },
        half => half,
    };
    let fp16 = AverageCompression::Half(localsgd_averagers::comm::Precision::Fp16);
    for (world, int8_ratio, int4_ratio) in [(2, 0.5, 0.25), (8, 2.0, 1.0), (16, 4.0, 2.0)] {
        let half = sync_wire_bytes(fp16, world, n) as f64;
        let ratio = |c: &str| sync_wire_bytes(int(c), world, n) as f64 / half;
        let (r8, r4) = (ratio("int8"), ratio("int4"));
        assert!(
            (r8 / int8_ratio - 1.0).abs() < 0.01,
            "{world} ranks: int8 {r8}"
        );
        assert!(
            (r4 / int4_ratio - 1.0).abs() < 0.01,
            "{world} ranks: int4 {r4}"
        );
    }
}
