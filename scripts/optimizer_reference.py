#!/usr/bin/env python3
"""Test vectors for localsgd's fused optimizers from real PyTorch (`torch.optim.SGD`, `Adam`,
`AdamW` on CPU, one thread).

Each case steps two parameters (shapes [37] and [3, 45]: lengths that are not multiples of
PyTorch's vector width, so its scalar tail is covered) for four steps with the given gradients and
learning rates, and records every parameter and optimizer state after every step as the bits of
its float32 values. `pipeline/tests/it/fused_optim.rs` replays the same steps through
`FusedSgdConfig` / `FusedAdamConfig` and compares.

    python3 scripts/optimizer_reference.py > pipeline/tests/data/optimizer_reference.json
"""

import json
import struct
import sys

import torch

torch.set_num_threads(1)

SHAPES = [[37], [3, 45]]
LRS = [0.1, 0.05, 0.05, 0.02]

CASES = [
    ("sgd", "sgd", {}),
    ("sgd-momentum", "sgd", {"momentum": 0.9}),
    ("sgd-dampening", "sgd", {"momentum": 0.9, "dampening": 0.3}),
    ("sgd-nesterov-decay", "sgd", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("sgd-decay", "sgd", {"momentum": 0.5, "weight_decay": 0.05}),
    ("adam", "adam", {}),
    ("adam-decay", "adam", {"weight_decay": 0.01}),
    ("adam-small-beta1", "adam", {"betas": (0.3, 0.99), "eps": 1e-6}),
    ("adamw", "adamw", {}),
    ("adamw-decay", "adamw", {"weight_decay": 0.1, "betas": (0.8, 0.95)}),
    # nanoGPT's `configure_optimizers`: decay only the parameters of 2 or more dimensions
    # (matrices, embeddings), not biases and LayerNorm weights.
    ("adamw-decay-matrices", "adamw", {"weight_decay": 0.1, "decay_matrices_only": True}),
]


def bits(t):
    return [struct.unpack("<I", struct.pack("<f", x))[0] for x in t.detach().reshape(-1).tolist()]


def optimizer(kind, params, settings):
    settings = dict(settings)
    if settings.pop("decay_matrices_only", False):
        decay = settings.pop("weight_decay")
        params = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LRS[0], **settings)
    if kind == "adam":
        return torch.optim.Adam(params, lr=LRS[0], **settings)
    return torch.optim.AdamW(params, lr=LRS[0], **settings)


def main():
    gen = torch.Generator().manual_seed(20261205)
    initial = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) * 0.5 for s in SHAPES] for _ in LRS]
    cases = []
    for name, kind, settings in CASES:
        params = [torch.nn.Parameter(p.clone()) for p in initial]
        opt = optimizer(kind, params, settings)
        steps = []
        for lr, step_grads in zip(LRS, grads):
            for group in opt.param_groups:
                group["lr"] = lr
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            opt.step()
            state = []
            for p in params:
                s = opt.state[p]
                if kind == "sgd":
                    buf = s.get("momentum_buffer")
                    state.append({"velocity": bits(buf) if buf is not None else None})
                else:
                    state.append({
                        "time": int(s["step"].item()),
                        "moment_1": bits(s["exp_avg"]),
                        "moment_2": bits(s["exp_avg_sq"]),
                    })
            steps.append({"params": [bits(p) for p in params], "state": state})
        cases.append({
            "name": name,
            "kind": kind,
            "settings": settings,
            "torch": torch.__version__,
            "steps": steps,
        })
    json.dump(
        {
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "shapes": SHAPES,
            "lrs": LRS,
            "initial": [bits(p) for p in initial],
            "grads": [[bits(g) for g in step] for step in grads],
            "cases": cases,
        },
        sys.stdout,
        separators=(",", ":"),
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
