#!/usr/bin/env bash
# DiLoCo's outer learning rate and momentum at 8 workers (the compression-lm runs' settings).
set -euo pipefail
# K: a bench/compression-lm output directory (its text/ and init/); LOCALSGD_BIN: the binary.
K=${K:?set K to a compression-lm output directory}
BIN=${LOCALSGD_BIN:-target/debug/localsgd}
out=${1:?usage: K=RUN sweep.sh OUT}
mkdir -p "$out"
settings=("0.7 0.9" "1.0 0.9" "0.5 0.9" "0.7 0.6" "1.0 0.6")
[ -n "${SWEEP:-}" ] && IFS=',' read -r -a settings <<< "$SWEEP"
for lm in "${settings[@]}"; do
  set -- $lm
  lr=$1 mom=$2
  dir="$out/lr$lr-m$mom"
  rm -rf "$dir"
  RAYON_NUM_THREADS=1 "$BIN" train --backend threads --workers 8 --algorithm diloco --model gpt --dataset text \
    --text-file $K/text/brown-first-2500000.txt --optimizer adamw --context 64 --d-model 64 --heads 4 --layers 2 \
    --batch-size 16 --lr 0.001 --momentum 0.9 --steps 600 --seed 1 --warmup 0 --period 50 --average-compression none \
    --outer-lr "$lr" --outer-momentum "$mom" \
    --progress false --log-every 0 --checkpoint-every 0 --eval-every 0 --run-dir "$dir" --init-weights $K/init/lm.safetensors > "$dir.log" 2>&1
  python3 -c "import json;s=json.load(open('$dir/summary.json'));print('lr $lr momentum $mom', s.get('test_bits_per_byte'))"
done
