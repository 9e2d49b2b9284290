#!/usr/bin/env python3
"""Reference numbers for the lossy pseudo-gradient codec (book: semantics §11).

An independent implementation, in numpy float32 arithmetic step by step, of the codec that
`localsgd_comm::codec` implements: int8 and int4 quantization with one scale per chunk, top-k
(with f32, int8 or int4 values), stochastic rounding from splitmix64, the mean of the ranks'
messages, and error feedback; and the quantized all-reduce (`quantized_mean`: each rank encodes
its vector, each owner of a chunk-aligned shard averages every rank's shard of the messages and
encodes the mean again with noise stream 2^32 + owner, under the top-level key "quantized_mean"). It was written from the semantics, not from the Rust code, and reads
nothing the Rust code writes. It prints JSON; the tests (comm/tests/it/codec.rs) read the
committed copy and compare every byte of every message and every bit of every float:

    python3 scripts/codec_reference.py > comm/tests/data/codec_vectors.json

Floats are stored as their u32 bit patterns, messages as hex. Needs numpy only.
"""

import json
import math
import struct
import sys

import numpy as np

F32 = np.float32
MASK64 = (1 << 64) - 1
QMAX = {"int8": 127, "int4": 7}


# ---- stochastic rounding noise -------------------------------------------------------------

def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def noise_key(seed, rnd, rank):
    return splitmix64(splitmix64(splitmix64(seed) ^ rnd) ^ rank)


def uniform(key, index):
    u = F32(splitmix64(key ^ index) >> 40) / F32(16777216.0)
    assert type(u) is F32 and 0.0 <= u < 1.0
    return u


# ---- the spec -------------------------------------------------------------------------------

def parse_codec(text):
    """'int8' | 'int4' | 'topk:F' | 'topk:F+int8' | 'topk:F+int4' -> dict."""
    if text in QMAX:
        return {"topk": False, "quant": text}
    assert text.startswith("topk:"), text
    rest = text[len("topk:"):]
    quant = None
    if "+" in rest:
        rest, quant = rest.split("+")
        assert quant in QMAX, quant
    fraction = float(rest)
    assert 0.0 < fraction <= 1.0
    return {"topk": True, "quant": quant, "fraction": fraction}


def kept_count(fraction, length):
    return min(length, max(1, math.ceil(fraction * length)))  # Python floats are f64


def chunks(n, chunk):
    """(start, length) of every chunk of a vector of n elements."""
    return [(s, min(chunk, n - s)) for s in range(0, n, chunk)]


# ---- quantization ---------------------------------------------------------------------------

def quantize(values, global_indices, quant, key):
    """values: float32 scalars. Returns (scale, list of ints). key None: round to nearest even."""
    qmax = QMAX[quant]
    absmax = F32(0.0)
    for v in values:
        a = np.abs(v)
        if a > absmax:
            absmax = a
    scale = absmax / F32(qmax)
    assert type(scale) is F32
    out = []
    for v, g in zip(values, global_indices):
        if scale == F32(0.0):
            out.append(0)
            continue
        t = v / scale
        if key is None:
            r = np.rint(t)
        else:
            r = np.floor(t + uniform(key, g))
        assert type(r) is F32
        out.append(int(min(max(r, F32(-qmax)), F32(qmax))))
    return scale, out


def pack(qs, quant):
    if quant == "int8":
        return bytes(q & 0xFF for q in qs)
    padded = qs + [0] * (len(qs) % 2)
    return bytes((padded[i] & 0xF) | ((padded[i + 1] & 0xF) << 4) for i in range(0, len(padded), 2))


def unpack(data, count, quant):
    if quant == "int8":
        return [b - 256 if b >= 128 else b for b in data[:count]]
    out = []
    for b in data:
        for nib in (b & 0xF, b >> 4):
            out.append(nib - 16 if nib >= 8 else nib)
    return out[:count]


def packed_len(count, quant):
    return count if quant == "int8" else (count + 1) // 2


def f32_bytes(v):
    return struct.pack("<f", float(v))


# ---- encode / decode / mean -----------------------------------------------------------------

def encode(spec, x, rnd, rank):
    codec = parse_codec(spec["codec"])
    rounding = spec["rounding"]
    key = None if rounding == "nearest" else noise_key(rounding["stochastic"]["seed"], rnd, rank)
    msg = bytearray()
    for start, length in chunks(len(x), spec["chunk"]):
        part = [x[start + j] for j in range(length)]
        if not codec["topk"]:
            scale, qs = quantize(part, [start + j for j in range(length)], codec["quant"], key)
            msg += f32_bytes(scale) + pack(qs, codec["quant"])
            continue
        k = kept_count(codec["fraction"], length)
        by_size = sorted(range(length), key=lambda j: (-float(np.abs(part[j])), j))
        kept = sorted(by_size[:k])
        offsets = b"".join(struct.pack("<H", j) for j in kept)
        if codec["quant"] is None:
            msg += offsets + b"".join(f32_bytes(part[j]) for j in kept)
        else:
            scale, qs = quantize([part[j] for j in kept], [start + j for j in kept], codec["quant"], key)
            msg += f32_bytes(scale) + offsets + pack(qs, codec["quant"])
    return bytes(msg)


def decode(spec, msg, n):
    codec = parse_codec(spec["codec"])
    out = np.zeros(n, dtype=F32)
    pos = 0

    def read_f32():
        nonlocal pos
        v = F32(struct.unpack_from("<f", msg, pos)[0])
        pos += 4
        return v

    for start, length in chunks(n, spec["chunk"]):
        if not codec["topk"]:
            scale = read_f32()
            size = packed_len(length, codec["quant"])
            for j, q in enumerate(unpack(msg[pos:pos + size], length, codec["quant"])):
                out[start + j] = F32(q) * scale
            pos += size
            continue
        k = kept_count(codec["fraction"], length)
        scale = read_f32() if codec["quant"] is not None else None
        kept = [struct.unpack_from("<H", msg, pos + 2 * i)[0] for i in range(k)]
        pos += 2 * k
        if codec["quant"] is None:
            for j in kept:
                out[start + j] = read_f32()
        else:
            size = packed_len(k, codec["quant"])
            for j, q in zip(kept, unpack(msg[pos:pos + size], k, codec["quant"])):
                out[start + j] = F32(q) * scale
            pos += size
    assert pos == len(msg), (pos, len(msg))
    return out


def mean_of_messages(spec, msgs, n):
    acc = np.zeros(n, dtype=F32)
    for msg in msgs:
        acc = acc + decode(spec, msg, n)
    return acc / F32(len(msgs))


# ---- cases ----------------------------------------------------------------------------------

def bits(a):
    return [int(b) for b in np.asarray(a, dtype=F32).view(np.uint32)]


def from_bits(b):
    return np.array(b, dtype=np.uint32).view(F32)


def rounding_of(seed):
    return "nearest" if seed is None else {"stochastic": {"seed": seed}}


def run_case(name, codec, chunk, inputs, rounds, seed=None, feedback=False, resume_after=None):
    """inputs[t][r]: rank r's vector (float32) in round t; rounds[t]: the round counter."""
    spec = {"codec": codec, "chunk": chunk, "rounding": rounding_of(seed)}
    world = len(inputs[0])
    n = len(inputs[0][0])
    residual = [np.zeros(n, dtype=F32) for _ in range(world)]
    out_rounds = []
    saved = None
    for t, rnd in enumerate(rounds):
        msgs, decoded = [], []
        for r in range(world):
            x = np.asarray(inputs[t][r], dtype=F32)
            y = x + residual[r] if feedback else x
            msg = encode(spec, y, rnd, r)
            d = decode(spec, msg, n)
            if feedback:
                residual[r] = y - d
            msgs.append(msg)
            decoded.append(d)
        entry = {
            "round": rnd,
            "inputs": [bits(inputs[t][r]) for r in range(world)],
            "messages": [m.hex() for m in msgs],
            "decoded": [bits(d) for d in decoded],
            "mean": bits(mean_of_messages(spec, msgs, n)),
        }
        if feedback:
            entry["residuals"] = [bits(res) for res in residual]
        out_rounds.append(entry)
        if resume_after is not None and t + 1 == resume_after:
            saved = [bits(res) for res in residual]
    case = {"name": name, "spec": spec, "n": n, "world": world, "feedback": feedback,
            "rounds": out_rounds}
    if resume_after is not None:
        # The resume itself: restore the saved residuals and run the remaining rounds.
        restored = [from_bits(s) for s in saved]
        for t in range(resume_after, len(rounds)):
            for r in range(world):
                y = np.asarray(inputs[t][r], dtype=F32) + restored[r]
                msg = encode(spec, y, rounds[t], r)
                restored[r] = y - decode(spec, msg, n)
                assert msg.hex() == out_rounds[t]["messages"][r]
                assert bits(restored[r]) == out_rounds[t]["residuals"][r]
        case["resume"] = {"after_rounds": resume_after, "saved_residuals": saved}
    return case


def normal(seed, n, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(F32)


def single(x):
    return [[np.asarray(x, dtype=F32)]]


# ---- the quantized all-reduce (reduce-scatter of messages, then all-gather of re-encoded shards)

OWNER_STREAM = 1 << 32


def message_len(spec, n):
    """Bytes of a message of n elements, chunk by chunk (additive over whole chunks)."""
    codec = parse_codec(spec["codec"])
    total = 0
    for _, length in chunks(n, spec["chunk"]):
        if not codec["topk"]:
            total += 4 + packed_len(length, codec["quant"])
            continue
        k = kept_count(codec["fraction"], length)
        if codec["quant"] is None:
            total += 6 * k
        else:
            total += 4 + 2 * k + packed_len(k, codec["quant"])
    return total


def shards(n, chunk, world):
    """[start, end) of every owner's elements: the K = ceil(n / chunk) chunks dealt contiguously,
    owner j taking chunks floor(j K / W) .. floor((j + 1) K / W)."""
    k = -(-n // chunk)
    return [(min(n, (j * k // world) * chunk), min(n, ((j + 1) * k // world) * chunk))
            for j in range(world)]


def encode_at(spec, x, offset, rnd, stream):
    """encode() of x as if it stood at global element offset `offset` (chunk-aligned): the
    stochastic noise of element i is drawn at global index offset + i, keyed by `stream`."""
    assert offset % spec["chunk"] == 0
    codec = parse_codec(spec["codec"])
    rounding = spec["rounding"]
    key = None if rounding == "nearest" else noise_key(rounding["stochastic"]["seed"], rnd, stream)
    msg = bytearray()
    for start, length in chunks(len(x), spec["chunk"]):
        part = [x[start + j] for j in range(length)]
        glob = offset + start
        if not codec["topk"]:
            scale, qs = quantize(part, [glob + j for j in range(length)], codec["quant"], key)
            msg += f32_bytes(scale) + pack(qs, codec["quant"])
            continue
        k = kept_count(codec["fraction"], length)
        by_size = sorted(range(length), key=lambda j: (-float(np.abs(part[j])), j))
        kept = sorted(by_size[:k])
        offsets = b"".join(struct.pack("<H", j) for j in kept)
        if codec["quant"] is None:
            msg += offsets + b"".join(f32_bytes(part[j]) for j in kept)
        else:
            scale, qs = quantize([part[j] for j in kept], [glob + j for j in kept], codec["quant"],
                                 key)
            msg += f32_bytes(scale) + offsets + pack(qs, codec["quant"])
    return bytes(msg)


def quantized_mean(spec, xs, rnd, sent=None, owned=None):
    """One quantized mean over len(xs) ranks. sent/owned: per-rank residual lists (updated in
    place) with error feedback, None without. Returns (first messages, owner messages, out)."""
    world = len(xs)
    n = len(xs[0])
    bounds = shards(n, spec["chunk"], world)
    # 1. Every rank quantizes its whole vector.
    first = []
    for r in range(world):
        x = np.asarray(xs[r], dtype=F32)
        y = x + sent[r] if sent is not None else x
        m = encode(spec, y, rnd, r)
        assert m == encode_at(spec, y, 0, rnd, r)
        assert len(m) == message_len(spec, n)
        if sent is not None:
            sent[r] = y - decode(spec, m, n)
        first.append(m)
    # 2. Each owner averages its shard of every rank's message, then quantizes the mean again.
    out = np.zeros(n, dtype=F32)
    second = []
    for j, (start, end) in enumerate(bounds):
        length = end - start
        lo, hi = message_len(spec, start), message_len(spec, end)
        acc = np.zeros(length, dtype=F32)
        for r in range(world):
            acc = acc + decode(spec, first[r][lo:hi], length)
        s = acc / F32(world)
        z = s + owned[j][start:end] if owned is not None else s
        g = encode_at(spec, z, start, rnd, OWNER_STREAM + j)
        assert len(g) == message_len(spec, length)
        d = decode(spec, g, length)
        if owned is not None:
            owned[j][start:end] = z - d
        out[start:end] = d
        second.append(g)
    return first, second, out


def quantized_mean_block(spec, n, world):
    return max(message_len(spec, end - start) for start, end in shards(n, spec["chunk"], world))


def run_quantized_mean_case(name, codec, chunk, inputs, rounds, seed=None, feedback=False):
    """inputs[t][r]: rank r's vector in round t; rounds[t]: the round counter."""
    spec = {"codec": codec, "chunk": chunk, "rounding": rounding_of(seed)}
    world = len(inputs[0])
    n = len(inputs[0][0])
    sent = [np.zeros(n, dtype=F32) for _ in range(world)] if feedback else None
    owned = [np.zeros(n, dtype=F32) for _ in range(world)] if feedback else None
    block = quantized_mean_block(spec, n, world)
    out_rounds = []
    for t, rnd in enumerate(rounds):
        first, second, out = quantized_mean(spec, inputs[t], rnd, sent, owned)
        entry = {
            "round": rnd,
            "inputs": [bits(inputs[t][r]) for r in range(world)],
            "messages": [m.hex() for m in first],
            "owner_messages": [g.hex() for g in second],
            "mean": bits(out),
        }
        if feedback:
            entry["sent"] = [bits(e) for e in sent]
            entry["owned"] = [bits(e) for e in owned]
        out_rounds.append(entry)
    return {"name": name, "spec": spec, "n": n, "world": world, "feedback": feedback,
            "shards": [list(b) for b in shards(n, chunk, world)], "block": block,
            "wire_bytes": 2 * (world - 1) * block, "rounds": out_rounds}


def quantized_mean_cases():
    cases = []
    # W = 3, n = 37 = 4 * 8 + 5: K = 5 chunks dealt 1, 2, 2 (K not divisible by W); int4's tail
    # chunk has an odd length.
    inputs = [[normal(40 + r, 37, 2.0) for r in range(3)]]
    for codec in ["int8", "int4"]:
        cases.append(run_quantized_mean_case("qm_w3_" + codec, codec, 8, inputs, [0]))
    # W = 4, K = 3 < W: owner 0 owns nothing.
    inputs = [[normal(50 + r, 20) for r in range(4)]]
    cases.append(run_quantized_mean_case("qm_w4_empty_shard_int8", "int8", 8, inputs, [4]))
    # Stochastic rounding (a seed above 2^63), 2 rounds, K = 4 on W = 3.
    seed = 0xDEADBEEFCAFEF00D
    inputs = [[normal(60 + 3 * t + r, 50) for r in range(3)] for t in range(2)]
    cases.append(run_quantized_mean_case("qm_stochastic_int4", "int4", 16, inputs, [0, 1],
                                         seed=seed))
    # Top-k with int8 values, K = 5 on W = 3.
    inputs = [[normal(70 + r, 70, 0.1) for r in range(3)]]
    cases.append(run_quantized_mean_case("qm_topk_0.25_int8", "topk:0.25+int8", 16, inputs, [2]))
    # Error feedback over 3 rounds, W = 3, n = 100, K = 4.
    inputs = [[normal(80 + 3 * t + r, 100) for r in range(3)] for t in range(3)]
    cases.append(run_quantized_mean_case("qm_feedback_int4_stochastic", "int4", 32, inputs,
                                         [1, 2, 3], seed=12345, feedback=True))
    cases.append(run_quantized_mean_case("qm_feedback_topk_0.1_int8", "topk:0.1+int8", 32, inputs,
                                         [1, 2, 3], feedback=True))
    # One rank: both quantizations still happen.
    cases.append(run_quantized_mean_case("qm_w1_int8", "int8", 8, [[normal(90, 21, 3.0)]], [0]))
    inputs = [[normal(91 + t, 45)] for t in range(2)]
    cases.append(run_quantized_mean_case("qm_w1_feedback_topk_0.25_int4", "topk:0.25+int4", 16,
                                         inputs, [5, 6], seed=7, feedback=True))
    return cases


def main():
    cases = []
    # Plain round trips with a tail chunk (21 = 2 * 8 + 5; 19 = 2 * 8 + 3, odd: int4 padding).
    cases.append(run_case("int8_tail", "int8", 8, single(normal(1, 21, 3.0)), [0]))
    cases.append(run_case("int4_tail", "int4", 8, single(normal(2, 19, 0.01)), [0]))
    # An all-zero chunk (with -0.0) between two others.
    zero = np.array([1.5, -2.0, 0.25, 3.0, 0.0, -0.0, 0.0, -0.0, -7.0, 0.5, 1.0], dtype=F32)
    for codec in ["int8", "int4", "topk:0.5", "topk:0.5+int8", "topk:0.5+int4"]:
        cases.append(run_case("zero_chunk_" + codec, codec, 4, single(zero), [0]))
    # Exact .5 ties: scale 1 (absmax 127 or 7), and scale 2 (absmax 254).
    ties8 = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5,
             254.0, 1.0, 3.0, 5.0, -1.0, -3.0, -5.0, 251.0]
    cases.append(run_case("int8_ties", "int8", 8, single(ties8), [0]))
    ties4 = [7.0, 0.5, 1.5, 2.5, -3.5, -6.5, 5.5, -0.5, 14.0, 1.0, -3.0, 5.0, 9.0, 11.0]
    cases.append(run_case("int4_ties", "int4", 8, single(ties4), [0]))
    # Top-k ties: equal |x| at several offsets with opposite signs; the lower offsets win.
    topk_ties = [1.0, -3.0, 3.0, 2.0, -3.0, 0.5, 3.0, 0.0,
                 -2.0, 2.0, -2.0, 2.0, 1.0, -1.0, 1.0, -1.0, 4.0, -4.0, 4.0]
    for codec in ["topk:0.25", "topk:0.25+int8", "topk:0.25+int4", "topk:0.5"]:
        cases.append(run_case("ties_" + codec, codec, 8, single(topk_ties), [0]))
    # Larger top-k cases, each with a tail chunk.
    cases.append(run_case("topk_0.02_int4", "topk:0.02+int4", 256, single(normal(3, 1000)), [0]))
    cases.append(run_case("topk_0.1_int8", "topk:0.1+int8", 64, single(normal(4, 300, 0.1)), [0]))
    cases.append(run_case("topk_0.25_f32", "topk:0.25", 16, single(normal(5, 70)), [0]))
    # Subnormal and huge magnitudes.
    extremes = np.array([1e-40, -3e-41, 2e-45, 0.0, 3e38, -1e38, 2.5e37, 1.0, 1e-39], dtype=F32)
    for codec in ["int8", "int4", "topk:0.5+int8"]:
        cases.append(run_case("extremes_" + codec, codec, 4, single(extremes), [0]))
    # Stochastic rounding: 2 rounds, 2 ranks (a seed above 2^63).
    seed = 0xDEADBEEFCAFEF00D
    for codec, chunk, n in [("int8", 16, 40), ("int4", 16, 37), ("topk:0.25+int4", 16, 45)]:
        inputs = [[normal(10 + 2 * t + r, n) for r in range(2)] for t in range(2)]
        cases.append(run_case("stochastic_" + codec, codec, chunk, inputs, [0, 1], seed=seed))
    # The mean over 3 ranks.
    inputs = [[normal(20 + r, 50) for r in range(3)]]
    cases.append(run_case("mean_world3_int8", "int8", 16, inputs, [7]))
    # Error feedback: 3 rounds, 2 ranks, resumed after round 2.
    inputs = [[normal(30 + 2 * t + r, 100) for r in range(2)] for t in range(3)]
    cases.append(run_case("feedback_topk_0.1_int8", "topk:0.1+int8", 32, inputs, [1, 2, 3],
                          feedback=True, resume_after=2))
    cases.append(run_case("feedback_topk_0.25_f32", "topk:0.25", 32, inputs, [1, 2, 3],
                          feedback=True, resume_after=2))
    cases.append(run_case("feedback_int4_stochastic", "int4", 32, inputs, [1, 2, 3], seed=12345,
                          feedback=True, resume_after=2))
    json.dump({"generator": "scripts/codec_reference.py", "cases": cases,
               "quantized_mean": quantized_mean_cases()}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
