#!/usr/bin/env python3
"""Load a model exported by `localsgd export` / `localsgd train --export` into its PyTorch twin
and evaluate it on the run's test split.

  python3 scripts/check_export.py FILE [--model mlp|cnn] [--hidden 64] [--channels 8,16]
                                       [--dataset digits|idx] [--data PATH] [--data-dir DIR]

Builds the twin (bench_pytorch.Mlp: fc1..fcK with ReLU between; or bench_pytorch.Cnn: convs.i,
norms.i, head), loads the file with `load_state_dict(strict=True)` (through
`safetensors.torch.load_file` when the safetensors package is installed, otherwise through
bench_pytorch's reader of the same format), puts the model in eval mode (BatchNorm uses the
exported running statistics) and prints one JSON object: the test accuracy, the number of
correct test samples, the test set's size and the mean cross-entropy. Needs `pip install torch
numpy`; trainer/tests/it/export.rs runs it where torch is installed.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import bench_pytorch  # noqa: E402  (bench/bench_pytorch.py: its data loaders, MLP, CNN and safetensors reader)


def load_state(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        return bench_pytorch.read_safetensors(path)
    return load_file(path)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    parser.add_argument("--hidden", default="64", help="comma-separated hidden widths (mlp)")
    parser.add_argument("--channels", default="8,16", help="comma-separated channels (cnn)")
    parser.add_argument("--dataset", choices=["digits", "idx"], default="digits")
    parser.add_argument("--data", default=bench_pytorch.DEFAULT_DATA)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.dataset == "idx":
        _, _, x_test, y_test, dim, classes = bench_pytorch.load_idx(args.data_dir)
    else:
        _, _, x_test, y_test = bench_pytorch.load_digits(args.data)
        dim, classes = 64, 10
    if args.model == "cnn":
        side = int(round(dim ** 0.5))
        channels = [int(c) for c in args.channels.split(",") if c.strip()]
        model = bench_pytorch.Cnn(side, channels, classes)
    else:
        hidden = [int(w) for w in args.hidden.split(",") if w.strip()]
        model = bench_pytorch.Mlp([dim] + hidden + [classes])
    state = load_state(args.file)
    if args.model == "cnn":
        # PyTorch's BatchNorm2d state_dict has num_batches_tracked, which localsgd does not use
        # (momentum is fixed at 0.1) and does not write: keep the twin's own.
        for name, value in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                state.setdefault(name, value)
    model.load_state_dict(state, strict=True)
    model.eval()
    accuracy, loss = bench_pytorch.evaluate(model, x_test, y_test)
    with torch.no_grad():
        correct = int((model(x_test).argmax(dim=1) == y_test).sum().item())
    print(json.dumps({"test_accuracy": accuracy, "correct": correct, "samples": len(y_test),
                      "test_loss": loss}))


if __name__ == "__main__":
    main(sys.argv[1:])
