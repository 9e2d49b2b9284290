#!/usr/bin/env python3
"""PyTorch reference for `scripts/bench-vs-pytorch`: the same MLP, data split, sharding and
algorithm settings as `localsgd train`, on W processes talking gloo over loopback.

Modes:
  train (default)   train and evaluate; print one JSON object on the last line of stdout.
  allreduce-bench   gloo all-reduce of 1, 1M and 16M f32 (the sizes of
                    `mpi_check bench`); best of 5, slowest rank; one JSON object.

Semantics mirrored from localsgd (see trainer/src and data/README.md):
  * data: data/digits.csv.gz, features pixel/16.0 as f32, train rows [0, 1437), test rows
    [1437, 1797) in file order;
  * model: Linear(64 -> hidden...) -> ReLU ... -> Linear(-> 10), nn.Linear default init from
    torch.manual_seed(seed) (or --init-weights); layers are named fc1, fc2, ... so that
    --save-init writes the safetensors layout `localsgd train --init-weights` reads;
  * loss CrossEntropyLoss (mean); SGD(lr, momentum, dampening=0, nesterov=False);
  * sharding: DistributedSampler(shuffle=True, seed=seed, drop_last=False) with set_epoch per
    epoch; batches are consecutive slices of the rank's indices, the last one may be smaller
    (DataLoader(drop_last=False) layout) -- no DataLoader worker processes;
  * ddp: DistributedDataParallel with its default all-reduce (mean of gradients);
  * post-local-sgd: DDP + post_localSGD_hook with PostLocalSGDState(process_group=None,
    subgroup=None, start_localSGD_iter=warmup, post_local_gradient_allreduce=False), and
    PeriodicModelAverager(period, warmup_steps=warmup) after every optimizer step;
  * hierarchical: the same hook and HierarchicalModelAverager({period: group_size}, warmup).

Exit codes: 0 ok, 2 bad arguments / failed run, 3 PyTorch is not installed.
"""

import argparse
import csv
import gzip
import importlib
import json
import os
import socket
import struct
import sys
import tempfile
import time
from collections import OrderedDict

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
except ImportError:
    print("PyTorch not installed: pip install torch numpy; skipping the PyTorch side")
    sys.exit(3)

TRAIN_ROWS = 1437
TOTAL_ROWS = 1797
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "digits.csv.gz")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["train", "allreduce-bench"], default="train")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--algorithm", choices=["ddp", "post-local-sgd", "hierarchical"], default="post-local-sgd")
    p.add_argument("--hidden", default="64", help="hidden widths, comma-separated (e.g. 128,64)")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--period", type=int, default=4)
    p.add_argument("--levels", default="", help='hierarchical levels "period:group,..." e.g. 2:2,4:4')
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=DEFAULT_DATA, help="digits.csv.gz")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per process (0: max(1, cores // workers))")
    p.add_argument("--init-weights", default=None, help="safetensors file (fc1.weight, fc1.bias, ...) to start from")
    p.add_argument("--save-init", default=None,
                   help="write the initial model (torch.manual_seed(seed) init) as safetensors to this file and exit")
    args = p.parse_args(argv)
    try:
        args.hidden_list = [int(h) for h in args.hidden.split(",") if h.strip()]
    except ValueError:
        p.error(f"--hidden {args.hidden!r}: expected comma-separated positive integers, e.g. 64 or 128,64")
    if any(h <= 0 for h in args.hidden_list):
        p.error(f"--hidden {args.hidden!r}: every width must be at least 1")
    for name in ("workers", "batch_size", "steps", "period"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    if args.warmup < 0:
        p.error(f"--warmup {args.warmup}: must be non-negative")
    args.levels_dict = OrderedDict()
    if args.algorithm == "hierarchical":
        if not args.levels:
            p.error("--algorithm hierarchical needs --levels, e.g. 2:2,4:4 (period:group-size, last group = world)")
        for part in args.levels.split(","):
            try:
                period, size = (int(x) for x in part.split(":"))
            except ValueError:
                p.error(f"--levels {args.levels!r}: {part!r} is not period:group-size")
            args.levels_dict[period] = size
    return args


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_digits(path):
    """(x_train, y_train, x_test, y_test): pixel/16 as f32, labels int64, the canonical split."""
    rows = []
    with gzip.open(path, "rt", newline="") as f:
        for line_no, row in enumerate(csv.reader(f), start=1):
            if not row:
                continue
            if len(row) != 65:
                raise ValueError(f"{path}:{line_no}: expected 65 values (64 pixels + label), found {len(row)}")
            rows.append([int(v) for v in row])
    if len(rows) != TOTAL_ROWS:
        raise ValueError(f"{path}: expected {TOTAL_ROWS} rows, found {len(rows)}")
    data = torch.tensor(rows, dtype=torch.int64)
    x = data[:, :64].to(torch.float32) / 16.0
    y = data[:, 64].contiguous()
    return (x[:TRAIN_ROWS].contiguous(), y[:TRAIN_ROWS].contiguous(),
            x[TRAIN_ROWS:].contiguous(), y[TRAIN_ROWS:].contiguous())


class Mlp(nn.Module):
    """Linear layers fc1..fcK with ReLU between them (none after the last)."""

    def __init__(self, widths):
        super().__init__()
        self.n = len(widths) - 1
        for k in range(self.n):
            setattr(self, f"fc{k + 1}", nn.Linear(widths[k], widths[k + 1]))

    def forward(self, x):
        for k in range(self.n):
            x = getattr(self, f"fc{k + 1}")(x)
            if k + 1 < self.n:
                x = torch.relu(x)
        return x


def build_model(args):
    torch.manual_seed(args.seed)
    model = Mlp([64] + args.hidden_list + [10])
    if args.init_weights:
        state = read_safetensors(args.init_weights)
        model.load_state_dict(state, strict=True)
    return model


def write_safetensors(path, tensors):
    """Minimal safetensors writer (F32 only): 8-byte LE header size, JSON header, raw data."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Minimal safetensors reader (F32/F64) for the files write_safetensors and localsgd write."""
    import numpy as np
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": np.float32, "F64": np.float64}.get(meta["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {meta['dtype']}; only F32 and F64 are supported")
        begin, end = meta["data_offsets"]
        arr = np.frombuffer(blob[base + begin: base + end], dtype=dtype).reshape(meta["shape"])
        out[name] = torch.from_numpy(arr.astype(np.float32))
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).double().mean().item()


def train_worker(rank, args, port, threads, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState, post_localSGD_hook)
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
        HierarchicalModelAverager)
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    # DDP.__init__ imports torch._dynamo lazily (~6 s of Python imports on a 2-core machine): a
    # one-time process cost like loading a binary, so pay it before any clock starts.
    importlib.import_module("torch._dynamo")

    x_train, y_train, x_test, y_test = load_digits(args.data)
    world = args.workers

    # Scope 1 ("setup"): what localsgd's summary.json wall time also covers -- model init, DDP
    # and hook construction, the training loop, the world-averaged evaluation -- but not process
    # start, process-group rendezvous or data loading (localsgd loads data before its clock too).
    dist.barrier()
    t_setup = time.perf_counter()
    model = build_model(args)
    ddp = DDP(model)  # CPU module: no device_ids; broadcasts rank 0's parameters
    averager = None
    if args.algorithm in ("post-local-sgd", "hierarchical"):
        state = PostLocalSGDState(process_group=None, subgroup=None,
                                  start_localSGD_iter=args.warmup, post_local_gradient_allreduce=False)
        ddp.register_comm_hook(state, post_localSGD_hook)
        if args.algorithm == "post-local-sgd":
            averager = PeriodicModelAverager(period=args.period, warmup_steps=args.warmup)
        else:
            averager = HierarchicalModelAverager(period_group_size_dict=args.levels_dict,
                                                 warmup_steps=args.warmup)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum,
                          dampening=0.0, nesterov=False)
    loss_fn = nn.CrossEntropyLoss()

    class _Len:  # DistributedSampler only needs len(dataset)
        def __len__(self):
            return TRAIN_ROWS

    sampler = DistributedSampler(_Len(), num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=False)
    bs = args.batch_size

    # Scope 2 ("loop"): the training loop only, from a barrier to the last step.
    dist.barrier()
    t_loop = time.perf_counter()
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)), dtype=torch.int64)
        for start in range(0, len(idx), bs):
            if step >= args.steps:
                break
            b = idx[start:start + bs]
            xb, yb = x_train[b], y_train[b]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            opt.step()
            if averager is not None:
                averager.average_parameters(ddp.parameters())
            step += 1
        epoch += 1
    last_loss = loss.item()
    loop_seconds = time.perf_counter() - t_loop

    local_acc = accuracy(model, x_test, y_test)
    # World-averaged model, evaluated without touching the ranks' own models.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    dist.all_reduce(flat)
    flat /= world
    averaged = Mlp([64] + args.hidden_list + [10])
    torch.nn.utils.vector_to_parameters(flat, averaged.parameters())
    avg_acc = accuracy(averaged, x_test, y_test)
    setup_seconds = time.perf_counter() - t_setup

    times = torch.tensor([loop_seconds, setup_seconds], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # slowest rank counts
    loss_t = torch.tensor([last_loss], dtype=torch.float64)
    dist.all_reduce(loss_t)
    if rank == 0:
        slow_loop, slow_setup = times.tolist()
        # Numerator as localsgd's summary.json: samples = sum over ranks of batch_size per
        # iteration (trainer/src/run.rs adds cfg.batch_size every iteration, even for an epoch's
        # smaller last batch), i.e. workers * batch * steps. Denominators differ in scope:
        # localsgd divides by the wall time of run::train_threads (model init + loop + final
        # checkpoint + evaluation, trainer/src/main.rs); `samples_per_second` here divides by the
        # slowest rank's loop time, `samples_per_second_setup_scope` by scope 1 above.
        samples = world * bs * args.steps
        result = {
            "side": "pytorch",
            "torch_version": torch.__version__,
            "algorithm": args.algorithm,
            "workers": world,
            "hidden": args.hidden_list,
            "batch_size": bs,
            "lr": args.lr,
            "momentum": args.momentum,
            "steps": args.steps,
            "warmup": args.warmup,
            "period": args.period,
            "levels": args.levels,
            "seed": args.seed,
            "threads_per_process": threads,
            "init_weights": args.init_weights,
            "epochs_started": epoch,
            "samples": samples,
            "loop_seconds": slow_loop,
            "setup_scope_seconds": slow_setup,
            "samples_per_second": samples / slow_loop,
            "samples_per_second_setup_scope": samples / slow_setup,
            "test_accuracy": avg_acc,
            "rank0_test_accuracy": local_acc,
            "final_mean_loss": loss_t.item() / world,
        }
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def allreduce_worker(rank, args, port, threads, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    rows = []
    for n in (1, 1 << 20, 16 << 20):
        iters = 2000 if n == 1 else (50 if n <= 1 << 20 else 10)
        buf = torch.full((n,), float(rank), dtype=torch.float32)
        dist.all_reduce(buf)
        best = float("inf")
        for _ in range(5):
            dist.barrier()
            t = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            mine = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            best = min(best, mine.item() / iters)
        rows.append({"floats": n, "time_per_allreduce_us": best * 1e6,
                     "throughput_gbps": n * 4 / best / 1e9})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"side": "pytorch-gloo", "workers": args.workers, "threads_per_process": threads,
                       "allreduce": rows}, f)
    dist.barrier()
    dist.destroy_process_group()


def main(argv):
    args = parse_args(argv)
    if args.save_init:
        model = build_model(args)
        write_safetensors(args.save_init, model.state_dict())
        print(json.dumps({"saved_init": args.save_init, "seed": args.seed,
                          "widths": [64] + args.hidden_list + [10]}))
        return 0
    threads = args.threads if args.threads > 0 else max(1, cores() // args.workers)
    fd, out_path = tempfile.mkstemp(prefix="bench_pytorch_", suffix=".json")
    os.close(fd)
    worker = train_worker if args.mode == "train" else allreduce_worker
    try:
        mp.spawn(worker, args=(args, free_port(), threads, out_path), nprocs=args.workers, join=True)
        with open(out_path) as f:
            text = f.read()
        if not text:
            print("error: rank 0 wrote no result", file=sys.stderr)
            return 2
        print(json.dumps(json.loads(text)))
        return 0
    except Exception as e:  # a failed rank: report and exit non-zero
        print(f"error: PyTorch run failed: {e}", file=sys.stderr)
        return 2
    finally:
        os.unlink(out_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
