#!/usr/bin/env bash
# The GPT's bare step (forward, backward, AdamW; one compute thread) with burn's exact GELU
# (scalar libm erf and exp per element) and with ours (localsgd_pipeline::gelu, vectorized), in
# 5 interleaved rounds: `localsgd bench-step` of two binaries of one tree that differ only in the
# GPT's GELU call. Usage: run.sh BEFORE_BINARY AFTER_BINARY; writes results.txt beside it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
before=$1 after=$2
text=data/text/localsgd-docs.txt
small=(--model gpt --dataset text --text-file "$text" --optimizer adamw --batch-size 16 --workers 1)
large=("${small[@]}" --context 128 --d-model 256 --heads 8 --layers 4)
: > "$here/results.txt"
for round in 1 2 3 4 5; do
  for model in 471k 3.3M; do
    if [ "$model" = 471k ]; then args=("${small[@]}" --iters 20 --warmup-iters 3); else args=("${large[@]}" --iters 5 --warmup-iters 1); fi
    for side in before after; do
      bin=$before; [ "$side" = after ] && bin=$after
      line=$(RAYON_NUM_THREADS=1 "$bin" bench-step "${args[@]}" 2>&1 | grep '^bare burn step')
      echo "round $round $model $side: $line" >> "$here/results.txt"
    done
  done
done
python3 - "$here/results.txt" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ (\S+) (\S+): .*median ([0-9.]+) ms", line)
    rows.setdefault((m[1], m[2]), []).append(float(m[3]))
for model in ("471k", "3.3M"):
    b, a = statistics.median(rows[(model, "before")]), statistics.median(rows[(model, "after")])
    print(f"{model}: before {b:.1f} ms, after {a:.1f} ms, after/before {a / b:.3f}")
PY
