#!/usr/bin/env bash
# The GPT's matrix products on burn-flex, gemm called directly, and PyTorch, one thread pinned to
# one core (issue 54). Builds the bench, runs ROUNDS interleaved rounds of both sides and writes
# results.md next to this script (every round's raw lines go to raw/).
#
#   bench/results/2026-12-07-amd-epyc-matmul-layouts/run.sh
#
# The `localsgd` binary allocates with mimalloc (v3, through the `mimalloc` crate); the bench
# binary uses the system allocator. So that burn's output allocations cost what they cost in the
# training step, the burn/gemm side runs twice per round: with a mimalloc v3 built here from the
# same libmimalloc-sys sources in cargo's registry and preloaded (LD_PRELOAD; every column of the
# table but one), and with glibc's malloc (the column "burn glibc"). PyTorch keeps its own
# (glibc's) allocator.
#
# Environment: ROUNDS (default 3), BENCH_SAMPLES (per case and round, default 21), CORE (default
# 1), FILTER (a substring of the case ids, e.g. `s/` for the default GPT only), PYTHON (default
# python3), CC (default gcc). Run it on a quiet machine: every number is a median, but a build on
# the other core still slows the memory system.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
ROUNDS="${ROUNDS:-3}"
CORE="${CORE:-1}"
FILTER="${FILTER:-}"
PYTHON="${PYTHON:-python3}"
export BENCH_SAMPLES="${BENCH_SAMPLES:-21}"

cd "$ROOT"
# `--workspace`, not `-p localsgd-pipeline`: the same features as every other build here, so only
# the bench itself compiles.
BIN="$(cargo bench --workspace --bench matmul_layouts --no-run --message-format=json 2>/dev/null |
  "$PYTHON" -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "matmul_layouts" and m.get("executable"):
        print(m["executable"])')"
[ -x "$BIN" ] || { echo "bench binary not found" >&2; exit 1; }

# mimalloc v3 as a preloadable library (the same version and release defines as libmimalloc-sys's
# build script, plus MI_MALLOC_OVERRIDE so that it replaces malloc).
MI_VERSION="$(awk '/^name = "libmimalloc-sys"/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)"
MI_SRC="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/libmimalloc-sys-"$MI_VERSION"/c_src/mimalloc/v3 | head -1)"
MI_SO="${TMPDIR:-/tmp}/localsgd-mimalloc-v3-$MI_VERSION.so"
if [ ! -f "$MI_SO" ]; then
  "${CC:-gcc}" -O3 -shared -fPIC -DMI_MALLOC_OVERRIDE -DMI_DEBUG=0 -DMI_BUILD_RELEASE -DNDEBUG \
    -fno-builtin-malloc -ftls-model=initial-exec -I"$MI_SRC/include" -I"$MI_SRC/src" \
    "$MI_SRC/src/static.c" -o "$MI_SO" -lpthread
fi

RAW="$HERE/raw"
mkdir -p "$RAW"
rm -f "$RAW"/*.tsv
"$BIN" --list --filter "$FILTER" > "$RAW/cases.tsv"
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS: burn and gemm (mimalloc)" >&2
  LD_PRELOAD="$MI_SO" RAYON_NUM_THREADS=1 taskset -c "$CORE" "$BIN" --filter "$FILTER" > "$RAW/burn-$r.tsv"
  echo "round $r/$ROUNDS: burn and gemm (glibc malloc)" >&2
  RAYON_NUM_THREADS=1 taskset -c "$CORE" "$BIN" --filter "$FILTER" > "$RAW/burn-glibc-$r.tsv"
  echo "round $r/$ROUNDS: torch" >&2
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c "$CORE" "$PYTHON" "$HERE/torch_matmul.py" "$RAW/cases.tsv" > "$RAW/torch-$r.tsv"
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

{
  echo "# Matrix products of the GPT's step: burn-flex, gemm direct, PyTorch ($(date -u +%F))"
  echo
  echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; pinned to core $CORE, one thread"
  echo "- tree: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with local changes)'), $(rustc --version), bench profile"
  echo "- $(grep -h '^# torch' "$RAW"/torch-1.tsv | sed 's/^# //')"
  echo "- burn and gemm with mimalloc $MI_VERSION (v3, preloaded) as the \`localsgd\` binary, except the column \"burn glibc\"; torch with its own allocator"
  echo "- $ROUNDS rounds (burn, burn glibc, torch), each case a median of $BENCH_SAMPLES samples; the table gives the median over rounds"
  echo "- load average (1, 5, 15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER"
  echo
  "$PYTHON" - "$RAW" "$ROUNDS" <<'EOF'
import statistics, sys
raw, rounds = sys.argv[1], int(sys.argv[2])
burn, glibc, torch, meta = {}, {}, {}, {}
for r in range(1, rounds + 1):
    for name, into in ((f"burn-{r}", burn), (f"burn-glibc-{r}", glibc)):
        for line in open(f"{raw}/{name}.tsv"):
            f = line.rstrip("\n").split("\t")
            if f[0] != "RESULT":
                continue
            meta[f[1]] = (f[2], f[3], f[4], int(f[5]))
            into.setdefault(f[1], []).append([float(x) for x in f[6:14]])
    for line in open(f"{raw}/torch-{r}.tsv"):
        f = line.rstrip("\n").split("\t")
        if f[0] != "TORCH":
            continue
        torch.setdefault(f[1], []).append([float(x) if x else None for x in f[2:4]])

def med(rows, i):
    v = [r[i] for r in rows if r[i] is not None]
    return statistics.median(v) if v else None

def ms(x):
    return "—" if x is None else f"{x:.3f}"

cols = ["burn", "burn_contig", "gemm_direct", "gemm_par", "gemm_contig", "copy", "alloc", "zeroed"]
print("| case | product | shape b×m×k×n | layout | burn ms | burn glibc ms | gemm direct ms "
      "| gemm burn's par. ms | gemm contig ms | copy ms | burn alloc ms | vec![0u8] ms | torch ms "
      "| torch nn.Linear ms | burn / gemm direct | burn / torch | GFLOP/s gemm | GFLOP/s torch |")
print("|---|---|---|---|" + "---:|" * 14)
agg = {}
for cid, (product, shape, layout, flop) in meta.items():
    b = {c: med(burn[cid], i) for i, c in enumerate(cols)}
    bg = med(glibc[cid], 0)
    t = torch.get(cid, [[None, None]])
    tm, tn = med(t, 0), med(t, 1)
    gf = lambda x: "—" if not x else f"{flop / x / 1e6:.1f}"
    bt = "—" if tm is None else f"{b['burn'] / tm:.2f}"
    print(f"| {cid} | {product} | {shape} | {layout} | {ms(b['burn'])} | {ms(bg)} | {ms(b['gemm_direct'])} "
          f"| {ms(b['gemm_par'])} | {ms(b['gemm_contig'])} | {ms(b['copy'] or None)} | {ms(b['alloc'])} | {ms(b['zeroed'])} "
          f"| {ms(tm)} | {ms(tn)} | {b['burn'] / b['gemm_direct']:.2f} "
          f"| {bt} | {gf(b['gemm_direct'])} | {gf(tm)} |")
    size, group, step = cid.split("/")
    kind = "attn" if group.startswith("attn") else "linear"
    key = (size, group if kind == "attn" else "linear", "fwd" if step in ("fwd", "scores", "out") else "bwd")
    a = agg.setdefault(key, [0.0] * 5)
    for i, x in enumerate([b["burn"], b["gemm_direct"], b["gemm_contig"], tm or 0.0, tn or tm or 0.0]):
        a[i] += x

print()
print("Totals per model size and group (sum of the cases' ms); `torch native` is nn.Linear's layout "
      "(addmm forward) for the Linears, the same views as burn for attention:")
print()
print("| size | group | burn fwd | burn bwd | burn bwd/fwd | gemm direct bwd/fwd | torch native fwd "
      "| torch native bwd | torch native bwd/fwd | burn fwd / torch native fwd | burn bwd / torch native bwd |")
print("|---|---|" + "---:|" * 9)
for (size, group) in sorted({(k[0], k[1]) for k in agg}):
    f, w = agg[(size, group, "fwd")], agg[(size, group, "bwd")]
    print(f"| {size} | {group} | {f[0]:.3f} | {w[0]:.3f} | {w[0] / f[0]:.2f} | {w[1] / f[1]:.2f} "
          f"| {f[4]:.3f} | {w[4]:.3f} | {w[4] / f[4]:.2f} | {f[0] / f[4]:.2f} | {w[0] / w[4]:.2f} |")
EOF
} > "$HERE/results.md"
echo "wrote $HERE/results.md" >&2
