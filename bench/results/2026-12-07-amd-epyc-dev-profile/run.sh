#!/usr/bin/env bash
# The bare step (one compute thread, pinned to core 1) of two `localsgd` binaries of one tree
# that differ only in the dev profile of the dependencies: BEFORE built with debug assertions and
# overflow checks on in burn and gemm (cargo's dev default, kept when only opt-level was raised),
# AFTER without them (the workspace's Cargo.toml now). 5 interleaved rounds on the wide MLP and
# the two GPTs. Usage: run.sh BEFORE_BINARY AFTER_BINARY; writes results.txt beside it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
before=$1 after=$2
text=target/corpus-brown/brown.txt
[ -f "$text" ] || python3 bench/text/prepare-brown
wide=(--dataset idx --data-dir /usr/share/datasets/fashion-mnist --hidden 2048,512 --lr 0.05 --momentum 0.9
      --batch-size 32 --iters 200 --warmup-iters 10 --restart-every 210 --workers 1)
small=(--model gpt --dataset text --text-file "$text" --optimizer adamw --lr 0.001 --batch-size 16 --workers 1)
large=("${small[@]}" --context 128 --d-model 256 --heads 8 --layers 4)
: > "$here/results.txt"
for round in 1 2 3 4 5; do
  for model in wide 471k 3.3M; do
    case $model in
      wide) args=("${wide[@]}") ;;
      471k) args=("${small[@]}" --iters 20 --warmup-iters 3) ;;
      3.3M) args=("${large[@]}" --iters 5 --warmup-iters 1) ;;
    esac
    for side in before after; do
      bin=$before; [ "$side" = after ] && bin=$after
      line=$(RAYON_NUM_THREADS=1 taskset -c 1 "$bin" bench-step "${args[@]}" 2>&1 | grep '^bare burn step')
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
for model in ("wide", "471k", "3.3M"):
    b, a = statistics.median(rows[(model, "before")]), statistics.median(rows[(model, "after")])
    print(f"{model}: before {b:.2f} ms, after {a:.2f} ms, after/before {a / b:.3f}")
PY
