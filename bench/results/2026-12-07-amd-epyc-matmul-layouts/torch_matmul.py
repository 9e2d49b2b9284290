"""PyTorch's side of the matmul-layouts benchmark (issue 54).

Reads the cases printed by `matmul_layouts --list` (one `CASE` line each: id, kind, then each
operand's row-major storage shape and the permutation through which the product sees it, i.e.
the exact views burn's autodiff passes) and times, single-threaded:

- `torch`: `torch.matmul(lhs, rhs)` on the same views (`.t()` / `.transpose(1, 2)` / permuted
  4-D views, never copied beforehand);
- `native`: for the Linear cases, what PyTorch's own Linear does with its weight stored
  `[out, in]`: forward `torch.addmm(bias, X, Wt.t())`, backward `dY.mm(Wt)` (dX) and
  `dY.t().mm(X)` (dWt, autograd's `mm_mat2_backward` for a transposed mat2); blank for attention.

Each time is the median over samples of the mean of an inner loop sized to ~2 ms (a Python call
adds a few µs, ~1-3% of the smallest products here). One line per case, tab-separated:
`TORCH id torch_ms native_ms`.

Usage: python3 torch_matmul.py CASES_FILE   (BENCH_SAMPLES=N, default 21)
"""

import os
import statistics
import sys
import time

import torch


def make(storage, perm, gen):
    shape = [int(d) for d in storage.split("x")]
    order = [int(p) for p in perm.split(",")]
    return torch.rand(shape, generator=gen).mul_(2).sub_(1).permute(order)


def timeit(fn, samples):
    for _ in range(3):
        fn()
    t = time.perf_counter()
    fn()
    once = time.perf_counter() - t
    inner = max(1, min(2000, int(2e-3 / max(once, 1e-7)) + 1))
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t) / inner * 1e3)
    return statistics.median(out)


def main():
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    samples = int(os.environ.get("BENCH_SAMPLES", "21"))
    gen = torch.Generator().manual_seed(0)
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"mkldnn {torch.backends.mkldnn.is_available()}, mkl {torch.backends.mkl.is_available()}")
    for line in open(sys.argv[1]):
        f = line.rstrip("\n").split("\t")
        if f[0] != "CASE":
            continue
        cid, kind, ls, lp, rs, rp = f[1:7]
        a, b = make(ls, lp, gen), make(rs, rp, gen)
        t = timeit(lambda: torch.matmul(a, b), samples)
        native = ""
        if kind == "linear-fwd":  # a = X [M, in], b = W [in, out]
            wt = b.t().contiguous()  # nn.Linear's weight [out, in]
            bias = torch.rand(wt.shape[0], generator=gen)
            native = f"{timeit(lambda: torch.addmm(bias, a, wt.t()), samples):.4f}"
        elif kind == "linear-dx":  # a = dY [M, out], b = Wᵀ view of W [in, out]
            wt = b.contiguous()  # [out, in], row-major: nn.Linear's weight
            native = f"{timeit(lambda: a.mm(wt), samples):.4f}"
        elif kind == "linear-dw":  # a = Xᵀ view of X [M, in], b = dY [M, out]
            x = a.t()  # X [M, in], row-major
            native = f"{timeit(lambda: b.t().mm(x), samples):.4f}"
        print(f"TORCH\t{cid}\t{t:.4f}\t{native}", flush=True)


if __name__ == "__main__":
    main()
