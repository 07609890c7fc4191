#!/bin/sh
# Pretrains the `tiny` preset on the corpus scripts/build_corpus.sh built, for a time budget, and
# plots the loss curve (docs/TRAINING.md, "Pretraining corpus and recipe").
#
#   bench/pretrain_tiny.sh [build dir] [corpus dir] [run dir]
#       defaults: build/release, build/corpus, build/pretrain_tiny
#
# Environment: BUDGET (seconds of training: 900, or none when STEPS is given), BATCH (8), SEQ (128), LR (2e-3), LOSS (sampled:
# the sampled softmax, ~3x the tokens per hour at the full-softmax validation loss; or full),
# THREADS (1), COMPUTE (bf16: the measured bf16 GEMM where the core runs it at full rate, else
# bf16-rounded operands on the fp32 GEMM; or f32), NICE (10), PNG (docs/img/pretrain_tiny_loss.png), INIT (a model dir to continue
# from, e.g. a previous run), RANKS (1: data-parallel MPI ranks, one per core, `mpirun --bind-to
# core`; BATCH is per rank, so the global batch is RANKS x BATCH), SEED (0: weights and data order;
# give a continuation another seed so it draws other windows), SCHEDULE (cosine, or wsd: the peak
# until the last DECAY fraction of the steps (0.2), then a linear decay), STOP_AT (stop and
# checkpoint after this step, keeping the schedule of STEPS), RESUME (1: continue RUN's own
# checkpoint with `--resume` instead of starting over; needs STEPS, which may be larger than the
# run was planned for). A body that grows across sessions: SCHEDULE=wsd with STOP_AT at the decay's
# start keeps a plateau checkpoint (copy RUN somewhere that survives the machine); RESUME=1 with a
# larger STEPS later continues it exactly as if that length had been planned, and RESUME=1 with
# the same STEPS runs the decay that gives the model to use (docs/TRAINING.md). WARMUP: warmup steps
# (STEPS / 20 + 1). SAVE_EVERY: checkpoint interval in steps (STEPS / 4 + 1).
# The number of steps is chosen so the cosine schedule ends with the budget: a 10-step probe
# measures tokens/s first (STEPS=N skips the probe and runs N steps, e.g. when the probe is noisy;
# then there is no time cap unless BUDGET is also given; a run the cap stops short of its STEPS or STOP_AT
# says so (`corelm train` reports it) and is continued with RESUME=1). Validation is the corpus's own validation file (corpus.val.bin), scored
# on the same 16 batches at every evaluation; the plot shows the training loss (21-step moving
# average) and the validation points. Prints the run summary and the curve summary as JSON.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build/release}
corpus=${2:-build/corpus}
run=${3:-build/pretrain_tiny}
case $build in /*) ;; *) build=$here/$build ;; esac
bin=$build/corelm
budget=${BUDGET:-900}
# With STEPS the run's length is the user's: no time cap unless BUDGET is given as well.
cap=$((budget + budget / 10))
[ -n "${STEPS:-}" ] && [ -z "${BUDGET:-}" ] && cap=0
batch=${BATCH:-8}
seq=${SEQ:-128}
lr=${LR:-2e-3}
loss=${LOSS:-sampled}
threads=${THREADS:-1}
compute=${COMPUTE:-bf16}
nice=${NICE:-10}
ranks=${RANKS:-1}
launch=""
[ "$ranks" -gt 1 ] && launch="mpirun -np $ranks --bind-to core"
png=${PNG:-$here/docs/img/pretrain_tiny_loss.png}
for f in corpus.bin corpus.bin.json corpus.val.bin corpus.tokenizer.json; do
  [ -s "$corpus/$f" ] || { echo "pretrain_tiny: $corpus/$f missing (run scripts/build_corpus.sh $corpus)" >&2; exit 1; }
done
# The validation split is exactly corpus.val.bin: train reads the two files as one and holds out
# the last --val-fraction of the tokens.
valfrac=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['data_build']['train_val_fraction'])" "$corpus/corpus.bin.json")
init=""
[ -n "${INIT:-}" ] && init="--init $INIT"
resume=${RESUME:-0}
if [ "$resume" = 1 ]; then
  [ -n "${STEPS:-}" ] || { echo "pretrain_tiny: RESUME=1 needs STEPS (the run's total steps)" >&2; exit 1; }
  [ -e "$run/checkpoints/latest" ] || { echo "pretrain_tiny: RESUME=1 but $run has no checkpoint to continue" >&2; exit 1; }
  init="--resume"
fi
sched="--schedule ${SCHEDULE:-cosine} --decay-fraction ${DECAY:-0.2} --seed ${SEED:-0}"
[ -n "${STOP_AT:-}" ] && sched="$sched --stop-at $STOP_AT"
common="--preset tiny --data $corpus/corpus.bin $corpus/corpus.val.bin --val-fraction $valfrac
  --tokenizer $corpus/corpus.tokenizer.json --batch $batch --seq $seq --lr $lr --loss $loss --threads $threads --compute-dtype $compute $init"

if [ -n "${STEPS:-}" ]; then
  steps=$STEPS
else
  probe=$run.probe
  rm -rf "$probe"
  # shellcheck disable=SC2086
  tps=$(nice -n "$nice" $launch "$bin" train $common --out "$probe" --steps 10 --warmup 2 --eval-batches 0 --sample-tokens 0 \
          --save-every 0 --no-progress | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['tokens_per_s'])")
  rm -rf "$probe"
  steps=$(python3 -c "import sys; print(max(50, int(float(sys.argv[1]) * float(sys.argv[2]) / (int(sys.argv[3]) * int(sys.argv[4]) * int(sys.argv[5])))))" \
            "$tps" "$budget" "$batch" "$seq" "$ranks")
fi
limit="in ${budget}s"
[ "$cap" = 0 ] && limit="(no time cap)"
echo "pretrain_tiny: probe ${tps:-skipped} tok/s -> $steps steps of $ranks x $batch x $seq $limit ($(uptime | sed 's/.*load/load/'))" >&2

[ "$resume" = 1 ] || rm -rf "$run"
# shellcheck disable=SC2086
nice -n "$nice" $launch "$bin" train $common $sched --out "$run" --steps "$steps" --warmup "${WARMUP:-$((steps / 20 + 1))}" \
  --eval-every $((steps / 12 + 1)) --eval-batches 16 --sample-tokens 24 --time-budget "$cap" \
  --save-every "${SAVE_EVERY:-$((steps / 4 + 1))}" --keep-checkpoints 1 | tee "$run.summary.json"
mkdir -p "$(dirname "$png")"
${PYTHON:-/usr/bin/python3} "$here/bench/plot_train_curves.py" --x tokens \
  --title "tiny on the Debian text corpus ($((ranks * batch)) x $seq tokens/step; train: $loss softmax, val: full)" \
  "$png" "$run.curve.json" "tiny=$run"
