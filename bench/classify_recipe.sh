#!/usr/bin/env bash
# The post-training recipe for text classification with the head (docs/TRAINING.md,
# "Classification head and post-training recipe"), one recipe for every labelled set:
#
#   bench/classify_recipe.sh TRAIN.jsonl DEV.jsonl TEST.jsonl LABELS WORK
#
# Records are {"text": ..., "label": ...}; LABELS is comma-separated. A tiny-class model (2 layers,
# hidden 256, a byte-level BPE trained on TRAIN's text; 3-6M parameters) gets the head and is
# trained with `corelm train --task classify` (label smoothing 0.1, weight decay 0.1, cosine
# schedule, dev evaluation every ~half epoch, the best dev checkpoint kept, temperature fitted on
# DEV) for each point of a small grid (learning rate x pooling); the point with the best DEV
# accuracy (ties: lower dev loss) is kept, and only that model sees TEST, through
# `corelm eval-task`. Nothing is chosen on TEST.
#
# Output: one JSON line on stdout
#   {"accuracy", "macro_f1", "ece_before", "ece", "input_tok_s", "params", "train_s", "recipe": {...}}
# where ece_before is TEST's ECE at temperature 1 (the same model, its temperature set to 1),
# ece the calibrated model's, input_tok_s `eval-task`'s input tokens/s on one thread.
#
# Environment:
#   PRETRAIN="FILE..." round 0 (multi-round recipe): language-model pretraining of the same model
#                     on these unlabelled text files plus TRAIN's text (twice), PRETRAIN_STEPS
#                     steps (default 600) of 16 x 64 tokens, lr 3e-3; its BPE is trained on that
#                     text; every grid point then starts from it (--init). Unset: no round 0.
#   INIT=DIR          start every grid point from this pretrained model (its tokenizer; the
#                     config and BPE below are then unused); a model with a head is continued
#   ADAPT_STEPS=N     round 1 (task-adaptive pretraining, with INIT or PRETRAIN): N steps of
#                     language-model training continued from that model on TRAIN's text (and the
#                     unlabelled files in ADAPT="FILE...", e.g. the user's in-domain corpus), batch
#                     16 x 64 tokens, sampled softmax, once per learning rate in ADAPT_LRS
#                     (default "2e-4 1e-3"; ADAPT_LR=X runs X alone); the run with the lowest
#                     language-model loss on the held-out last 2% of that text is kept and the grid
#                     starts from it. Labels are never read. 0 or unset: no round 1.
#   CORELM_BIN        default build/release/corelm
#   LRS="1e-3 3e-3"   learning-rate grid;  POOLINGS="mean last"  pooling grid
#   EPOCHS=6          passes over TRAIN per grid point, capped by MAX_STEPS (default 2500)
#   BATCH=32 SEQ=128 VOCAB=8192 LAYERS=2 HIDDEN=256 FFN=640  the model and batch
#   DROPOUT=0         --classifier-dropout of every grid point (dropout on the pooled state before
#                     the head while training; 0: none, the recipe as adopted)
#   PRECISION=bf16    eval-task's inference precision (bf16 fast path, or f32)
#   COMPUTE=bf16      training's matrix-product precision (--compute-dtype: bf16 runs the bf16 GEMM
#                     where the core has it at full rate, else bf16-rounded operands; or f32)
#   NICE=10           niceness of the training and evaluation runs
#   SOUP=1 (default)  after the grid, average the weights of its points of the chosen pooling
#                     (`corelm merge --method greedy --dev DEV`: best-first, each kept only when DEV
#                     accuracy does not fall; temperature refitted on DEV) and use that soup in place
#                     of the best point (it is never worse on DEV). The JSON then also carries the
#                     best single point's TEST accuracy, as a diagnostic (nothing is chosen on it).
#                     SOUP=0: the best point alone, as before 2026-12-06.
#   SOUP_CHECKPOINTS=1  every grid point also saves its weights at each dev evaluation
#                     (OUT/checkpoints/step-N, all kept), and the greedy soup's candidates are the
#                     grid points of the chosen pooling plus those checkpoints (still best-first
#                     by DEV accuracy, each kept only when DEV does not fall); a point's checkpoint
#                     at its best step is the point's own weights, and `corelm merge` counts such a
#                     duplicate once. 0 (default): the grid points alone. Needs SOUP=1.
#                     After the soup the checkpoints' optimizer state is deleted (KEEP_OPTIMIZER=1
#                     keeps it): the weights are what a soup or REUSE=1 reads.
#   TEACHER=FIELD     distil (round 3, docs/TRAINING.md): TRAIN's records carry a teacher's
#                     probabilities in FIELD (bench/teacher_probs.py writes them from the final models
#                     of earlier runs); every grid point trains with --teacher-field FIELD
#                     --distill-weight ${DISTILL_WEIGHT:-0.5}. Round 1 and DEV are unchanged.
#   SEED=0            --seed of round 1 and of every grid point (weights of the head, data order)
#   DATA_SEEDS="1 2"  more grid points: each (lr, pooling) is trained once more per value with
#                     --data-seed (another batch order from the same round 1 and the same initial
#                     head, so the points stay averageable), in OUT_dK; they are chosen among and
#                     enter the soup like the others. Unset: none.
#   GRID_ONLY=1       stop once round 1 and the grid points are trained (no soup, no TEST, no JSON):
#                     train a grid's points on separate cores (LRS=one value each, in copies of WORK
#                     sharing round 1), move them into one WORK and score it with REUSE=1
#   REUSE=1           keep a grid point already trained in WORK (its OUT.json and model) instead of
#                     training it again, e.g. to score a grid cut short
#   PIN=0             the core they are pinned to with taskset (empty: not pinned)
set -euo pipefail
if [[ $# -ne 5 ]]; then
  echo "usage: $0 TRAIN.jsonl DEV.jsonl TEST.jsonl LABELS WORK" >&2
  exit 2
fi
train=$1 dev=$2 test=$3 labels=$4 work=$5
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CORELM_BIN:-$root/build/release/corelm}
lrs=${LRS:-"1e-3 3e-3"}
poolings=${POOLINGS:-"mean last"}
epochs=${EPOCHS:-6}
max_steps=${MAX_STEPS:-2500}
batch=${BATCH:-32}
seq=${SEQ:-128}
precision=${PRECISION:-bf16}
for f in "$train" "$dev" "$test"; do [[ -s $f ]] || { echo "classify_recipe: $f is missing or empty" >&2; exit 1; }; done
[[ -x $bin ]] || { echo "classify_recipe: $bin not built (cmake --build --preset release --target corelm_cli)" >&2; exit 1; }
mkdir -p "$work"
run=(nice -n "${NICE:-10}")
pin=${PIN-0}
[[ -n $pin ]] && command -v taskset >/dev/null && run+=(taskset -c "$pin")

cat > "$work/config.json" <<JSON
{"model_type": "llama", "vocab_size": ${VOCAB:-8192}, "hidden_size": ${HIDDEN:-256},
 "intermediate_size": ${FFN:-640}, "num_hidden_layers": ${LAYERS:-2}, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": $(( ${HIDDEN:-256} / 4 )), "max_position_embeddings": $seq,
 "tie_word_embeddings": true}
JSON
n_train=$(grep -c . "$train")
steps=$(( (epochs * n_train + batch - 1) / batch ))
(( steps > max_steps )) && steps=$max_steps
eval_every=$(( n_train / batch / 2 ))
(( eval_every < 20 )) && eval_every=20
(( eval_every > steps )) && eval_every=$steps
ckpt_soup=${SOUP_CHECKPOINTS:-0}
[[ $ckpt_soup == 1 && ${SOUP:-1} != 1 ]] && { echo "classify_recipe: SOUP_CHECKPOINTS=1 needs SOUP=1" >&2; exit 2; }
save_every=0 keep=1
# Checkpoints at every dev evaluation, all kept (a soup's candidates); otherwise only the last.
[[ $ckpt_soup == 1 ]] && save_every=$eval_every keep=$(( steps / eval_every + 2 ))
base=(--task classify --labels "$labels" --data "$train" --dev "$dev" --steps "$steps" --batch "$batch"
      --seq "$seq" --label-smoothing 0.1 --weight-decay 0.1 --eval-every "$eval_every" --save-every "$save_every"
      --keep-checkpoints "$keep" --no-progress --threads 1 --compute-dtype "${COMPUTE:-bf16}" --seed "${SEED:-0}")
[[ ${DROPOUT:-0} != 0 ]] && base+=(--classifier-dropout "$DROPOUT")
[[ -n ${TEACHER:-} ]] && base+=(--teacher-field "$TEACHER" --distill-weight "${DISTILL_WEIGHT:-0.5}")
start=$(date +%s.%N)
init=${INIT:-}
# TRAIN's text, one record a line (labels dropped): the language-model data of rounds 0 and 1.
if [[ ( -z $init && -n ${PRETRAIN:-} ) || ${ADAPT_STEPS:-0} -gt 0 ]]; then
  python3 - "$train" "$work/train_text.txt" <<'PY'
import json, sys
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in open(sys.argv[1], encoding="utf-8"):
        if line.strip():
            out.write(json.loads(line)["text"].replace("\n", " ") + "\n")
PY
fi
if [[ -z $init && -n ${PRETRAIN:-} ]]; then
  rm -rf "$work/pretrain"
  # shellcheck disable=SC2086
  "${run[@]}" "$bin" train --config "$work/config.json" --data $PRETRAIN "$work/train_text.txt" "$work/train_text.txt" \
    --steps "${PRETRAIN_STEPS:-600}" --batch 16 --seq 64 --lr 3e-3 --sample-tokens 0 --save-every 0 \
    --keep-checkpoints 1 --no-progress --threads 1 --out "$work/pretrain" > "$work/pretrain.json"
  echo "classify_recipe: round 0 (LM pretraining): $(cat "$work/pretrain.json")" >&2
  init=$work/pretrain
fi
init_round0=$init  # what the recipe JSON reports as "init": the model round 1 (if any) starts from
adapt_chosen="" adapt_losses=""
if [[ -n $init && ${ADAPT_STEPS:-0} -gt 0 ]]; then
  # One round-1 run per learning rate; the one with the lowest held-out language-model loss on
  # TRAIN's text (the last 2%, --val-fraction) is kept. Labels are never read.
  best_val=""
  for alr in ${ADAPT_LR:-${ADAPT_LRS:-2e-4 1e-3}}; do
    aout="$work/adapt_lr$alr"
    if [[ ${REUSE:-0} == 1 && -f $aout/model.safetensors && -s $aout.json ]]; then
      echo "classify_recipe: REUSE=1: keeping round 1 in $aout" >&2
    else
      rm -rf "$aout"
      # shellcheck disable=SC2086
      "${run[@]}" "$bin" train --init "$init" --data ${ADAPT:-} "$work/train_text.txt" --steps "$ADAPT_STEPS" \
        --batch 16 --seq 64 --lr "$alr" --loss sampled --compute-dtype "${COMPUTE:-bf16}" \
        --val-fraction 0.02 --eval-every 0 --sample-tokens 0 --save-every 0 --keep-checkpoints 1 --no-progress \
        --threads 1 --seed "${SEED:-0}" --out "$aout" > "$aout.json"
    fi
    val=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["val_loss"])' "$aout.json")
    echo "classify_recipe: round 1 (task-adaptive LM, $ADAPT_STEPS steps, lr $alr): held-out loss $val: $(cat "$aout.json")" >&2
    adapt_losses+="$alr:$val "
    if [[ -z $best_val ]] || python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$val" "$best_val"; then
      best_val=$val adapt_chosen=$alr
    fi
  done
  init=$work/adapt_lr$adapt_chosen
fi
if [[ -n $init ]]; then base+=(--init "$init"); else base+=(--config "$work/config.json"); fi

dseeds=${DATA_SEEDS:-}
# A grid point's folder: WORK/lr<LR>_<POOLING>, with _d<K> for an extra data seed K.
point_dir() { echo "$work/lr$1_$2${3:+_d$3}"; }
best="" best_acc=-1 best_loss=0
for lr in $lrs; do
  for pool in $poolings; do
   for ds in "" $dseeds; do
    out=$(point_dir "$lr" "$pool" "$ds")
    if [[ ${REUSE:-0} == 1 && -s $out.json && -f $out/model.safetensors &&
          ( $ckpt_soup == 0 || -d $out/checkpoints/step-$(printf %08d "$eval_every") ) ]]; then
      echo "classify_recipe: REUSE=1: keeping the trained $out" >&2
    else
      rm -rf "$out"
      "${run[@]}" "$bin" train "${base[@]}" --lr "$lr" --pooling "$pool" ${ds:+--data-seed "$ds"} --out "$out" > "$out.json"
    fi
    read -r acc loss < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["dev_accuracy"], j["dev_loss"])' "$out.json")
    echo "classify_recipe: lr $lr pooling $pool${ds:+ data seed $ds}: dev accuracy $acc, dev loss $loss" >&2
    if python3 -c 'import sys; a,l,ba,bl=map(float,sys.argv[1:]); sys.exit(0 if a>ba or (a==ba and l<bl) else 1)' \
        "$acc" "$loss" "$best_acc" "$best_loss"; then
      best=$out best_acc=$acc best_loss=$loss
    fi
   done
  done
done
[[ ${GRID_ONLY:-0} == 1 ]] && { echo "classify_recipe: GRID_ONLY=1: grid trained in $work" >&2; exit 0; }
single=$best
if [[ ${SOUP:-1} == 1 ]]; then
  pool_best=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["classifier_pooling"])' "$best/config.json")
  members=()
  for lr in $lrs; do
   for ds in "" $dseeds; do
    point=$(point_dir "$lr" "$pool_best" "$ds")
    members+=("$point")
    if [[ $ckpt_soup == 1 ]]; then
      for c in "$point"/checkpoints/step-*; do [[ -f $c/model.safetensors ]] && members+=("$c"); done
    fi
   done
  done
  if (( ${#members[@]} >= 2 )); then
    "${run[@]}" "$bin" merge "${members[@]}" --dev "$dev" --max-tokens "$seq" --out "$work/soup" --json > "$work/soup.json"
    echo "classify_recipe: soup: $(cat "$work/soup.json")" >&2
    best=$work/soup
  fi
fi
# The grid's checkpoints were kept for the soup (and --resume while training); once it is made,
# their optimizer state (2/3 of each checkpoint; 2.6 GB of AG News' 4.1 GB work folder) is dropped. The weights
# stay, so REUSE=1 and a re-run of the merge still work. KEEP_OPTIMIZER=1 keeps it.
if [[ $ckpt_soup == 1 && ${KEEP_OPTIMIZER:-0} != 1 ]]; then
  for lr in $lrs; do for pool in $poolings; do for ds in "" $dseeds; do
    rm -f "$(point_dir "$lr" "$pool" "$ds")"/checkpoints/step-*/optimizer.safetensors
  done; done; done
fi
train_s=$(python3 -c "import time; print(round(time.time() - $start, 1))")

# TEST, once, with the chosen model; and once more at temperature 1 for ece_before.
"${run[@]}" "$bin" eval-task --model "$best" --data "$test" --task classify --precision "$precision" \
  --threads 1 --batch 16 --json > "$work/test_eval.json"
uncal="$work/uncalibrated"
rm -rf "$uncal" && mkdir -p "$uncal"
cp "$best/model.safetensors" "$best/tokenizer.json" "$uncal/"
python3 - "$best/config.json" "$uncal/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["classifier_temperature"] = 1.0
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
"${run[@]}" "$bin" eval-task --model "$uncal" --data "$test" --task classify --precision "$precision" \
  --threads 1 --batch 16 --json > "$work/test_eval_uncalibrated.json"

if [[ $single != "$best" ]]; then
  "${run[@]}" "$bin" eval-task --model "$single" --data "$test" --task classify --precision "$precision" \
    --threads 1 --batch 16 --json > "$work/test_eval_single.json"
fi

python3 - "$work" "$single" "$best" "$train_s" "$lrs" "$poolings" "$steps" "$epochs" "$init_round0" "${PRETRAIN:-}" "${ADAPT_STEPS:-0}" "${ADAPT:-}" "$adapt_chosen" "$adapt_losses" "$dseeds" <<'PY'
import json, os, sys
work, best, model, train_s, lrs, pools, steps, epochs, init, pretrain, adapt_steps, adapt, adapt_lr, adapt_losses, dseeds = sys.argv[1:]
ev = json.load(open(f"{work}/test_eval.json"))
un = json.load(open(f"{work}/test_eval_uncalibrated.json"))
tr = json.load(open(f"{best}.json"))
cfg = json.load(open(f"{best}/config.json"))
soup = None
if model != best:
    sj = json.load(open(f"{work}/soup.json"))
    single = json.load(open(f"{work}/test_eval_single.json"))
    soup = {"models": sj["models"], "kept": sj["kept"], "dev_accuracy": sj["dev_accuracy"],
            "temperature": sj["temperature"], "dev_ece_before": sj["ece_before"], "dev_ece": sj["ece_after"],
            "single_test_accuracy": single["accuracy"], "single_dev_accuracy": tr["dev_accuracy"]}
print(json.dumps({
    "accuracy": ev["accuracy"], "macro_f1": ev["macro_f1"], "ece_before": un["ece"], "ece": ev["ece"],
    "input_tok_s": ev["tokens_per_s"], "params": tr["params"], "train_s": float(train_s),
    "recipe": {"model": model, "soup": soup, "init": init or None, "pretrain": pretrain.split() or None,
               "adapt": {"steps": int(adapt_steps), "files": adapt.split(), "lr": float(adapt_lr),
                         "heldout_loss": {k: float(v) for k, v in (x.split(":") for x in adapt_losses.split())}}
                        if int(adapt_steps) > 0 and adapt_lr else None, "grid": {"lr": lrs.split(), "pooling": pools.split(),
                                                                  "data_seeds": [int(x) for x in dseeds.split()]},
               "chosen": {"lr": float(best.rsplit("/", 1)[1].split("_")[0][2:]), "pooling": cfg["classifier_pooling"],
                          "data_seed": int(best.rsplit("_d", 1)[1]) if "_d" in best.rsplit("/", 1)[1] else None},
               "steps": int(steps), "epochs": float(epochs), "best_step": tr["best_step"],
               "dev_accuracy": soup["dev_accuracy"] if soup else tr["dev_accuracy"],
               "dev_ece_before": soup["dev_ece_before"] if soup else tr["ece_before"],
               "dev_ece": soup["dev_ece"] if soup else tr["ece_after"],
               "temperature": soup["temperature"] if soup else tr["temperature"], "label_smoothing": 0.1, "weight_decay": 0.1,
               "classifier_dropout": float(os.environ.get("DROPOUT", "0")),
               "teacher": ({"field": os.environ["TEACHER"], "distill_weight": float(os.environ.get("DISTILL_WEIGHT", "0.5"))}
                           if os.environ.get("TEACHER") else None),
               "vocab": cfg["vocab_size"], "layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"]}}))
PY
