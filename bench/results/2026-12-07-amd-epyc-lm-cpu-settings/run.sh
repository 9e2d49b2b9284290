#!/usr/bin/env bash
# Seconds per iteration of the language model with the binary's default settings and with the
# small settings the book suggests for a first try on a CPU: 2 thread workers (the default),
# AdamW, DiLoCo H = 50, 30 iterations, 3 runs each, interleaved. Writes results.txt beside it.
# Usage: bench/results/2026-12-07-amd-epyc-lm-cpu-settings/run.sh [BINARY]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-target/debug/localsgd}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(train --model gpt --dataset text --text-file data/text/localsgd-docs.txt
  --optimizer adamw --lr 0.001 --algorithm diloco --steps 30 --progress false --log-every 0)
small=(--context 32 --d-model 64 --heads 4 --layers 2)
: > "$here/results.txt"
for round in 1 2 3; do
  for name in default small; do
    extra=()
    [ "$name" = small ] && extra=("${small[@]}")
    "$bin" "${common[@]}" "${extra[@]}" --run-dir "$out/$name-$round" > /dev/null
    python3 - "$out/$name-$round/summary.json" "$name" "$round" >> "$here/results.txt" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]} round {sys.argv[3]}: {s['wall_seconds'] / s['iterations'] * 1e3:.1f} ms/iteration, "
      f"{s['tokens_per_second']:.0f} tokens/s, {s['iterations']} iterations, "
      f"validation {s['test_bits_per_byte']:.3f} bits/byte")
PY
  done
done
cat "$here/results.txt"
