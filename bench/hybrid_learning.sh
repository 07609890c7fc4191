#!/bin/sh
# The learning check of issue 17: `hybrid` and `tiny` trained for the same wall-clock time on the
# same text with the same tokenizer, batch and sequence length; validation losses side by side and
# one PNG of both curves against wall-clock seconds (docs/BENCHMARKS.md, "Hybrid (issue 17)").
#
#   bench/hybrid_learning.sh [build dir] [run dir]        defaults: build/release, build/hybrid_learning
#
# Environment: BUDGET (seconds of training per model, 600), DATA (a text file; default
# ../shared/data/corpus/tinystories_valid_head.txt), BATCH (8), SEQ (256), LOSS (full | sampled),
# LR (2e-3), CPU (the core both runs are pinned to, 0), PNG (docs/img/hybrid_vs_tiny_loss.png).
# Each run's step count comes from a 10-step probe so its cosine schedule ends with the budget; the
# byte-level BPE tokenizer (16,384 tokens) is trained once on the text and used by both. Prints one JSON object:
# per model the steps, tokens/s, final train loss and final validation loss.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build/release}
run=${2:-build/hybrid_learning}
case $build in /*) ;; *) build=$here/$build ;; esac
bin=$build/corelm
budget=${BUDGET:-600}
data=${DATA:-$here/../shared/data/corpus/tinystories_valid_head.txt}
batch=${BATCH:-8}
seq=${SEQ:-256}
loss=${LOSS:-full}
lr=${LR:-2e-3}
cpu=${CPU:-0}
png=${PNG:-$here/docs/img/hybrid_vs_tiny_loss.png}
[ -s "$data" ] || { echo "hybrid_learning: $data missing (the shared data set, ../shared/data)" >&2; exit 1; }
mkdir -p "$run"
[ -s "$run/tokenizer.json" ] || "$bin" tokenizer train --vocab-size 16384 --input "$data" --output "$run/tokenizer.json" --no-progress >&2
for preset in tiny hybrid; do
  common="--preset $preset --data $data --tokenizer $run/tokenizer.json --batch $batch --seq $seq --lr $lr --loss $loss
    --threads 1 --seed 0"
  probe=$run/$preset.probe
  rm -rf "$probe"
  # shellcheck disable=SC2086
  tps=$(taskset -c "$cpu" "$bin" train $common --out "$probe" --steps 10 --warmup 2 --eval-batches 0 --sample-tokens 0 \
          --save-every 0 --no-progress | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['tokens_per_s'])")
  rm -rf "$probe"
  steps=$(python3 -c "import sys; print(max(50, int(float(sys.argv[1]) * float(sys.argv[2]) / (int(sys.argv[3]) * int(sys.argv[4])))))" \
            "$tps" "$budget" "$batch" "$seq")
  echo "hybrid_learning: $preset probe $tps tok/s -> $steps steps in ${budget}s ($(uptime | sed 's/.*load/load/'))" >&2
  rm -rf "$run/$preset"
  # shellcheck disable=SC2086
  taskset -c "$cpu" "$bin" train $common --out "$run/$preset" --steps "$steps" \
    --warmup $((steps / 20 + 1)) --eval-every $((steps / 10 + 1)) --eval-batches 16 --sample-tokens 0 \
    --time-budget "$((budget + budget / 10))" --save-every 0 --no-progress > "$run/$preset.summary.json"
done
mkdir -p "$(dirname "$png")"
${PYTHON:-/usr/bin/python3} "$here/bench/plot_train_curves.py" --x seconds \
  --title "hybrid vs tiny, same wall-clock ($batch x $seq tokens/step, $loss softmax, one core)" \
  "$png" "$run/curve.json" "tiny=$run/tiny" "hybrid=$run/hybrid" >/dev/null
python3 - "$run" <<'PY'
import json, sys
run = sys.argv[1]
out = {"curve": json.load(open(run + "/curve.json"))}
for p in ("tiny", "hybrid"):
    s = json.load(open(f"{run}/{p}.summary.json"))
    out[p] = {k: s.get(k) for k in ("steps", "tokens_seen", "tokens_per_s", "train_loss", "val_loss")}
print(json.dumps(out, indent=1))
PY
