#!/usr/bin/env python3
"""Test vectors for SlowMo with fairscale's two frequencies (localsgd_frequency, slowmo_frequency).

Every number comes from the independent oracle `slowmo_fairscale` of
`../shared/spec/outer_opt_sim.py` (float64 numpy, fairscale's `perform_slowmo` order: eager
init, memory-efficient mode unless a case says otherwise). Nothing here re-implements SlowMo:
the per-step trajectory is read off the oracle by running it for 1, 2, ..., N steps (it is
deterministic, so the final per-rank `w` after `s` steps is the trajectory at step `s`), and the
steps with a slow step are those where the oracle's list of slow-step results grows.

Toy problem (the oracle's): R = 4 replicas, scalar w, loss_r = (w - r)^2 / 2, inner SGD
`w <- w - lr * (w - r)`, w0 = 1 on every replica. A case with a warm-up first runs `warmup`
synchronous steps towards the consensus target (`w <- w - lr * (w - 1.5)` on every replica,
what DDP on the mean loss does) and hands the result to the oracle as its w0: the oracle's step
1 is the first step after the warm-up (the book's semantics §8.1).

Run from anywhere (needs numpy):  python3 averagers/tests/data/slowmo_frequencies.py
It writes slowmo_frequencies.json next to itself; the Rust tests read only the JSON.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "..", "shared", "spec"))

import numpy as np  # noqa: E402
from outer_opt_sim import R, slowmo_fairscale  # noqa: E402

# (name, localsgd_frequency, slowmo_frequency, slowmo_lr, slowmo_momentum, steps, extra)
CASES = [
    ("lf3_sf6_alpha1_beta0.5", 3, 6, 1.0, 0.5, 18, {}),
    ("lf2_sf8_alpha0.7_beta0.9", 2, 8, 0.7, 0.9, 24, {}),
    # sf not a multiple of lf: memory-efficient mode stays consistent (its gather averages).
    ("lf3_sf4_alpha1_beta0.5_non_multiple", 3, 4, 1.0, 0.5, 12, {}),
    # lf = sf = 1: today's behaviour (a slow step after every inner step).
    ("lf1_sf1_alpha1_beta0.5", 1, 1, 1.0, 0.5, 12, {}),
    # lf = sf = 3: V5c of outer-optimizer-vectors.json.
    ("lf3_sf3_alpha1_beta0.5", 3, 3, 1.0, 0.5, 12, {}),
    # The disable shortcut: (alpha, beta) = (1, 0) never runs a slow step -> plain averaging
    # every lf steps only (with lf = 3, sf = 4 nothing happens at steps 4 and 8).
    ("lf2_sf4_alpha1_beta0_disabled", 2, 4, 1.0, 0.0, 12, {}),
    ("lf3_sf4_alpha1_beta0_disabled", 3, 4, 1.0, 0.0, 12, {}),
    # fairscale's defaults: localsgd_frequency 3, slowmo_frequency 48, slowmo_lr 1, momentum 0.5.
    ("fairscale_defaults_lf3_sf48", 3, 48, 1.0, 0.5, 96, {}),
    # The inner lr halves after step 8: the slow step at step 12 divides by the new gamma.
    ("lf2_sf4_alpha0.7_beta0.9_lr_step", 2, 4, 0.7, 0.9, 16, {"lr_change": (8, 0.05)}),
    # Two synchronous warm-up steps, then the schedule counts from the first local step.
    ("warmup2_lf2_sf6_alpha0.7_beta0.9", 2, 6, 0.7, 0.9, 18, {"warmup": 2}),
]

BASE_LR = 0.1
WARMUP_TARGET = 1.5


def lr_schedule(extra):
    change = extra.get("lr_change")
    if change is None:
        return lambda s: BASE_LR
    after, lr = change
    return lambda s: BASE_LR if s <= after else lr


def case(name, lf, sf, alpha, beta, steps, extra):
    lr = lr_schedule(extra)
    warmup = extra.get("warmup", 0)
    w0 = 1.0
    for _ in range(warmup):
        w0 = w0 - BASE_LR * (w0 - WARMUP_TARGET)
    per_step, slow_steps, after_slow = [], [], []
    seen = 0
    for s in range(1, steps + 1):
        out, w = slowmo_fairscale(s, lf, sf, lr, alpha, beta, w0=w0)
        per_step.append(w[:, 0].tolist())
        if len(out) > seen:
            assert len(out) == seen + 1
            seen = len(out)
            slow_steps.append(s)
            after_slow.append(out[-1][0, 0].item())
    # Memory-efficient mode leaves the replicas identical after every world average.
    averaged = [s for s, w in enumerate(per_step, 1) if np.ptp(np.array(w)) == 0.0]
    return dict(
        name=name,
        localsgd_frequency=lf,
        slowmo_frequency=sf,
        slowmo_lr=alpha,
        slowmo_momentum=beta,
        memory_efficient=True,
        init="eager",
        warmup=warmup,
        warmup_target=WARMUP_TARGET,
        w0=w0,
        steps=steps,
        inner_lr=[lr(s) for s in range(1, steps + 1)],
        per_step=per_step,
        averaged_steps=averaged,
        slow_steps=slow_steps,
        after_slow=after_slow,
    )


def main() -> int:
    cases = [case(*c) for c in CASES]
    doc = dict(
        source=(
            "averagers/tests/data/slowmo_frequencies.py: slowmo_fairscale() of "
            "../shared/spec/outer_opt_sim.py (float64), eager init, memory-efficient"
        ),
        toy=(
            f"R = {R} replicas, scalar w, loss_r = (w - r)^2 / 2, inner SGD with inner_lr[s-1] at "
            "1-based step s (after the warm-up), w0 on every replica; per_step[s-1][r] is replica "
            "r's w after step s's perform_slowmo; slow_steps are 1-based steps with a slow step; "
            "averaged_steps those after which the replicas are identical"
        ),
        cases=cases,
    )
    path = os.path.join(HERE, "slowmo_frequencies.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for c in cases:
        print(f"{c['name']}: slow steps {c['slow_steps']}, averaged {c['averaged_steps']}, "
              f"final {c['per_step'][-1][0]!r}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
