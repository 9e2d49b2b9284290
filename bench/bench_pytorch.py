#!/usr/bin/env python3
"""PyTorch reference for `bench/bench-vs-pytorch` and `bench/bench-matrix`: the same model
(the MLP, or with --model gpt the byte-level GPT), data split, sharding and algorithm settings as
`localsgd train`, on W processes talking gloo.

Modes:
  train (default)   train and evaluate; print one JSON object on the last line of stdout.
  allreduce-bench   gloo all-reduce of 1, 1M and 16M f32 (the sizes of
                    `localsgd bench-comm`); best of 5, slowest rank; one JSON object.
  lm-eval           the validation loss (nats and bits per byte) and next-byte accuracy of each
                    weight file given (the GPT twin's safetensors, e.g. `localsgd export`'s) on
                    the first --eval-windows validation windows of --text-file (0: all); one
                    process, one thread; one JSON object. bench-matrix evaluates ours' checkpoints
                    with it, with the function the train mode's gpt eval_curve uses.
  lm-step           the GPT twin's bare training step (forward, cross-entropy over every position,
                    backward, AdamW) on one batch of --batch-size training windows, one thread;
                    --warmup-iters untimed, --iters timed; median and mean ms; with --profile FILE
                    torch.profiler's op table of the timed steps (bench/lm-step runs it).
  mlp-step          the MLP's bare training step (zero_grad, forward, CrossEntropyLoss, backward,
                    --optimizer's step: torch.optim.SGD(momentum, dampening 0, no Nesterov), Adam
                    or AdamW) on consecutive --batch-size batches of --dataset's training split
                    (as `localsgd bench-step` takes them; gathered off the clock), one thread
                    unless --threads; --warmup-iters untimed, --iters timed; median and mean ms
                    (bench/step-vs-pytorch runs it).

Language model (--model gpt, scripts/gpt_twin.py's twin; --text-file, --context, --d-model,
--heads, --layers as `localsgd train`): windows of context + 1 bytes at stride context of the
text's first 90% (train) and last 10% (validation), as models/src/data/text.rs cuts them; the
same DistributedSampler sharding as the MLP (shuffle=True: torch.randperm's permutation, where
`localsgd train` draws its own from the seed); loss = mean cross-entropy over every position of
every window; torch.optim.AdamW(lr=--lr, weight_decay=--weight-decay, PyTorch's betas and eps);
--init-weights / --save-init as the MLP (the twin's state_dict names). --eval-every N copies rank
0's weights every N iterations and after the last (off the clock) and evaluates the copies after
the run on the first --eval-windows validation windows: eval_curve entries {iteration,
train_seconds, test_loss (nats per byte), test_accuracy}. The result adds test_loss and
test_bits_per_byte (the world-averaged model on every validation window), rank0_test_loss,
tokens and tokens_per_second.

Launch (--launch):
  spawn (default)   this process starts the W ranks itself (torch.multiprocessing.spawn), on
                    loopback (MASTER_ADDR 127.0.0.1, a free port).
  env               this process is ONE rank, started by someone else (torchrun style): RANK,
                    WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment, and
                    --workers must equal WORLD_SIZE. gloo picks its network interface from
                    GLOO_SOCKET_IFNAME when that is set. Rank 0 prints the result JSON object as
                    the last line of stdout; the other ranks print nothing on stdout. This is how
                    ranks run in separate network namespaces ("hosts"). --threads defaults to
                    max(1, cores // W) here too (the ranks are assumed to share this machine).

Data (--dataset):
  digits (default)  --data (data/digits.csv.gz): features pixel/16.0 as f32, train rows
                    [0, 1437), test rows [1437, 1797) in file order; 64 inputs, 10 classes.
  idx               --data-dir DIR with MNIST-format IDX files (Fashion-MNIST, ...), as
                    localsgd's `--dataset idx --data-dir DIR` (models/src/data/idx.rs): train =
                    train-images-idx3-ubyte / train-labels-idx1-ubyte, test = t10k-images-idx3-ubyte
                    / t10k-labels-idx1-ubyte, each file plain or else NAME.gz; features byte/255 as
                    f32, each image's pixels row-major; input width rows*cols (784 for
                    Fashion-MNIST); classes = 1 + the largest label of either split (10).
                    --data-dir is ignored for digits (as in localsgd).

Semantics mirrored from localsgd (see trainer/src and data/README.md):
  * data: as above; the model's input width and class count come from the data;
  * model: Linear(inputs -> hidden...) -> ReLU ... -> Linear(-> classes), nn.Linear default init
    from torch.manual_seed(seed) (or --init-weights); layers are named fc1, fc2, ... so that
    --save-init writes the safetensors layout `localsgd train --init-weights` reads
    (fcK.weight [out, in], fcK.bias [out], F32; with --dataset idx the widths come from the
    files in --data-dir, so pass the same --dataset/--data-dir/--hidden to both);
  * loss CrossEntropyLoss (mean); SGD(lr, momentum, dampening=0, nesterov=False);
  * sharding: DistributedSampler(shuffle=True, seed=seed, drop_last=False) with set_epoch per
    epoch; batches are consecutive slices of the rank's indices, the last one may be smaller
    (DataLoader(drop_last=False) layout) -- no DataLoader worker processes;
  * ddp: DistributedDataParallel with its default all-reduce (mean of gradients);
  * post-local-sgd: DDP + post_localSGD_hook with PostLocalSGDState(process_group=None,
    subgroup=None, start_localSGD_iter=warmup, post_local_gradient_allreduce=False), and
    PeriodicModelAverager(period, warmup_steps=warmup) after every optimizer step;
  * hierarchical: the same hook and HierarchicalModelAverager({period: group_size}, warmup).
  * diloco / slowmo: the post-local SGD hook as above, then `OuterStep` after every optimizer
    step: after inner steps warmup + H, warmup + 2H, ... (H = --period; torchft's and
    fairscale's cadence) an outer step on theta, the model as it was after the previous sync
    (taken after DDP's construction broadcast, refreshed after the last warmup step). diloco:
    torchft / OpenDiLoCo's torch-only arithmetic -- p.grad = mean(theta - p) (divide by the
    world, then SUM over gloo), p = theta, torch.optim.SGD(lr=--outer-lr, momentum=
    --outer-momentum, nesterov=--outer-nesterov).step(), theta = p. slowmo: fairscale's
    SlowMoDistributedDataParallel slow step with eager initialisation and one node per rank --
    the parameters averaged (divide, then SUM), then u = beta*u - p/gamma + old/gamma,
    old = old - gamma*alpha*u, p = old (gamma the inner learning rate of the step just taken;
    skipped at alpha 1, beta 0, as fairscale does). Defaults as `localsgd train`: diloco
    0.7 / 0.9 / Nesterov, slowmo 1 / 0.5.

Timing (train mode; all clocks time.perf_counter):
  * loop_seconds: the training loop, from a barrier to the last iteration, slowest rank (MAX over
    ranks); setup_scope_seconds: model/DDP init + loop + world-averaged evaluation, slowest rank.
    Neither covers process start, rendezvous or data loading.
  * iteration_ms (rank 0): one entry per iteration, the wall time from just before
    opt.zero_grad() to just after the averager (forward, backward with DDP's all-reduce,
    optimizer step, model averaging). Not in it: the batch gather and, at an epoch's start, the
    sampler's permutation, so sum(iteration_ms) is a little below rank0_loop_seconds.
  * steady_ms_per_iteration: mean of iteration_ms over the iterations i in [warmup + 10, steps)
    if that range is non-empty, else over [warmup, steps) if non-empty, else over all of them
    (post-warmup, minus 10 iterations of settling; steady_iterations gives the range used).
  * --eval-every N (0 = off): after iteration i (0-based) with (i + 1) % N == 0, and after the
    last one, rank 0 evaluates its own model (not the world average) on the whole test set
    under torch.no_grad: accuracy and mean cross-entropy -> eval_curve entries {iteration: i + 1,
    train_seconds: loop time so far without evaluations, test_accuracy, test_loss}. Rank 0's
    evaluation time (eval_seconds) is excluded from its loop clock, from iteration_ms and from its
    setup scope; rank0_loop_seconds is rank 0's loop time so excluded. The other ranks do not
    evaluate: they run on and block in their next collective until rank 0 is back, so their
    loop time includes those waits, and so do the slowest-rank loop_seconds /
    setup_scope_seconds / samples_per_second*: with --eval-every > 0 use rank0_loop_seconds.
    (The iteration after an evaluation can also be a little shorter on rank 0: the others are
    already waiting in its collective.)

Exit codes: 0 ok, 2 bad arguments / failed run, 3 PyTorch is not installed.
"""

import argparse
import csv
import gzip
import importlib
import json
import math
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
    p.add_argument("--mode", choices=["train", "allreduce-bench", "lm-eval", "lm-step", "mlp-step"], default="train")
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp",
                   help="mlp (default) or gpt: scripts/gpt_twin.py's twin of `localsgd train --model gpt` on "
                        "--text-file (AdamW; see 'Language model' above)")
    p.add_argument("--text-file", default=None, help="the text of --model gpt (as `localsgd train --text-file`)")
    p.add_argument("--context", type=int, default=64, help="--model gpt: bytes of context per window")
    p.add_argument("--d-model", type=int, default=128, help="--model gpt: width")
    p.add_argument("--heads", type=int, default=4, help="--model gpt: attention heads per block")
    p.add_argument("--layers", type=int, default=2, help="--model gpt: transformer blocks")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="--model gpt: AdamW's (decoupled) weight decay, default 0.01; mlp-step: the --optimizer's, "
                        "default PyTorch's (0 for sgd and adam, 0.01 for adamw)")
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd",
                   help="mlp-step: torch.optim.SGD (--momentum), Adam or AdamW (eps 1e-8, betas 0.9/0.999), as "
                        "`localsgd train --optimizer` (train mode: SGD for the MLP, AdamW for --model gpt)")
    p.add_argument("--eval-windows", type=int, default=0,
                   help="--model gpt: the eval_curve's evaluations (and lm-eval's) use the first N validation "
                        "windows; 0: all of them (the final evaluation always uses all)")
    p.add_argument("--iters", type=int, default=20, help="lm-step, mlp-step: timed steps")
    p.add_argument("--warmup-iters", type=int, default=3, help="lm-step, mlp-step: untimed steps first")
    p.add_argument("--profile", default=None,
                   help="lm-step: also profile the timed steps with torch.profiler (CPU) and write its op table "
                        "(sorted by self CPU time) to this file")
    p.add_argument("weights", nargs="*", help="lm-eval: safetensors files of the twin's weights to evaluate")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--algorithm", choices=["ddp", "post-local-sgd", "hierarchical", "diloco", "slowmo"],
                   default="post-local-sgd")
    p.add_argument("--outer-lr", type=float, default=None,
                   help="diloco: outer SGD lr (default 0.7); slowmo: slowmo_lr (default 1)")
    p.add_argument("--outer-momentum", type=float, default=None,
                   help="diloco: outer SGD momentum (default 0.9); slowmo: slowmo_momentum (default 0.5)")
    p.add_argument("--outer-nesterov", choices=["true", "false"], default=None,
                   help="diloco: Nesterov outer momentum (default: true when the momentum is above 0)")
    p.add_argument("--hidden", default="64", help="hidden widths, comma-separated (e.g. 128,64)")
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--period", type=int, default=4)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (its default 25)")
    p.add_argument("--levels", default="", help='hierarchical levels "period:group,..." e.g. 2:2,4:4')
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--flush-denormals", action="store_true",
                   help="torch.set_flush_denormal(True) in every rank (localsgd's flush-denormals = true)")
    p.add_argument("--dataset", choices=["digits", "idx"], default="digits")
    p.add_argument("--data", default=DEFAULT_DATA, help="digits.csv.gz (--dataset digits)")
    p.add_argument("--data-dir", default=None,
                   help="directory with the MNIST-format IDX files (--dataset idx; plain or .gz)")
    p.add_argument("--launch", choices=["spawn", "env"], default="spawn",
                   help="spawn: start the W ranks here on loopback; env: this process is one rank "
                        "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="rank 0 evaluates its own model every N iterations and after the last "
                        "(eval_curve; excluded from the loop clock); 0: off")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per process (0: max(1, cores // workers))")
    p.add_argument("--pin-cores", action="store_true",
                   help="pin rank r to CPU core r %% (usable cores) before it starts (what bench/bench-matrix "
                        "does to its ranks by default: the scheduler otherwise moves ranks between cores)")
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
    if args.mode in ("lm-eval", "lm-step"):
        args.model = "gpt"
    if args.mode == "mlp-step":
        args.model = "mlp"
        if args.iters < 1 or args.warmup_iters < 0:
            p.error("--iters must be at least 1, --warmup-iters non-negative")
    if args.weight_decay is None:
        args.weight_decay = 0.01 if args.model == "gpt" or args.optimizer == "adamw" else 0.0
    elif args.weight_decay < 0:
        p.error(f"--weight-decay {args.weight_decay}: must be non-negative")
    if args.model == "gpt":
        if not args.text_file or not os.path.isfile(args.text_file):
            p.error(f"--model gpt needs --text-file, an existing file (got {args.text_file!r})")
        for name in ("context", "d_model", "heads", "layers"):
            if getattr(args, name) < 1:
                p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
        if args.d_model % args.heads:
            p.error(f"--heads {args.heads} does not divide --d-model {args.d_model}")
        if args.eval_windows < 0 or args.iters < 1 or args.warmup_iters < 0:
            p.error("--eval-windows and --warmup-iters must be non-negative, --iters at least 1")
    if args.weights and args.mode != "lm-eval":
        p.error(f"positional arguments {args.weights} are lm-eval's weight files; --mode is {args.mode}")
    if args.eval_every < 0:
        p.error(f"--eval-every {args.eval_every}: must be non-negative (0: off)")
    if args.dataset == "idx":
        if not args.data_dir:
            p.error('--dataset idx needs --data-dir, a directory with MNIST-format IDX files')
        if not os.path.isdir(args.data_dir):
            p.error(f"--data-dir {args.data_dir!r}: not an existing directory")
    args.env_rank = None
    if args.launch == "env" and not args.save_init:
        names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        missing = [n for n in names if not os.environ.get(n)]
        if missing:
            p.error(f"--launch env needs {', '.join(names)} in the environment; missing: {', '.join(missing)}")
        try:
            rank, world, port = (int(os.environ[n]) for n in ("RANK", "WORLD_SIZE", "MASTER_PORT"))
        except ValueError:
            p.error(f"--launch env: RANK {os.environ['RANK']!r}, WORLD_SIZE {os.environ['WORLD_SIZE']!r} "
                    f"and MASTER_PORT {os.environ['MASTER_PORT']!r} must be integers")
        if world != args.workers:
            p.error(f"--launch env: --workers {args.workers} but WORLD_SIZE={world}; they must agree")
        if not 0 <= rank < world:
            p.error(f"--launch env: RANK={rank} is not in [0, WORLD_SIZE={world})")
        if not 0 < port < 65536:
            p.error(f"--launch env: MASTER_PORT={port} is not a TCP port")
        args.env_rank, args.env_addr, args.env_port = rank, os.environ["MASTER_ADDR"], port
    outer = args.algorithm in ("diloco", "slowmo")
    if not outer and (args.outer_lr, args.outer_momentum, args.outer_nesterov) != (None, None, None):
        p.error(f"--outer-lr/--outer-momentum/--outer-nesterov apply to diloco and slowmo, not {args.algorithm}")
    if args.algorithm == "diloco":
        args.outer_lr = 0.7 if args.outer_lr is None else args.outer_lr
        args.outer_momentum = 0.9 if args.outer_momentum is None else args.outer_momentum
        args.outer_nesterov = (args.outer_momentum > 0 if args.outer_nesterov is None
                               else args.outer_nesterov == "true")
    elif args.algorithm == "slowmo":
        if args.outer_nesterov == "true":
            p.error("--outer-nesterov true: SlowMo's slow step is heavy-ball momentum")
        args.outer_lr = 1.0 if args.outer_lr is None else args.outer_lr
        args.outer_momentum = 0.5 if args.outer_momentum is None else args.outer_momentum
        args.outer_nesterov = False
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


IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC = 0x00000803, 0x00000801
IDX_FILES = (("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),  # train split
             ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"))    # test split


def idx_locate(data_dir, name):
    """data_dir/name, or else data_dir/name.gz (models/src/data/idx.rs `locate`)."""
    plain = os.path.join(data_dir, name)
    for path in (plain, plain + ".gz"):
        if os.path.isfile(path):
            return path
    raise ValueError(f"missing IDX file: tried {plain} and {plain}.gz")


def idx_read(path, magic, dims):
    """The big-endian u32 sizes after the magic, and the uint8 body (which must end the file)."""
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        blob = f.read()
    header_len = 4 * (1 + dims)
    if len(blob) >= 4 and struct.unpack(">I", blob[:4])[0] != magic:
        raise ValueError(f"{path}: magic {struct.unpack('>I', blob[:4])[0]:#010x}, expected {magic:#010x}")
    if len(blob) < header_len:
        raise ValueError(f"{path}: truncated: {len(blob)} bytes, the header alone is {header_len}")
    sizes = struct.unpack(f">{dims}I", blob[4:header_len])
    expected = header_len + math.prod(sizes)
    if len(blob) != expected:
        raise ValueError(f"{path}: {len(blob)} bytes, the header {list(sizes)} says {expected}")
    return sizes, np.frombuffer(blob, dtype=np.uint8, offset=header_len)


def load_idx(data_dir):
    """(x_train, y_train, x_test, y_test, dim, classes) as localsgd's idx::load_dir: byte/255 as
    f32, one row-major image per row; classes = 1 + the largest label of either split."""
    splits = []
    for images, labels in IDX_FILES:
        images_path, labels_path = idx_locate(data_dir, images), idx_locate(data_dir, labels)
        (count, rows, cols), pixels = idx_read(images_path, IDX_IMAGES_MAGIC, 3)
        (n_labels,), y = idx_read(labels_path, IDX_LABELS_MAGIC, 1)
        if count != n_labels:
            raise ValueError(f"{images_path} has {count} images but {labels_path} has {n_labels} labels")
        x = torch.from_numpy(pixels.reshape(count, rows * cols).copy()).to(torch.float32) / 255.0
        splits.append((x, torch.from_numpy(y.astype("int64")), rows, cols, images_path))
    (x_train, y_train, r, c, train_path), (x_test, y_test, tr, tc, test_path) = splits
    if r * c != tr * tc:
        raise ValueError(f"train images are {r}x{c} but test images are {tr}x{tc} ({train_path}, {test_path})")
    labels = torch.cat([y_train, y_test])
    classes = int(labels.max().item()) + 1 if len(labels) else 1
    return x_train, y_train, x_test, y_test, r * c, classes


def load_data(args):
    """(x_train, y_train, x_test, y_test, input width, classes) of --dataset."""
    if args.dataset == "idx":
        return load_idx(args.data_dir)
    return load_digits(args.data) + (64, 10)


def gpt_module():
    """scripts/gpt_twin.py (the twin of `localsgd train --model gpt`), imported on first use."""
    scripts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import gpt_twin
    return gpt_twin


def text_windows(path, context):
    """(train windows, validation windows) of `localsgd train --dataset text` (models/src/data/
    text.rs): the first floor(bytes * (1 - 0.1)) bytes train, the rest validate; each part cut
    into windows of context + 1 bytes at stride context, (part - 1) // context of them; int64
    [windows, context + 1]."""
    import numpy as np
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    cut = min(len(data), math.floor(len(data) * (1.0 - 0.1)))

    def windows(part):
        n = (len(part) - 1) // context if len(part) > context else 0
        idx = np.arange(n)[:, None] * context + np.arange(context + 1)[None, :]
        return torch.from_numpy(part[idx].astype(np.int64)) if n else torch.zeros((0, context + 1), dtype=torch.int64)

    return windows(data[:cut]), windows(data[cut:])


def gpt_config(args):
    return dict(vocab=256, context=args.context, d_model=args.d_model, heads=args.heads, layers=args.layers)


def build_gpt(args):
    """The twin, nanoGPT's init from torch.manual_seed(seed), or --init-weights."""
    torch.manual_seed(args.seed)
    model = gpt_module().GPT(**gpt_config(args))
    if args.init_weights:
        model.load_state_dict(read_safetensors(args.init_weights), strict=True)
    return model


def gpt_evaluate(model, windows, chunk=256):
    """(mean next-byte cross-entropy in nats, next-byte accuracy) of `model` over every position
    of every window, under torch.no_grad (what `localsgd train` reports as the validation loss)."""
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(windows), chunk):
            w = windows[start:start + chunk]
            logits = model(w[:, :-1])
            target = w[:, 1:].reshape(-1)
            flat = logits.reshape(-1, logits.size(-1))
            total += nn.functional.cross_entropy(flat, target, reduction="sum").item()
            correct += (flat.argmax(dim=1) == target).sum().item()
            count += target.numel()
    return (total / count, correct / count) if count else (0.0, 0.0)


def lm_eval(args):
    """--mode lm-eval: the validation loss of each weight file (the first --eval-windows validation
    windows, or all); one JSON object: {"results": [{"file", "loss", "bits_per_byte",
    "accuracy"}], "windows": N}."""
    torch.set_num_threads(args.threads if args.threads > 0 else 1)
    _, valid = text_windows(args.text_file, args.context)
    if args.eval_windows:
        valid = valid[:args.eval_windows]
    model = gpt_module().GPT(**gpt_config(args))
    model.eval()
    results = []
    for path in args.weights:
        model.load_state_dict(read_safetensors(path), strict=True)
        loss, acc = gpt_evaluate(model, valid)
        results.append({"file": path, "loss": loss, "bits_per_byte": loss / math.log(2), "accuracy": acc})
    return {"windows": len(valid), "results": results}


def lm_step(args):
    """--mode lm-step: the twin's bare step (zero_grad, forward, cross-entropy over every position,
    backward, AdamW step) on one batch of --batch-size training windows, one thread unless
    --threads; --warmup-iters untimed, then --iters timed one by one. One JSON object."""
    import statistics
    threads = args.threads if args.threads > 0 else 1
    torch.set_num_threads(threads)
    if args.flush_denormals and not torch.set_flush_denormal(True):
        raise SystemExit("--flush-denormals: this CPU does not support flushing denormals")
    train, _ = text_windows(args.text_file, args.context)
    batch = train[:args.batch_size]
    model = build_gpt(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model.window_loss(batch)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup_iters):
        step()
    times = []
    prof = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CPU])
        prof.__enter__()
    for _ in range(args.iters):
        t = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t) * 1e3)
    if prof is not None:
        prof.__exit__(None, None, None)
        with open(args.profile, "w") as f:
            f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
    return {"side": "pytorch", "torch_version": torch.__version__, "threads": threads,
            "params": sum(p.numel() for p in model.parameters()), "batch_size": args.batch_size,
            "config": gpt_config(args), "iters": args.iters, "warmup_iters": args.warmup_iters,
            "median_ms": statistics.median(times), "mean_ms": statistics.fmean(times), "times_ms": times,
            "last_loss": loss.item(), "profiled": bool(args.profile)}


def mlp_step(args):
    """--mode mlp-step: the MLP's bare step (zero_grad, forward, CrossEntropyLoss, backward,
    --optimizer's step) on consecutive --batch-size batches of the training split, as `localsgd
    bench-step` takes them (batch b of an epoch: rows b*B .. b*B+B-1, wrapping; gathered before
    the clock starts), one thread unless --threads; --warmup-iters untimed, then --iters timed one
    by one. One JSON object."""
    import statistics
    threads = args.threads if args.threads > 0 else 1
    torch.set_num_threads(threads)
    if args.flush_denormals and not torch.set_flush_denormal(True):
        raise SystemExit("--flush-denormals: this CPU does not support flushing denormals")
    x_train, y_train, _, _, dim, classes = load_data(args)
    widths = [dim] + args.hidden_list + [classes]
    model = build_model(args, widths)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, dampening=0.0,
                              nesterov=False, weight_decay=args.weight_decay)
    else:
        kind = torch.optim.Adam if args.optimizer == "adam" else torch.optim.AdamW
        opt = kind(model.parameters(), lr=args.lr, eps=1e-8, weight_decay=args.weight_decay)
    ce = nn.CrossEntropyLoss()
    n, bs = len(y_train), args.batch_size
    per_epoch = max(1, n // bs)

    def batch(step):
        b = step % per_epoch
        idx = torch.arange(b * bs, b * bs + bs) % n
        return x_train[idx], y_train[idx]

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = ce(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    for it in range(args.warmup_iters):
        step(*batch(it))
    times = []
    for it in range(args.warmup_iters, args.warmup_iters + args.iters):
        xb, yb = batch(it)
        t = time.perf_counter()
        loss = step(xb, yb)
        times.append((time.perf_counter() - t) * 1e3)
    return {"side": "pytorch", "torch_version": torch.__version__, "threads": threads,
            "params": sum(p.numel() for p in model.parameters()), "batch_size": bs, "widths": widths,
            "optimizer": args.optimizer, "lr": args.lr, "momentum": args.momentum if args.optimizer == "sgd" else None,
            "weight_decay": args.weight_decay, "iters": args.iters, "warmup_iters": args.warmup_iters,
            "median_ms": statistics.median(times), "mean_ms": statistics.fmean(times), "times_ms": times,
            "last_loss": loss.item()}


def data_widths(args):
    """The MLP's layer widths for --dataset: [inputs] + hidden + [classes]."""
    if args.dataset == "idx":
        _, _, _, _, dim, classes = load_idx(args.data_dir)
    else:
        dim, classes = 64, 10
    return [dim] + args.hidden_list + [classes]


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


class Cnn(nn.Module):
    """localsgd's `model = "cnn"`: per channel count a 3x3 conv (padding 1), BatchNorm2d, ReLU and
    2x2 max pooling; then a Linear head (modules convs.i, norms.i, head)."""

    def __init__(self, side, channels, classes):
        super().__init__()
        self.side = side
        prev, convs, norms = 1, [], []
        for c in channels:
            convs.append(nn.Conv2d(prev, c, 3, padding=1))
            norms.append(nn.BatchNorm2d(c))
            prev = c
        self.convs, self.norms = nn.ModuleList(convs), nn.ModuleList(norms)
        final = side >> len(channels)
        self.head = nn.Linear(prev * final * final, classes)

    def forward(self, x):
        h = x.reshape(x.shape[0], 1, self.side, self.side)
        for conv, norm in zip(self.convs, self.norms):
            h = torch.max_pool2d(torch.relu(norm(conv(h))), 2)
        return self.head(h.flatten(1))


def build_model(args, widths):
    torch.manual_seed(args.seed)
    model = Mlp(widths)
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


def evaluate(model, x, y):
    """(accuracy, mean cross-entropy) of model on the whole of (x, y)."""
    with torch.no_grad():
        logits = model(x)
        acc = (logits.argmax(dim=1) == y).double().mean().item()
        return acc, nn.functional.cross_entropy(logits, y).item()


def steady_range(warmup, steps):
    """[lo, hi) of the iterations steady_ms_per_iteration averages: [warmup + 10, steps) if
    non-empty, else [warmup, steps) if non-empty, else [0, steps)."""
    for lo in (warmup + 10, warmup, 0):
        if lo < steps:
            return lo, steps
    return 0, steps


def init_group(rank, args, addr, port, threads):
    if args.pin_cores:
        usable = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {usable[rank % len(usable)]})
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(threads)
    if args.flush_denormals and not torch.set_flush_denormal(True):
        raise SystemExit("--flush-denormals: this CPU does not support flushing denormals")
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)


class OuterStep:
    """DiLoCo or SlowMo after every optimizer step (see the module docstring): `after_step(lr)`
    with the learning rate of the inner step just taken. Build it after DDP's construction
    broadcast, so theta is the same on every rank."""

    def __init__(self, params, kind, period, warmup, lr, momentum, nesterov):
        self.params = list(params)
        self.kind, self.period, self.warmup = kind, period, warmup
        self.lr, self.momentum = lr, momentum
        self.steps = 0
        self.theta = [p.detach().clone() for p in self.params]
        if kind == "diloco":
            self.outer = torch.optim.SGD(self.params, lr=lr, momentum=momentum, nesterov=nesterov)
        else:
            self.slow_momentum = [torch.zeros_like(p) for p in self.params]

    def _flat(self, tensors):
        world = dist.get_world_size()
        flat = torch.cat([t.reshape(-1) for t in tensors])
        flat.div_(world)  # divide, then SUM: gloo has no AVG (and localsgd divides first)
        dist.all_reduce(flat)
        return flat

    def _slices(self, flat):
        offset = 0
        for p in self.params:
            n = p.numel()
            yield p, flat[offset:offset + n].view_as(p)
            offset += n

    @torch.no_grad()
    def after_step(self, inner_lr):
        s = self.steps
        self.steps += 1
        if s < self.warmup:
            if s == self.warmup - 1:  # the replicas moved together: theta follows
                for t, p in zip(self.theta, self.params):
                    t.copy_(p)
            return
        if (s - self.warmup + 1) % self.period:
            return
        if self.kind == "diloco":
            # Mean of deltas; p.grad = Delta; p = theta; outer step; theta = p.
            flat = self._flat([t - p for t, p in zip(self.theta, self.params)])
            for (p, delta), t in zip(self._slices(flat), self.theta):
                p.copy_(t)
                p.grad = delta.clone()
            self.outer.step()
            self.outer.zero_grad(set_to_none=True)
            for t, p in zip(self.theta, self.params):
                t.copy_(p)
            return
        # SlowMo: average the parameters, then fairscale's slow step (old = theta).
        flat = self._flat([p.detach() for p in self.params])
        for p, avg in self._slices(flat):
            p.copy_(avg)
        if self.lr == 1.0 and self.momentum == 0.0:
            for t, p in zip(self.theta, self.params):
                t.copy_(p)
            return
        for p, old, u in zip(self.params, self.theta, self.slow_momentum):
            u.mul_(self.momentum)
            u.sub_(p, alpha=1.0 / inner_lr)
            u.add_(old, alpha=1.0 / inner_lr)
            old.add_(u, alpha=-inner_lr * self.lr)
            p.copy_(old)


def train_worker(rank, args, addr, port, threads, out_path=None):
    """One rank's training run; rank 0 returns the result (and writes it to out_path if given)."""
    init_group(rank, args, addr, port, threads)
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

    gpt = args.model == "gpt"
    if gpt:
        # Windows of the text; a window is its own target (inputs w[:-1], targets w[1:]).
        x_train, x_test = text_windows(args.text_file, args.context)
        y_train, y_test = x_train, x_test
        input_dim, classes, widths = args.context + 1, 256, None
        curve_windows = x_test[:args.eval_windows] if args.eval_windows else x_test
    else:
        x_train, y_train, x_test, y_test, input_dim, classes = load_data(args)
        widths = [input_dim] + args.hidden_list + [classes]
    world = args.workers

    # Scope 1 ("setup"): what localsgd's summary.json wall time also covers -- model init, DDP
    # and hook construction, the training loop, the world-averaged evaluation -- but not process
    # start, process-group rendezvous or data loading (localsgd loads data before its clock too).
    dist.barrier()
    t_setup = time.perf_counter()
    model = build_gpt(args) if gpt else build_model(args, widths)
    # CPU module: no device_ids; broadcasts rank 0's parameters.
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    averager, outer = None, None
    if args.algorithm in ("post-local-sgd", "hierarchical", "diloco", "slowmo"):
        state = PostLocalSGDState(process_group=None, subgroup=None,
                                  start_localSGD_iter=args.warmup, post_local_gradient_allreduce=False)
        ddp.register_comm_hook(state, post_localSGD_hook)
        if args.algorithm == "post-local-sgd":
            averager = PeriodicModelAverager(period=args.period, warmup_steps=args.warmup)
        elif args.algorithm == "hierarchical":
            averager = HierarchicalModelAverager(period_group_size_dict=args.levels_dict,
                                                 warmup_steps=args.warmup)
        else:
            outer = OuterStep(ddp.parameters(), args.algorithm, args.period, args.warmup,
                              args.outer_lr, args.outer_momentum, args.outer_nesterov)
    if gpt:
        opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum,
                              dampening=0.0, nesterov=False)
    ce = nn.CrossEntropyLoss()

    def loss_fn(xb, yb):
        if gpt:  # every position of every window: logits of w[:-1] against w[1:]
            logits = ddp(xb[:, :-1])
            return ce(logits.reshape(-1, logits.size(-1)), xb[:, 1:].reshape(-1))
        return ce(ddp(xb), yb)

    class _Len:  # DistributedSampler only needs len(dataset)
        def __len__(self):
            return len(y_train)

    sampler = DistributedSampler(_Len(), num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=False)
    bs = args.batch_size

    # Scope 2 ("loop"): the training loop only, from a barrier to the last step, less rank 0's
    # evaluations (eval_seconds). iteration_ms: rank 0's zero_grad..averager wall time per step.
    iteration_ms, eval_curve, eval_seconds = [], [], 0.0
    snapshots = []  # gpt: (iteration, train seconds, rank 0's state), evaluated after the run
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
            t_it = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(xb, yb)
            loss.backward()
            opt.step()
            if averager is not None:
                averager.average_parameters(ddp.parameters())
            if outer is not None:
                outer.after_step(args.lr)
            step += 1
            if rank == 0:
                t_done = time.perf_counter()
                iteration_ms.append((t_done - t_it) * 1e3)
                if gpt and args.eval_every > 0 and (step % args.eval_every == 0 or step == args.steps):
                    # A copy of rank 0's weights now, evaluated after the run (off every clock; the
                    # other ranks run on undisturbed), as bench-matrix evaluates ours' checkpoints.
                    snapshots.append((step, t_done - t_loop - eval_seconds,
                                      {k: v.detach().clone() for k, v in model.state_dict().items()}))
                    eval_seconds += time.perf_counter() - t_done
                elif args.eval_every > 0 and (step % args.eval_every == 0 or step == args.steps):
                    acc, test_loss = evaluate(model, x_test, y_test)
                    eval_curve.append({"iteration": step, "train_seconds": t_done - t_loop - eval_seconds,
                                       "test_accuracy": acc, "test_loss": test_loss})
                    eval_seconds += time.perf_counter() - t_done
        epoch += 1
    last_loss = loss.item()
    loop_seconds = time.perf_counter() - t_loop - eval_seconds

    if gpt:
        local_loss, local_acc = gpt_evaluate(model, x_test)
    else:
        local_acc = accuracy(model, x_test, y_test)
    # World-averaged model, evaluated without touching the ranks' own models.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    dist.all_reduce(flat)
    flat /= world
    averaged = gpt_module().GPT(**gpt_config(args)) if gpt else Mlp(widths)
    torch.nn.utils.vector_to_parameters(flat, averaged.parameters())
    if gpt:
        avg_loss, avg_acc = gpt_evaluate(averaged, x_test)
    else:
        avg_acc = accuracy(averaged, x_test, y_test)
    setup_seconds = time.perf_counter() - t_setup - eval_seconds

    times = torch.tensor([loop_seconds, setup_seconds], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # slowest rank counts
    loss_t = torch.tensor([last_loss], dtype=torch.float64)
    dist.all_reduce(loss_t)
    result = None
    if rank == 0 and gpt:
        # Rank 0's weights at each evaluation point, on the first --eval-windows validation
        # windows (bench-matrix evaluates ours' checkpoints with the same function).
        curve_model = gpt_module().GPT(**gpt_config(args))
        for it, secs, state in snapshots:
            curve_model.load_state_dict(state)
            test_loss, acc = gpt_evaluate(curve_model, curve_windows)
            eval_curve.append({"iteration": it, "train_seconds": secs, "test_accuracy": acc,
                               "test_loss": test_loss})
    if rank == 0:
        slow_loop, slow_setup = times.tolist()
        # Numerator as localsgd's summary.json: samples = sum over ranks of batch_size per
        # iteration (trainer/src/run.rs adds cfg.batch_size every iteration, even for an epoch's
        # smaller last batch), i.e. workers * batch * steps. Denominators differ in scope:
        # localsgd divides by the wall time of run::train_threads (model init + loop + final
        # checkpoint + evaluation, trainer/src/main.rs); `samples_per_second` here divides by the
        # slowest rank's loop time, `samples_per_second_setup_scope` by scope 1 above.
        samples = world * bs * args.steps
        lo, hi = steady_range(args.warmup, args.steps)
        result = {
            "side": "pytorch",
            "torch_version": torch.__version__,
            "algorithm": args.algorithm,
            "workers": world,
            "launch": args.launch,
            "dataset": args.dataset,
            "data": args.data if args.dataset == "digits" else args.data_dir,
            "input_dim": input_dim,
            "classes": classes,
            "train_rows": len(y_train),
            "test_rows": len(y_test),
            "hidden": args.hidden_list,
            "batch_size": bs,
            "lr": args.lr,
            "momentum": args.momentum,
            "steps": args.steps,
            "warmup": args.warmup,
            "period": args.period,
            "outer_lr": args.outer_lr,
            "outer_momentum": args.outer_momentum,
            "outer_nesterov": args.outer_nesterov,
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
            # Rank 0 only (see the module docstring, "Timing").
            "rank0_loop_seconds": loop_seconds,
            "rank0_samples_per_second": samples / loop_seconds,
            "iteration_ms": iteration_ms,
            "steady_iterations": [lo, hi],
            "steady_ms_per_iteration": sum(iteration_ms[lo:hi]) / (hi - lo),
            "eval_every": args.eval_every,
            "eval_seconds": eval_seconds,
            "eval_curve": eval_curve,
        }
        if gpt:
            result.update({
                "model": "gpt", "gpt": gpt_config(args), "dataset": "text", "data": args.text_file,
                "params": sum(p.numel() for p in model.parameters()),
                "optimizer": "adamw", "weight_decay": args.weight_decay,
                "tokens": samples * args.context,
                "tokens_per_second": samples * args.context / slow_loop,
                # The world-averaged model on every validation window (nats per byte).
                "test_loss": avg_loss, "test_bits_per_byte": avg_loss / math.log(2),
                "rank0_test_loss": local_loss, "eval_windows": len(curve_windows),
            })
        if out_path:
            with open(out_path, "w") as f:
                json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    return result


def allreduce_worker(rank, args, addr, port, threads, out_path=None):
    """One rank's all-reduce benchmark; rank 0 returns the result (and writes it to out_path)."""
    init_group(rank, args, addr, port, threads)
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
    result = None
    if rank == 0:
        result = {"side": "pytorch-gloo", "workers": args.workers, "threads_per_process": threads,
                  "allreduce": rows}
        if out_path:
            with open(out_path, "w") as f:
                json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    return result


def exit_after(rank, worker, *rest):
    """Run one rank, then leave without interpreter finalization.

    gloo's C++ threads can still hold objects when Python tears itself down after a finished
    run; the process then aborts ("terminate called without an active exception", SIGABRT)
    although every collective, the result and destroy_process_group completed (seen once in
    CI on a post-local SGD run). Everything this rank owes is done and flushed here, so exit
    directly with status 0; a failure before this point still raises and fails the run.
    """
    worker(rank, *rest)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv):
    args = parse_args(argv)
    if args.mode in ("lm-eval", "lm-step"):
        print(json.dumps(lm_eval(args) if args.mode == "lm-eval" else lm_step(args)))
        return 0
    if args.mode == "mlp-step":
        try:
            result = mlp_step(args)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(json.dumps(result))
        return 0
    if args.save_init and args.model == "gpt":
        model = build_gpt(args)
        write_safetensors(args.save_init, model.state_dict())
        print(json.dumps({"saved_init": args.save_init, "seed": args.seed, "gpt": gpt_config(args),
                          "params": sum(p.numel() for p in model.parameters())}))
        return 0
    if args.save_init:
        try:
            widths = data_widths(args)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        model = build_model(args, widths)
        write_safetensors(args.save_init, model.state_dict())
        print(json.dumps({"saved_init": args.save_init, "seed": args.seed, "widths": widths}))
        return 0
    threads = args.threads if args.threads > 0 else max(1, cores() // args.workers)
    worker = train_worker if args.mode == "train" else allreduce_worker
    if args.launch == "env":
        try:
            result = worker(args.env_rank, args, args.env_addr, args.env_port, threads)
        except Exception as e:  # this rank failed: report and exit non-zero
            print(f"error: PyTorch run failed (rank {args.env_rank}): {e}", file=sys.stderr)
            return 2
        if args.env_rank == 0:
            print(json.dumps(result))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no interpreter finalization after a finished run (see exit_after)
    fd, out_path = tempfile.mkstemp(prefix="bench_pytorch_", suffix=".json")
    os.close(fd)
    try:
        mp.spawn(exit_after, args=(worker, args, "127.0.0.1", free_port(), threads, out_path),
                 nprocs=args.workers, join=True)
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
