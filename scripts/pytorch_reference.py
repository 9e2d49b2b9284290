#!/usr/bin/env python3
"""Generate the PyTorch reference numbers of trainer/tests/it/pytorch_reference.rs.

Runs real PyTorch (CPU, gloo, 2 processes) on the bundled digits data with the binary's MLP
(64-64-10, layers fc1, fc2) or its CNN (`--model cnn`, channels 8,16 over the 8x8 images, with
BatchNorm2d), batch 32 per rank, `DistributedSampler(shuffle=False)`, and records rank 0's loss at
every iteration for each case below. Writes

  trainer/tests/data/pytorch_reference_init.safetensors      the MLP's initial weights
                                                             (torch.manual_seed(0))
  trainer/tests/data/pytorch_reference_cnn_init.safetensors  the CNN's (torch.manual_seed(0))
  trainer/tests/data/pytorch_reference_<case>_final.safetensors
                                                             rank 0's final state_dict (CNN cases:
                                                             parameters and BatchNorm buffers)
  trainer/tests/data/pytorch_reference.json                  per case: the matching `localsgd
                                                             train` flags and PyTorch's losses

The GPT cases (`--model gpt`, scripts/gpt_twin.py's twin) train on windows of the shipped text
data/text/localsgd-docs.txt, from `pytorch_reference_gpt_init.safetensors`.

Needs `pip install torch numpy`; the tests only read the committed output. Rerun after changing a
case: python3 scripts/pytorch_reference.py [CASE...] (named cases only: the others are kept)
"""

import contextlib
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import bench_pytorch  # noqa: E402  (bench/bench_pytorch.py: its data loader, MLP and safetensors writer)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_twin  # noqa: E402  (scripts/gpt_twin.py: the GPT twin of `--model gpt`)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT_DIR = os.path.join(ROOT, "trainer", "tests", "data")
INIT = os.path.join(OUT_DIR, "pytorch_reference_init.safetensors")
CNN_INIT = os.path.join(OUT_DIR, "pytorch_reference_cnn_init.safetensors")
CNN_CHANNELS = [8, 16]
WORLD, BATCH, STEPS = 2, 32, 40
WIDTHS = [64, 64, 10]
GPT_INIT = os.path.join(OUT_DIR, "pytorch_reference_gpt_init.safetensors")
GPT_CONFIG = dict(vocab=256, context=16, d_model=32, heads=4, layers=2)
GPT_STEPS = 20
TEXT_FILE = os.path.join(ROOT, "data", "text", "localsgd-docs.txt")
GPT_FLAGS = ["--model", "gpt", "--dataset", "text", "--text-file", "data/text/localsgd-docs.txt",
             "--context", "16", "--d-model", "32", "--heads", "4", "--layers", "2"]

# name: (settings for both sides, `localsgd train` flags)
CASES = {
    # DDP broadcasts rank 0's parameters at construction (the other rank starts from other
    # weights here); SGD with PyTorch's coupled weight decay; global-norm clipping.
    "ddp-weight-decay-clip": (
        dict(algorithm="ddp", optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3,
             clip=0.5, schedule=None),
        ["--algorithm", "ddp", "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
         "--weight-decay", "0.001", "--clip-grad-norm", "0.5"],
    ),
    # A step schedule through post-local SGD's switch (warmup 10, period 4).
    "post-local-step-lr": (
        dict(algorithm="post-local-sgd", optimizer="sgd", lr=0.2, momentum=0.9, weight_decay=0.0,
             clip=None, schedule=("step", 8, 0.5), warmup=10, period=4),
        ["--algorithm", "post-local-sgd", "--warmup", "10", "--period", "4", "--optimizer", "sgd",
         "--lr", "0.2", "--momentum", "0.9", "--lr-schedule", "step", "--lr-step-size", "8",
         "--lr-gamma", "0.5"],
    ),
    # AdamW (decoupled weight decay) with a linear warmup.
    "ddp-adamw-linear-warmup": (
        dict(algorithm="ddp", optimizer="adamw", lr=0.01, momentum=0.0, weight_decay=0.05,
             clip=None, schedule=("linear", 1.0 / 3.0, 10)),
        ["--algorithm", "ddp", "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.05",
         "--lr-schedule", "linear-warmup", "--lr-warmup-steps", "10"],
    ),
    # Gradient accumulation of 2 micro-batches per optimizer step, through post-local SGD's
    # switch (the hook's iter and the averager count optimizer steps); loss / 2 backward on each
    # micro-batch, one step. The micro-batches stream across epochs, as an iteration-based loop
    # draws them (23 batches per rank per epoch: step 11 takes epoch 0's last batch and epoch
    # 1's first). The recorded loss is the mean of the step's micro-batches' losses.
    "post-local-accumulate-2": (
        dict(algorithm="post-local-sgd", optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.0,
             clip=None, schedule=None, warmup=6, period=2, accumulate=2),
        ["--algorithm", "post-local-sgd", "--warmup", "6", "--period", "2", "--optimizer", "sgd",
         "--lr", "0.1", "--momentum", "0.9", "--accumulate", "2"],
    ),
    # Lightning's rule: each epoch's last step takes the micro-batches left (23 = 7 x 3 + 2: a
    # step of 2 ends every epoch), each micro-batch's loss still divided by 3.
    "post-local-accumulate-3-epoch-end": (
        dict(algorithm="post-local-sgd", optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.0,
             clip=None, schedule=None, warmup=6, period=2, accumulate=3, epoch_end=True),
        ["--algorithm", "post-local-sgd", "--warmup", "6", "--period", "2", "--optimizer", "sgd",
         "--lr", "0.1", "--momentum", "0.9", "--accumulate", "3", "--accumulation", "epoch-end"],
    ),
    # Cosine annealing over the run.
    "ddp-cosine": (
        dict(algorithm="ddp", optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.0, clip=None,
             schedule=("cosine", STEPS, 0.01)),
        ["--algorithm", "ddp", "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
         "--lr-schedule", "cosine", "--lr-min", "0.01"],
    ),
    # The CNN with BatchNorm2d under DDP: broadcast_buffers=True (the default) gives every rank
    # rank 0's running statistics at each forward; rank 0's final state_dict (buffers included)
    # is recorded.
    "cnn-ddp-broadcast-buffers": (
        dict(model="cnn", algorithm="ddp", optimizer="sgd", lr=0.05, momentum=0.9,
             weight_decay=0.0, clip=None, schedule=None),
        ["--model", "cnn", "--channels", "8,16", "--algorithm", "ddp", "--optimizer", "sgd",
         "--lr", "0.05", "--momentum", "0.9", "--buffers", "broadcast"],
    ),
    # The CNN through post-local SGD's switch: the averager averages parameters only, DDP keeps
    # broadcasting buffers at each forward. (At lr 0.05 this trajectory jumps at iteration 35:
    # PyTorch itself, from initial weights perturbed by 1e-6 relative, leaves 1e-5 there and
    # reaches 2e-2 two iterations later; lr 0.03 stays smooth.)
    "cnn-post-local-sgd": (
        dict(model="cnn", algorithm="post-local-sgd", optimizer="sgd", lr=0.03, momentum=0.9,
             weight_decay=0.0, clip=None, schedule=None, warmup=10, period=4),
        ["--model", "cnn", "--channels", "8,16", "--algorithm", "post-local-sgd", "--warmup",
         "10", "--period", "4", "--optimizer", "sgd", "--lr", "0.03", "--momentum", "0.9",
         "--buffers", "broadcast"],
    ),
    # DiLoCo through post-local SGD's switch: the warmup's gradient all-reduce, theta refreshed
    # after its last step, then an outer Nesterov step (lr 0.7, momentum 0.9: the defaults)
    # after every 5 local steps, with the mean of the ranks' deltas as gradient.
    "diloco-post-local": (
        dict(algorithm="diloco", optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.0,
             clip=None, schedule=None, warmup=10, period=5, outer_lr=0.7, outer_momentum=0.9,
             outer_nesterov=True),
        ["--algorithm", "diloco", "--warmup", "10", "--period", "5", "--optimizer", "sgd",
         "--lr", "0.1", "--momentum", "0.9"],
    ),
    # SlowMo (fairscale's defaults: slowmo_lr 1, slowmo_momentum 0.5) with a step schedule: the
    # slow step divides by the inner learning rate, which halves at 8, 16, 24 and 32.
    "slowmo-step-lr": (
        dict(algorithm="slowmo", optimizer="sgd", lr=0.2, momentum=0.9, weight_decay=0.0,
             clip=None, schedule=("step", 8, 0.5), warmup=6, period=4, outer_lr=1.0,
             outer_momentum=0.5, outer_nesterov=False),
        ["--algorithm", "slowmo", "--warmup", "6", "--period", "4", "--slowmo-frequency", "4",
         "--optimizer", "sgd", "--lr", "0.2", "--momentum", "0.9", "--lr-schedule", "step",
         "--lr-step-size", "8", "--lr-gamma", "0.5"],
    ),
    # The byte-level GPT (scripts/gpt_twin.py's twin of `--model gpt`) under DDP with AdamW, on
    # windows of 17 bytes of the shipped text: 20 steps, as the language-model issue asks.
    "gpt-ddp-adamw": (
        dict(model="gpt", algorithm="ddp", optimizer="adamw", lr=1e-3, momentum=0.0,
             weight_decay=0.01, clip=None, schedule=None, steps=GPT_STEPS),
        GPT_FLAGS + ["--algorithm", "ddp", "--optimizer", "adamw", "--lr", "0.001",
                     "--weight-decay", "0.01"],
    ),
    # The GPT through DiLoCo's switch: 6 warmup steps of gradient all-reduce, then an outer
    # Nesterov step (lr 0.7, momentum 0.9) after every 4 local AdamW steps.
    "gpt-diloco-adamw": (
        dict(model="gpt", algorithm="diloco", optimizer="adamw", lr=1e-3, momentum=0.0,
             weight_decay=0.01, clip=None, schedule=None, warmup=6, period=4, outer_lr=0.7,
             outer_momentum=0.9, outer_nesterov=True, steps=GPT_STEPS),
        GPT_FLAGS + ["--algorithm", "diloco", "--warmup", "6", "--period", "4", "--optimizer",
                     "adamw", "--lr", "0.001", "--weight-decay", "0.01"],
    ),
}


def text_windows():
    """The training windows of `--dataset text`: the first 90% of the file's bytes, windows of
    context + 1 bytes at stride context (models/src/data/text.rs)."""
    data = open(TEXT_FILE, "rb").read()
    train = data[:int(len(data) * 0.9)]
    c = GPT_CONFIG["context"]
    n = (len(train) - 1) // c
    return torch.tensor([list(train[i * c:i * c + c + 1]) for i in range(n)], dtype=torch.int64)


def new_model(case):
    if case.get("model") == "gpt":
        return gpt_twin.GPT(**GPT_CONFIG)
    if case.get("model") == "cnn":
        return bench_pytorch.Cnn(8, CNN_CHANNELS, 10)
    return bench_pytorch.Mlp(WIDTHS)


def final_path(name):
    return os.path.join(OUT_DIR, f"pytorch_reference_{name}_final.safetensors")


def rank_main(rank, port, name, case, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState, post_localSGD_hook)
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    gpt = case.get("model") == "gpt"
    if gpt:
        x = text_windows()
        y = x
    else:
        x, y, _, _ = bench_pytorch.load_digits(bench_pytorch.DEFAULT_DATA)
    model = new_model(case)
    cnn = case.get("model") == "cnn"
    state = bench_pytorch.read_safetensors(GPT_INIT if gpt else CNN_INIT if cnn else INIT)
    if rank != 0:
        # Another rank's own initialisation: DDP's construction-time broadcast replaces it.
        torch.manual_seed(1234)
        model = new_model(case)
    else:
        if cnn:
            state = {k: (v.to(torch.int64) if k.endswith("num_batches_tracked") else v)
                     for k, v in state.items()}
        model.load_state_dict(state, strict=True)
    ddp = DDP(model)
    averager, outer = None, None
    if case["algorithm"] in ("post-local-sgd", "diloco", "slowmo"):
        hook_state = PostLocalSGDState(process_group=None, subgroup=None,
                                       start_localSGD_iter=case["warmup"],
                                       post_local_gradient_allreduce=False)
        ddp.register_comm_hook(hook_state, post_localSGD_hook)
    if case["algorithm"] == "post-local-sgd":
        averager = PeriodicModelAverager(period=case["period"], warmup_steps=case["warmup"])
    elif case["algorithm"] in ("diloco", "slowmo"):
        # After DDP's construction broadcast: theta is rank 0's weights on every rank.
        outer = bench_pytorch.OuterStep(ddp.parameters(), case["algorithm"], case["period"],
                                        case["warmup"], case["outer_lr"], case["outer_momentum"],
                                        case["outer_nesterov"])
    if case["optimizer"] == "sgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=case["lr"], momentum=case["momentum"],
                              weight_decay=case["weight_decay"])
    else:
        opt = torch.optim.AdamW(ddp.parameters(), lr=case["lr"], weight_decay=case["weight_decay"])
    sched = None
    kind = case["schedule"]
    if kind and kind[0] == "step":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=kind[1], gamma=kind[2])
    elif kind and kind[0] == "linear":
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=kind[1], total_iters=kind[2])
    elif kind and kind[0] == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=kind[1], eta_min=kind[2])

    class _Len:
        def __len__(self):
            return len(y)

    sampler = DistributedSampler(_Len(), num_replicas=WORLD, rank=rank, shuffle=False,
                                 drop_last=False)
    ce = nn.CrossEntropyLoss()

    def loss_fn(out, target):
        if gpt:
            # out: logits of the windows' first `context` bytes; target: the windows.
            return ce(out.reshape(-1, out.size(-1)), target[:, 1:].reshape(-1))
        return ce(out, target)

    def forward(rows):
        return ddp(rows[:, :-1]) if gpt else ddp(rows)
    k = case.get("accumulate", 1)

    def epoch_batches(epoch):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)), dtype=torch.int64)
        return [idx[first:first + BATCH] for first in range(0, len(idx), BATCH)]

    def steps():
        """Each optimizer step's micro-batches: one stream across epochs, or (Lightning's
        rule, `epoch_end`) each epoch cut into steps of k, its last step taking what is left."""
        epoch, pending = 0, []
        while True:
            for b in epoch_batches(epoch):
                pending.append(b)
                if len(pending) == k:
                    yield pending
                    pending = []
            if case.get("epoch_end") and pending:
                yield pending
                pending = []
            epoch += 1

    losses = []
    for micro_batches in steps():
        if len(losses) >= case.get("steps", STEPS):
            break
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j, b in enumerate(micro_batches):
            # DDP's accumulation: no_sync around the forward and backward of every micro-batch
            # but the last, so only the last backward all-reduces (and calls the hook, whose
            # iter then counts optimizer steps). Every loss is divided by k, also in a step of
            # fewer (PyTorch's accumulation loops and Lightning).
            last = j + 1 == len(micro_batches)
            sync = contextlib.nullcontext() if last else ddp.no_sync()
            with sync:
                micro = loss_fn(forward(x[b]), y[b])
                total += micro.item()
                (micro / k).backward()
        loss = torch.tensor(total / len(micro_batches))
        if case["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), case["clip"])
        opt.step()
        # SlowMo's gamma: the learning rate of the step just taken.
        lr_used = opt.param_groups[0]["lr"]
        if sched is not None:
            sched.step()
        if averager is not None:
            averager.average_parameters(ddp.parameters())
        if outer is not None:
            outer.after_step(lr_used)
        losses.append(loss.item())
    if rank == 0:
        if cnn:
            bench_pytorch.write_safetensors(final_path(name), model.state_dict())
        queue.put(losses)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.manual_seed(0)
    bench_pytorch.write_safetensors(INIT, bench_pytorch.Mlp(WIDTHS).state_dict())
    torch.manual_seed(0)
    bench_pytorch.write_safetensors(CNN_INIT, bench_pytorch.Cnn(8, CNN_CHANNELS, 10).state_dict())
    torch.manual_seed(0)
    gpt_twin.write_safetensors(GPT_INIT, gpt_twin.GPT(**GPT_CONFIG).state_dict())
    out = {"steps": STEPS, "workers": WORLD, "batch_size": BATCH, "torch": torch.__version__,
           "init_weights": os.path.basename(INIT), "cnn_init_weights": os.path.basename(CNN_INIT),
           "gpt_init_weights": os.path.basename(GPT_INIT),
           "cases": {}}
    # `pytorch_reference.py CASE...` reruns only those cases, keeping the others' numbers.
    only = sys.argv[1:]
    unknown = [n for n in only if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; the cases are {list(CASES)}")
    json_path = os.path.join(OUT_DIR, "pytorch_reference.json")
    if only and os.path.exists(json_path):
        with open(json_path) as f:
            out["cases"] = json.load(f)["cases"]
    ctx = mp.get_context("spawn")
    for name, (case, flags) in CASES.items():
        if only and name not in only:
            continue
        queue = ctx.Queue()
        port = free_port()
        procs = [ctx.Process(target=rank_main, args=(r, port, name, case, queue)) for r in range(WORLD)]
        for p in procs:
            p.start()
        losses = queue.get(timeout=600)
        for p in procs:
            p.join(timeout=120)
            if p.exitcode != 0:
                raise SystemExit(f"case {name}: a rank exited with {p.exitcode}")
        out["cases"][name] = {"flags": flags, "losses": losses}
        if "steps" in case:
            out["cases"][name]["steps"] = case["steps"]
        if case.get("model") == "cnn":
            out["cases"][name]["final_state"] = os.path.basename(final_path(name))
        print(f"{name}: first {losses[0]:.6f} last {losses[-1]:.6f}", flush=True)
    out["cases"] = {name: out["cases"][name] for name in CASES if name in out["cases"]}
    with open(json_path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
