#!/bin/bash
# Allocators and the thread pool, interleaved rounds. Binaries: glibc build (keep_freed_buffers at
# start; LOCALSGD_MALLOC_DEFAULTS=1 skips it) and the same source with mimalloc as global allocator.
set -e
G=/tmp/localsgd-glibc
M=/tmp/localsgd-mimalloc
DATA="--dataset idx --data-dir /usr/share/datasets/fashion-mnist"
for round in 1 2 3 4 5; do
  for model in fmnist wide; do
    case $model in fmnist) H=256,128;; wide) H=2048,512;; esac
    ARGS="bench-step $DATA --hidden $H --batch-size 32 --optimizer sgd --momentum 0.9 --lr 0.05 --iters 200 --warmup-iters 10 --restart-every 210 --workers 1"
    for v in glibc-defaults glibc-keep mimalloc; do
      case $v in
        glibc-defaults) B=$G; E="LOCALSGD_MALLOC_DEFAULTS=1";;
        glibc-keep) B=$G; E="";;
        mimalloc) B=$M; E="";;
      esac
      env $E RAYON_NUM_THREADS=1 taskset -c 1 $B $ARGS --json /tmp/alloc/sb.json > /dev/null
      python3 -c "import json;d=json.load(open('/tmp/alloc/sb.json'));print('step', '$model', '$v', $round, d.get('median_ms'), d.get('mean_ms'))"
    done
  done
  # The thread backend: 2 rank threads in one process, burn's rayon pool of 1, 2 (the default on
  # 2 cores) or 4 threads; Fashion-MNIST MLP, DDP and post-local SGD, 300 iterations.
  for alg in ddp post-local-sgd; do
    for t in 1 2 4; do
      RAYON_NUM_THREADS=$t $G train $DATA --hidden 256,128 --workers 2 --algorithm $alg --steps 300 --warmup 50 --progress false --log-every 0 --checkpoint-every 0 --eval-every 0 --run-dir /tmp/alloc/tr > /dev/null 2>&1
      python3 -c "import json;d=json.load(open('/tmp/alloc/tr/summary.json'));print('pool', '$alg', $t, $round, round(1000*d['wall_seconds']/d['iterations'],3), d['samples_per_second'])"
    done
  done
done
