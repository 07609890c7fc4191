#!/bin/sh
# fp32 vs bf16 compute in training (issue 5: "loss curves must match the fp32 run within noise").
# Trains the same model on the same data with `--compute-dtype f32` and `--compute-dtype bf16`,
# two seeds each (the seed-to-seed gap is the noise band), then prints a JSON summary and plots
# docs/img/train_precision_curves.png (bench/plot_train_curves.py).
# Usage: bench/train_precision_curves.sh [build dir] [work dir]
# Environment: STEPS (400), BATCH (8), SEQ (64), PRESET (tiny), SEEDS ("1 2"),
#   DATA (/work/shared/data/corpus/tinyshakespeare.txt, else the KJV text from scripts/kjv-text).
# The bf16 runs use the process's bf16 GEMM kernel (chosen by measured peaks; CORELM_BF16_GEMM=
# dpbf16|rounded forces one) and the script prints which one each run recorded in its log.
# ~1.5-3k tok/s per run on one core: the defaults take ~1.5-2.5 min per run, ~8 min in all.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build/release}
work=${2:-$here/build/precision_curves}
case $build in /*) ;; *) build=$here/$build ;; esac
bin=$build/corelm
steps=${STEPS:-400}
batch=${BATCH:-8}
seq=${SEQ:-64}
preset=${PRESET:-tiny}
seeds=${SEEDS:-1 2}
mkdir -p "$work" "$here/docs/img"

data=${DATA:-/work/shared/data/corpus/tinyshakespeare.txt}
if [ ! -s "$data" ]; then
  data=$work/kjv.txt
  [ -s "$data" ] || "$here/scripts/kjv-text" "$data"
fi

"$bin" train --help | grep -q -- --compute-dtype ||
  { echo "train_precision_curves: '$bin train' has no --compute-dtype flag (rebuild?)" >&2; exit 1; }

# One tokenizer for every run, so the runs differ only in seed and compute dtype.
tokenizer=$work/tokenizer.json
if [ ! -s "$tokenizer" ]; then
  rm -rf "$work/tok"
  nice -n 10 taskset -c 0 "$bin" train --preset "$preset" --data "$data" --out "$work/tok" --steps 1 \
    --batch 1 --seq 16 --eval-batches 1 --sample-tokens 0 --no-progress >/dev/null
  cp "$work/tok/tokenizer.json" "$tokenizer"
fi

runs=""
for seed in $seeds; do
  for dt in f32 bf16; do
    out=$work/${dt}_s$seed
    rm -rf "$out"
    echo "train_precision_curves: $dt compute, seed $seed, $steps steps of $batch x $seq" >&2
    nice -n 10 taskset -c 0 "$bin" train --preset "$preset" --data "$data" --tokenizer "$tokenizer" \
      --out "$out" --steps "$steps" --batch "$batch" --seq "$seq" --seed "$seed" --threads 1 \
      --compute-dtype "$dt" --eval-every $((steps / 4)) --eval-batches 8 --sample-tokens 0 \
      --save-every 0 --no-progress >/dev/null
    runs="$runs ${dt}_s$seed=$out"
    [ "$dt" = bf16 ] && echo "train_precision_curves: bf16 kernel $(grep -o '"bf16_gemm":"[a-z0-9]*"' "$out/train_log.jsonl" | head -1)" >&2
  done
done

# shellcheck disable=SC2086
/usr/bin/python3 "$here/bench/plot_train_curves.py" "$here/docs/img/train_precision_curves.png" \
  "$work/summary.json" $runs
