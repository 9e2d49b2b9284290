set -e
OLD=/tmp/cirun/main/target/debug/localsgd
NEW=/work/main/target/debug/localsgd
ARGS="bench-step --dataset idx --data-dir /usr/share/datasets/fashion-mnist --hidden 2048,512 --batch-size 32 --optimizer sgd --momentum 0.9 --lr 0.05 --iters 200 --warmup-iters 10 --restart-every 210 --workers 1"
for round in 1 2 3 4 5 6 7; do
  for v in old v4 v4malloc; do
    case $v in
      old) B=$OLD; E="";;
      v4) B=$NEW; E="LOCALSGD_MALLOC_DEFAULTS=1";;
      v4malloc) B=$NEW; E="";;
    esac
    env $E RAYON_NUM_THREADS=1 taskset -c 1 $B $ARGS --json /tmp/sb-$v-$round.json > /dev/null
    python3 -c "import json;d=json.load(open('/tmp/sb-$v-$round.json'));print('$v',$round,d.get('median_ms'),d.get('mean_ms'))"
  done
done
