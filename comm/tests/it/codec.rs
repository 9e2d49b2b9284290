//! The lossy pseudo-gradient codec (semantics §11): every message byte, decoded value, mean and
//! error-feedback residual equals the independent numpy oracle's (`scripts/codec_reference.py`,
//! committed as `tests/data/codec_vectors.json`), bit for bit; a resume from a saved residual
//! continues the uninterrupted run; message lengths depend only on (spec, n); and corrupt
//! messages from a peer are errors, never panics.

use localsgd_comm::codec::{
    Codec, CodecError, CodecSpec, ErrorFeedback, QuantizedFeedback, Quantizer, Rounding, decode,
    encode, encode_with_feedback, mean_of_messages, message_len, quantized_mean,
    quantized_mean_block, quantized_mean_wire_bytes, shards, wire_bytes,
};
use localsgd_comm::{ThreadWorld, Traffic};
use proptest::prelude::*;

#[derive(serde::Deserialize)]
struct Vectors {
    cases: Vec<Case>,
    quantized_mean: Vec<QuantizedMeanCase>,
}

/// A case of the quantized all-reduce: `world` ranks, their inputs per round, every rank's first
/// message, every owner's second message, the mean every rank gets, and (with feedback) each
/// rank's residuals after the round.
#[derive(serde::Deserialize)]
struct QuantizedMeanCase {
    name: String,
    spec: CodecSpec,
    n: usize,
    world: usize,
    feedback: bool,
    shards: Vec<[usize; 2]>,
    block: usize,
    wire_bytes: u64,
    rounds: Vec<QuantizedMeanRound>,
}

#[derive(serde::Deserialize)]
struct QuantizedMeanRound {
    round: u64,
    inputs: Vec<Vec<u32>>,
    messages: Vec<String>,
    owner_messages: Vec<String>,
    mean: Vec<u32>,
    sent: Option<Vec<Vec<u32>>>,
    owned: Option<Vec<Vec<u32>>>,
}

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    spec: CodecSpec,
    n: usize,
    world: usize,
    feedback: bool,
    rounds: Vec<RoundVectors>,
    resume: Option<Resume>,
}

#[derive(serde::Deserialize)]
struct RoundVectors {
    round: u64,
    inputs: Vec<Vec<u32>>,
    messages: Vec<String>,
    decoded: Vec<Vec<u32>>,
    mean: Vec<u32>,
    residuals: Option<Vec<Vec<u32>>>,
}

#[derive(serde::Deserialize)]
struct Resume {
    after_rounds: usize,
    saved_residuals: Vec<Vec<u32>>,
}

fn vectors() -> Vectors {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/codec_vectors.json");
    let text = std::fs::read_to_string(path).expect("read the codec vectors");
    serde_json::from_str(&text).expect("parse the codec vectors")
}

fn floats(bits: &[u32]) -> Vec<f32> {
    bits.iter().map(|&b| f32::from_bits(b)).collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn spec(codec: &str, chunk: usize, rounding: Rounding) -> CodecSpec {
    CodecSpec {
        codec: codec.parse().unwrap(),
        chunk,
        rounding,
    }
}

/// Run `case`'s rounds `rounds` with the given residuals (error feedback) and check each against
/// the oracle: every rank's message and decoded vector, the mean, and the residuals.
fn check_rounds(case: &Case, rounds: std::ops::Range<usize>, feedback: &mut [ErrorFeedback]) {
    let (spec, n) = (&case.spec, case.n);
    for want in &case.rounds[rounds] {
        let at = format!("case {} round {}", case.name, want.round);
        let mut gathered = Vec::new();
        for rank in 0..case.world {
            let x = floats(&want.inputs[rank]);
            let mut msg = Vec::new();
            let fb = case.feedback.then(|| &mut feedback[rank]);
            encode_with_feedback(spec, fb, &x, want.round, rank, &mut msg).unwrap();
            assert_eq!(hex(&msg), want.messages[rank], "{at} rank {rank}: message");
            assert_eq!(msg.len(), message_len(spec, n), "{at}: length");
            let mut d = vec![0.0; n];
            decode(spec, &msg, n, &mut d).unwrap();
            assert_eq!(bits(&d), want.decoded[rank], "{at} rank {rank}: decoded");
            if let Some(residuals) = &want.residuals {
                assert_eq!(
                    bits(feedback[rank].residual()),
                    residuals[rank],
                    "{at} rank {rank}: residual"
                );
            }
            gathered.extend_from_slice(&msg);
        }
        let mut mean = vec![0.0; n];
        mean_of_messages(spec, &gathered, case.world, n, &mut mean).unwrap();
        assert_eq!(bits(&mean), want.mean, "{at}: mean");
    }
}

#[test]
fn codec_vectors_cover_every_codec_and_feature() {
    let v = vectors();
    let names: Vec<&str> = v.cases.iter().map(|c| c.name.as_str()).collect();
    for want in [
        "int8_tail",
        "int4_tail",
        "zero_chunk_int8",
        "int8_ties",
        "int4_ties",
        "ties_topk:0.25",
        "topk_0.02_int4",
        "topk_0.1_int8",
        "topk_0.25_f32",
        "stochastic_int8",
        "feedback_topk_0.1_int8",
    ] {
        assert!(names.contains(&want), "missing case {want}");
    }
    let codecs: Vec<String> = v.cases.iter().map(|c| c.spec.codec.to_string()).collect();
    for want in [
        "int8",
        "int4",
        "topk:0.25",
        "topk:0.1+int8",
        "topk:0.02+int4",
    ] {
        assert!(codecs.iter().any(|c| c == want), "no case of {want}");
    }
    assert!(v.cases.iter().any(|c| c.resume.is_some()));
    assert!(
        v.cases
            .iter()
            .any(|c| matches!(c.spec.rounding, Rounding::Stochastic { .. }) && c.world == 2)
    );
}

#[test]
fn codec_vectors_match_bit_for_bit() {
    for case in vectors().cases {
        let mut feedback = vec![ErrorFeedback::new(case.n); case.world];
        check_rounds(&case, 0..case.rounds.len(), &mut feedback);
    }
}

#[test]
fn codec_resume_from_saved_residual_continues_the_run() {
    let mut resumed = 0;
    for case in vectors().cases {
        let Some(resume) = &case.resume else { continue };
        let at = resume.after_rounds;
        // The run up to the checkpoint; its residuals are the saved ones.
        let mut feedback = vec![ErrorFeedback::new(case.n); case.world];
        check_rounds(&case, 0..at, &mut feedback);
        for (rank, saved) in resume.saved_residuals.iter().enumerate() {
            assert_eq!(&bits(feedback[rank].residual()), saved, "{}", case.name);
        }
        // A new process: the residuals restored from the checkpoint (through serde), then the
        // remaining rounds equal the uninterrupted run's.
        let mut restored: Vec<ErrorFeedback> = resume
            .saved_residuals
            .iter()
            .map(|saved| {
                let json = serde_json::to_string(&ErrorFeedback::from_residual(floats(saved)));
                serde_json::from_str(&json.unwrap()).unwrap()
            })
            .collect();
        check_rounds(&case, at..case.rounds.len(), &mut restored);
        resumed += 1;
    }
    assert!(resumed >= 3);
}

/// What one rank saw in one round of a quantized mean: its output, its two residuals, and the
/// traffic of the call.
struct QuantizedMeanSeen {
    mean: Vec<u32>,
    sent: Vec<u32>,
    owned: Vec<u32>,
    traffic: Traffic,
}

/// Run every round of `case` on a thread world of `case.world` ranks, each keeping its residuals
/// across rounds; per rank, per round, what it saw.
fn run_quantized_mean(case: &QuantizedMeanCase) -> Vec<Vec<QuantizedMeanSeen>> {
    ThreadWorld::new(case.world)
        .unwrap()
        .run(|group| {
            let rank = group.rank();
            let (mut sent, mut owned) = (ErrorFeedback::new(case.n), ErrorFeedback::new(case.n));
            let mut seen = Vec::new();
            for want in &case.rounds {
                let x = floats(&want.inputs[rank]);
                let mut out = vec![f32::NAN; case.n];
                let feedback = case.feedback.then_some(QuantizedFeedback {
                    sent: &mut sent,
                    owned: &mut owned,
                });
                let before = group.traffic();
                quantized_mean(&*group, &case.spec, &x, feedback, want.round, &mut out)
                    .unwrap_or_else(|e| panic!("case {} rank {rank}: {e}", case.name));
                let traffic = group.traffic() - before;
                seen.push(QuantizedMeanSeen {
                    mean: bits(&out),
                    sent: bits(sent.residual()),
                    owned: bits(owned.residual()),
                    traffic,
                });
            }
            seen
        })
        .unwrap()
}

#[test]
fn codec_quantized_mean_vectors_cover_every_feature() {
    let cases = vectors().quantized_mean;
    let has = |f: &dyn Fn(&QuantizedMeanCase) -> bool| cases.iter().any(f);
    let chunks = |c: &QuantizedMeanCase| c.n.div_ceil(c.spec.chunk);
    assert!(has(&|c| c.world == 3
        && c.spec.codec == Codec::Int8
        && !c.n.is_multiple_of(c.spec.chunk)
        && !chunks(c).is_multiple_of(c.world)));
    assert!(has(&|c| c.world == 3
        && c.spec.codec == Codec::Int4
        && !c.n.is_multiple_of(c.spec.chunk)
        && !chunks(c).is_multiple_of(c.world)));
    assert!(has(&|c| c.world == 4 && chunks(c) < c.world));
    assert!(has(&|c| c.spec.codec == Codec::Int4
        && matches!(c.spec.rounding, Rounding::Stochastic { seed } if seed > 1 << 63)));
    assert!(has(&|c| c.spec.codec.to_string() == "topk:0.25+int8"));
    for codec in ["int4", "topk:0.1+int8"] {
        assert!(
            has(&|c| c.spec.codec.to_string() == codec
                && c.feedback
                && c.world == 3
                && c.rounds.len() == 3),
            "no feedback case of {codec}"
        );
    }
    assert!(has(&|c| c.world == 1 && !c.feedback));
    assert!(has(&|c| c.world == 1 && c.feedback));
}

#[test]
fn codec_quantized_mean_shards_block_and_wire_bytes_match_the_reference() {
    for case in vectors().quantized_mean {
        let (spec, n, world) = (&case.spec, case.n, case.world);
        let got: Vec<[usize; 2]> = shards(n, spec.chunk, world)
            .into_iter()
            .map(|r| [r.start, r.end])
            .collect();
        assert_eq!(got, case.shards, "case {}: shards", case.name);
        assert_eq!(
            quantized_mean_block(spec, n, world),
            case.block,
            "case {}: block",
            case.name
        );
        assert_eq!(
            quantized_mean_wire_bytes(spec, n, world),
            case.wire_bytes,
            "case {}: wire bytes",
            case.name
        );
    }
}

/// The reference's messages agree with the codec's own pieces: every rank's first message is
/// `encode_with_feedback` of its input, and every owner's second message decodes to the mean on
/// its shard (so the oracle's recorded messages are the ones its means come from).
#[test]
fn codec_quantized_mean_reference_messages_are_consistent() {
    for case in vectors().quantized_mean {
        let spec = &case.spec;
        let mut sent = vec![ErrorFeedback::new(case.n); case.world];
        for want in &case.rounds {
            let at = format!("case {} round {}", case.name, want.round);
            for (rank, fb) in sent.iter_mut().enumerate() {
                let mut msg = Vec::new();
                let x = floats(&want.inputs[rank]);
                let fb = case.feedback.then_some(fb);
                encode_with_feedback(spec, fb, &x, want.round, rank, &mut msg).unwrap();
                assert_eq!(hex(&msg), want.messages[rank], "{at} rank {rank}: message");
            }
            for (j, [start, end]) in case.shards.iter().copied().enumerate() {
                let g = &want.owner_messages[j];
                let bytes: Vec<u8> = (0..g.len() / 2)
                    .map(|i| u8::from_str_radix(&g[2 * i..2 * i + 2], 16).unwrap())
                    .collect();
                assert_eq!(
                    bytes.len(),
                    message_len(spec, end - start),
                    "{at} owner {j}"
                );
                assert!(bytes.len() <= case.block, "{at} owner {j}");
                let mut d = vec![0.0; end - start];
                decode(spec, &bytes, end - start, &mut d).unwrap();
                assert_eq!(bits(&d), want.mean[start..end], "{at} owner {j}: decoded");
            }
        }
    }
}

#[test]
fn codec_quantized_mean_matches_the_reference_bit_for_bit() {
    for case in vectors().quantized_mean {
        let seen = run_quantized_mean(&case);
        assert_eq!(seen.len(), case.world);
        for (rank, rounds) in seen.iter().enumerate() {
            for (got, want) in rounds.iter().zip(&case.rounds) {
                let at = format!("case {} round {} rank {rank}", case.name, want.round);
                assert_eq!(got.mean, want.mean, "{at}: mean");
                if let (Some(sent), Some(owned)) = (&want.sent, &want.owned) {
                    assert_eq!(got.sent, sent[rank], "{at}: sent residual");
                    assert_eq!(got.owned, owned[rank], "{at}: owned residual");
                } else {
                    // Without feedback the residuals stay zero.
                    assert!(got.sent.iter().chain(&got.owned).all(|&b| b == 0), "{at}");
                }
                assert_eq!(got.traffic.wire_bytes, case.wire_bytes, "{at}: wire bytes");
            }
        }
    }
}

const CODECS: [&str; 8] = [
    "int8",
    "int4",
    "topk:0.01",
    "topk:0.3",
    "topk:1",
    "topk:0.07+int8",
    "topk:0.5+int4",
    "topk:0.02+int4",
];

#[test]
fn codec_message_len_equals_encoded_length() {
    let mut seed = 1u64;
    for codec in CODECS {
        for chunk in [1, 2, 3, 7, 8, 64, 100, 4096, 65536] {
            for n in [0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 199, 1000, 4097, 70_000] {
                for rounding in [Rounding::Nearest, Rounding::Stochastic { seed }] {
                    let spec = spec(codec, chunk, rounding);
                    let x: Vec<f32> = (0..n)
                        .map(|i| ((i * 37 + chunk) % 23) as f32 - 11.0)
                        .collect();
                    let mut msg = vec![1, 2, 3]; // cleared by encode
                    encode(&spec, &x, 3, 1, &mut msg).unwrap();
                    assert_eq!(msg.len(), message_len(&spec, n), "{codec} {chunk} {n}");
                    assert_eq!(wire_bytes(&spec, n), msg.len());
                    let mut d = vec![f32::NAN; n];
                    decode(&spec, &msg, n, &mut d).unwrap();
                    assert!(d.iter().all(|v| v.is_finite()));
                    seed += 1;
                }
            }
        }
    }
}

#[test]
fn codec_lossless_cases_round_trip_exactly() {
    // Top-k of everything sends every value as f32.
    let x: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin() * 1e-3).collect();
    let spec = spec("topk:1", 16, Rounding::Nearest);
    let mut msg = Vec::new();
    encode(&spec, &x, 0, 0, &mut msg).unwrap();
    let mut d = vec![0.0; 100];
    decode(&spec, &msg, 100, &mut d).unwrap();
    assert_eq!(bits(&d), bits(&x));
    // Integers up to 127 with a chunk's absmax 127 travel exactly as int8.
    let x: Vec<f32> = (0..254).map(|i| (i % 255) as f32 - 127.0).collect();
    let spec = spec_int("int8", 254);
    encode(&spec, &x, 0, 0, &mut msg).unwrap();
    let mut d = vec![0.0; 254];
    decode(&spec, &msg, 254, &mut d).unwrap();
    assert_eq!(d, x);
}

#[test]
fn codec_absmax_at_f32_max_is_the_documented_corner() {
    // scale = MAX / 127 rounds up, so 127 * scale overflows: the spec's arithmetic, kept as is.
    let mut msg = Vec::new();
    let mut d = [0.0f32; 2];
    encode(&spec_int("int8", 2), &[f32::MAX, 1.0], 0, 0, &mut msg).unwrap();
    decode(&spec_int("int8", 2), &msg, 2, &mut d).unwrap();
    assert_eq!(d, [f32::INFINITY, 0.0]);
    encode(&spec_int("int4", 2), &[f32::MAX, 1.0], 0, 0, &mut msg).unwrap();
    decode(&spec_int("int4", 2), &msg, 2, &mut d).unwrap();
    assert!(d[0].is_finite());
}

fn spec_int(codec: &str, chunk: usize) -> CodecSpec {
    spec(codec, chunk, Rounding::Nearest)
}

#[test]
fn codec_stochastic_rounding_is_unbiased_and_keyed_by_round_and_rank() {
    let spec = spec("int4", 8, Rounding::Stochastic { seed: 9 });
    // Chunk absmax 7: scale 1, so 0.25 rounds up with probability 1/4.
    let x = [7.0f32, 0.25, -0.25, 2.5, 0.0, 0.0, 0.0, 0.0];
    let rounds = 4000;
    let mut sums = [0.0f64; 8];
    let mut d = [0.0f32; 8];
    let mut msg = Vec::new();
    for round in 0..rounds {
        encode(&spec, &x, round, 0, &mut msg).unwrap();
        decode(&spec, &msg, 8, &mut d).unwrap();
        for (s, v) in sums.iter_mut().zip(&d) {
            *s += f64::from(*v);
        }
    }
    for (s, want) in sums.iter().zip(&x) {
        let mean = s / rounds as f64;
        assert!((mean - f64::from(*want)).abs() < 0.05, "{mean} vs {want}");
    }
    // Same (round, rank): same bytes; another round or rank: other noise.
    let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.731).cos()).collect();
    let enc = |round, rank| {
        let mut m = Vec::new();
        encode(&spec, &x, round, rank, &mut m).unwrap();
        m
    };
    assert_eq!(enc(5, 1), enc(5, 1));
    assert_ne!(enc(5, 1), enc(6, 1));
    assert_ne!(enc(5, 1), enc(5, 0));
}

#[test]
fn codec_error_feedback_keeps_what_topk_did_not_send() {
    // Small integers: every sum below is exact, so sent + residual == sum of the inputs.
    let spec = spec("topk:0.25", 8, Rounding::Nearest);
    let mut fb = ErrorFeedback::new(16);
    assert_eq!((fb.len(), fb.is_empty()), (16, false));
    let mut sent = [0.0f32; 16];
    let mut total = [0.0f32; 16];
    let mut msg = Vec::new();
    let mut d = vec![0.0f32; 16];
    for round in 0..10u64 {
        let x: Vec<f32> = (0..16)
            .map(|i| ((i as u64 * 5 + round * 3) % 7) as f32 - 3.0)
            .collect();
        let y: Vec<f32> = x.iter().zip(fb.residual()).map(|(a, r)| a + r).collect();
        encode_with_feedback(&spec, Some(&mut fb), &x, round, 0, &mut msg).unwrap();
        decode(&spec, &msg, 16, &mut d).unwrap();
        let kept = d
            .iter()
            .zip(&y)
            .filter(|(d, y)| d == y && **d != 0.0)
            .count();
        assert!(kept <= 4, "round {round}: 2 of every 8 sent");
        for i in 0..16 {
            // Sent elements travel exactly; the others keep their whole y.
            assert!(d[i] == y[i] || d[i] == 0.0, "round {round} element {i}");
            assert_eq!(fb.residual()[i], y[i] - d[i]);
            sent[i] += d[i];
            total[i] += x[i];
            assert_eq!(
                sent[i] + fb.residual()[i],
                total[i],
                "round {round} element {i}"
            );
        }
    }
    // Without feedback: plain encode.
    let x = vec![1.0f32; 16];
    let mut a = Vec::new();
    encode_with_feedback(&spec, None, &x, 0, 0, &mut a).unwrap();
    encode(&spec, &x, 0, 0, &mut msg).unwrap();
    assert_eq!(a, msg);
    assert_eq!(fb.clone().into_residual(), fb.residual());
}

#[test]
fn codec_encode_rejects_non_finite_input_and_writes_nothing() {
    let spec = spec("int8", 4, Rounding::Nearest);
    let mut out = vec![42u8];
    let err = encode(&spec, &[1.0, 2.0, f32::NAN, f32::INFINITY], 0, 0, &mut out).unwrap_err();
    assert!(matches!(err, CodecError::NonFinite { index: 2, value } if value.is_nan()));
    assert_eq!(
        err.to_string(),
        "element 2 is NaN, which a lossy codec cannot encode (valid: finite values)"
    );
    assert_eq!(out, [42]);
    let err = encode(&spec, &[f32::NEG_INFINITY], 0, 0, &mut out).unwrap_err();
    assert_eq!(
        err.to_string(),
        "element 0 is -inf, which a lossy codec cannot encode (valid: finite values)"
    );
    // With feedback, x + residual overflowing is caught too, and the residual is kept.
    let mut fb = ErrorFeedback::from_residual(vec![0.0, f32::MAX]);
    let err =
        encode_with_feedback(&spec, Some(&mut fb), &[1.0, f32::MAX], 0, 0, &mut out).unwrap_err();
    assert!(
        matches!(err, CodecError::NonFinite { index: 1, .. }),
        "{err}"
    );
    assert_eq!(fb.residual(), [0.0, f32::MAX]);
    assert_eq!(out, [42]);
    let err = encode_with_feedback(&spec, Some(&mut fb), &[1.0; 3], 0, 0, &mut out).unwrap_err();
    assert_eq!(err.to_string(), "residual has length 2, expected 3");
}

#[test]
fn codec_invalid_specs_are_rejected_everywhere() {
    let zero = spec("int8", 0, Rounding::Nearest);
    let mut out = Vec::new();
    let msg = "codec chunk 0 is invalid (valid: chunk >= 1)";
    assert_eq!(
        encode(&zero, &[1.0], 0, 0, &mut out)
            .unwrap_err()
            .to_string(),
        msg
    );
    assert_eq!(
        decode(&zero, &[], 1, &mut [0.0]).unwrap_err().to_string(),
        msg
    );
    assert_eq!(
        mean_of_messages(&zero, &[], 1, 1, &mut [0.0])
            .unwrap_err()
            .to_string(),
        msg
    );
    let big = spec("topk:0.1", 65537, Rounding::Nearest);
    assert_eq!(
        encode(&big, &[1.0], 0, 0, &mut out).unwrap_err(),
        CodecError::ChunkTooLarge { chunk: 65537 }
    );
    let nan = CodecSpec {
        codec: Codec::TopK {
            fraction: 0.0,
            quantizer: Some(Quantizer::Int4),
        },
        chunk: 8,
        rounding: Rounding::Nearest,
    };
    assert_eq!(
        encode(&nan, &[1.0], 0, 0, &mut out)
            .unwrap_err()
            .to_string(),
        "topk fraction 0 is outside (0, 1] (valid: topk:F with 0 < F <= 1, optionally +int8 or +int4)"
    );
}

/// A valid message of `spec` for `n` elements, to corrupt.
fn message(spec: &CodecSpec, n: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..n).map(|i| i as f32 - 2.5).collect();
    let mut msg = Vec::new();
    encode(spec, &x, 0, 0, &mut msg).unwrap();
    msg
}

#[test]
fn codec_decode_rejects_corrupt_messages() {
    let check = |spec: &CodecSpec, n: usize, edit: &dyn Fn(&mut Vec<u8>), want: &str| {
        let mut msg = message(spec, n);
        edit(&mut msg);
        let mut out = vec![0.0; n];
        let err = decode(spec, &msg, n, &mut out).unwrap_err();
        assert_eq!(err.to_string(), want, "{}", spec.codec);
    };
    let int8 = spec_int("int8", 4);
    let int4 = spec_int("int4", 4);
    let topk = spec_int("topk:0.5", 4);
    let topk8 = spec_int("topk:0.5+int8", 4);
    let topk4 = spec_int("topk:0.75+int4", 4);
    check(
        &int8,
        6,
        &|m| {
            m.pop();
        },
        "message has length 13, expected 14",
    );
    check(
        &int8,
        6,
        &|m| m.push(0),
        "message has length 15, expected 14",
    );
    check(
        &int8,
        6,
        &|m| m[8..12].copy_from_slice(&f32::NAN.to_le_bytes()),
        "corrupt message: scale NaN is not a finite non-negative number at byte 8",
    );
    check(
        &int8,
        6,
        &|m| m[0..4].copy_from_slice(&(-1.0f32).to_le_bytes()),
        "corrupt message: scale -1 is not a finite non-negative number at byte 0",
    );
    check(
        &int4,
        6,
        &|m| m[6..10].copy_from_slice(&f32::INFINITY.to_le_bytes()),
        "corrupt message: scale inf is not a finite non-negative number at byte 6",
    );
    check(
        &int8,
        6,
        &|m| m[5] = 0x80,
        "corrupt message: int8 value -128 is outside [-127, 127] at byte 5",
    );
    check(
        &int4,
        5,
        &|m| m[10] |= 0x30, // chunk 2 (1 element): its padding nibble
        "corrupt message: padding nibble 3 is not 0 at byte 10",
    );
    check(
        &int4,
        5,
        &|m| m[5] = 0x88,
        "corrupt message: int4 value -8 is outside [-7, 7] at byte 5",
    );
    // topk:0.5 of a 4-element chunk: 2 offsets then 2 f32.
    check(
        &topk,
        4,
        &|m| m[0..2].copy_from_slice(&4u16.to_le_bytes()),
        "corrupt message: top-k offset 4 is outside the chunk of 4 elements at byte 0",
    );
    check(
        &topk,
        4,
        &|m| m[0..2].copy_from_slice(&3u16.to_le_bytes()),
        "corrupt message: top-k offset 1 does not follow 3 in ascending order at byte 2",
    );
    check(
        &topk,
        4,
        &|m| m[2..4].copy_from_slice(&0u16.to_le_bytes()),
        "corrupt message: top-k offset 0 does not follow 0 in ascending order at byte 2",
    );
    check(
        &topk,
        4,
        &|m| m[8..12].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes()),
        "corrupt message: top-k value -inf is not finite at byte 8",
    );
    check(
        &topk8,
        6,
        &|m| m[9] = 0x80, // chunk 1: scale, 2 offsets, then the values at bytes 8 and 9
        "corrupt message: int8 value -128 is outside [-127, 127] at byte 9",
    );
    // topk:0.75+int4 of a 2-element tail: k = 2, one byte; of a 4-element chunk: k = 3, two
    // bytes, the last with a padding nibble.
    check(
        &topk4,
        6,
        &|m| m[11] = 0x70,
        "corrupt message: padding nibble 7 is not 0 at byte 11",
    );
    check(
        &topk4,
        6,
        &|m| m[12..16].copy_from_slice(&f32::NAN.to_le_bytes()),
        "corrupt message: scale NaN is not a finite non-negative number at byte 12",
    );
    // The output must hold n elements.
    let msg = message(&int8, 6);
    assert_eq!(
        decode(&int8, &msg, 6, &mut [0.0; 5])
            .unwrap_err()
            .to_string(),
        "output has length 5, expected 6"
    );
}

#[test]
fn codec_mean_of_messages_errors_name_the_rank() {
    let spec = spec_int("int8", 4);
    let mut gathered = [message(&spec, 6), message(&spec, 6), message(&spec, 6)].concat();
    let mut out = [0.0f32; 6];
    mean_of_messages(&spec, &gathered, 3, 6, &mut out).unwrap();
    gathered[14 + 5] = 0x80;
    let err = mean_of_messages(&spec, &gathered, 3, 6, &mut out).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 1's message: corrupt message: int8 value -128 is outside [-127, 127] at byte 5"
    );
    assert!(matches!(err, CodecError::Rank { rank: 1, .. }));
    assert_eq!(
        mean_of_messages(&spec, &gathered, 2, 6, &mut out)
            .unwrap_err()
            .to_string(),
        "gathered messages has length 42, expected 28"
    );
    assert_eq!(
        mean_of_messages(&spec, &[], 0, 6, &mut out)
            .unwrap_err()
            .to_string(),
        "world size 0 is invalid for mean_of_messages (valid: world >= 1)"
    );
    assert_eq!(
        mean_of_messages(&spec, &gathered, 3, 6, &mut [0.0; 2])
            .unwrap_err()
            .to_string(),
        "output has length 2, expected 6"
    );
    // Nothing to average.
    mean_of_messages(&spec, &[], 4, 0, &mut []).unwrap();
}

fn any_spec() -> impl Strategy<Value = CodecSpec> {
    (0..CODECS.len(), 1usize..40, any::<u64>())
        .prop_map(|(c, chunk, seed)| spec(CODECS[c], chunk, Rounding::Stochastic { seed }))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// A peer's bytes of the right length decode to values (never NaN) or to an error, never a
    /// panic. (Infinities can come out of a valid message: `qmax * scale` may overflow for a
    /// chunk whose absmax is within rounding of `f32::MAX`, semantics §11.)
    #[test]
    fn codec_random_messages_never_panic(
        spec in any_spec(),
        n in 0usize..120,
        seed in any::<u64>(),
    ) {
        let len = message_len(&spec, n);
        let mut s = seed;
        let msg: Vec<u8> = (0..len)
            .map(|_| {
                s = localsgd_comm::codec::rng::splitmix64(s);
                (s >> 56) as u8
            })
            .collect();
        let mut out = vec![0.0f32; n];
        if decode(&spec, &msg, n, &mut out).is_ok() {
            prop_assert!(out.iter().all(|v| !v.is_nan()));
        }
        let mut out = vec![0.0f32; n];
        let _ = mean_of_messages(&spec, &[msg.clone(), msg].concat(), 2, n, &mut out);
    }

    /// Encode then decode stays within half a step (nearest) or one step (stochastic) of the
    /// chunk's scale for the quantized codecs, and the length is message_len.
    #[test]
    fn codec_round_trip_error_is_bounded(
        spec in any_spec(),
        x in proptest::collection::vec(-1e3f32..1e3, 0..200),
        round in any::<u64>(),
        rank in 0usize..64,
    ) {
        let mut msg = Vec::new();
        encode(&spec, &x, round, rank, &mut msg).unwrap();
        prop_assert_eq!(msg.len(), message_len(&spec, x.len()));
        let mut d = vec![0.0f32; x.len()];
        decode(&spec, &msg, x.len(), &mut d).unwrap();
        if let Codec::Int8 | Codec::Int4 = spec.codec {
            let qmax = f32::from(spec.codec.quantizer().unwrap().qmax());
            for (c, (xs, ds)) in x.chunks(spec.chunk).zip(d.chunks(spec.chunk)).enumerate() {
                let scale = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) / qmax;
                for (a, b) in xs.iter().zip(ds) {
                    prop_assert!((a - b).abs() <= scale * 1.001, "chunk {}: {} vs {}", c, a, b);
                }
            }
        }
    }
}
