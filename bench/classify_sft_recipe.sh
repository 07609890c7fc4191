#!/usr/bin/env bash
# The label-likelihood SFT recipe of the task table (bench/agnews_classify.sh's config, for any set):
#
#   bench/classify_sft_recipe.sh TRAIN.jsonl DEV.jsonl TEST.jsonl LABELS WORK
#
# TRAIN/DEV/TEST rows are {"text", "label"} (bench/task_data.py); LABELS is comma-separated.
# A 2-layer model (hidden 128, BPE vocabulary 4096 trained on the pairs) is trained from scratch
# with `corelm train --sft` on pairs {"input": "<text>\nLabel:", "output": " <label>"}, and
# `corelm eval-task --task classify` scores TEST with the same template (each label scored as the
# continuation " <label>"). DEV is not used for selection (the config is fixed: no head, no
# calibration), so ece_before is null and ece is the raw one. Prints one JSON line:
#   {"accuracy", "macro_f1", "ece_before", "ece", "input_tok_s", "params", "train_s", "recipe": {...}}
# Runs at nice 10 pinned to core ${PIN_CORE:-0}. Environment: CORELM_BIN (build/release/corelm), TRAIN_STEPS (1500),
# SEQ (96), LR (2e-3), BATCH (16), TEST_LIMIT (0 = all test rows), REUSE_MODEL=1 (keep WORK/model),
# TIME_BUDGET (600: training stops and checkpoints after that many seconds; steps_done says where).
set -euo pipefail
[[ $# == 5 ]] || { echo "usage: $0 TRAIN.jsonl DEV.jsonl TEST.jsonl LABELS WORK" >&2; exit 2; }
train=$1 dev=$2 test=$3 labels=$4 work=$5
cd "$(dirname "$0")/.."
bin=${CORELM_BIN:-build/release/corelm}
steps=${TRAIN_STEPS:-1500} seq=${SEQ:-96} lr=${LR:-2e-3} batch=${BATCH:-16} limit=${TEST_LIMIT:-0}
. bench/recipe_common.sh
recipe_check classify_sft_recipe "$train" "$dev" "$test"
recipe_prepare "$train" "$test" "$limit" '
def pair(r):
    return {"input": r["text"] + "\nLabel:", "output": " " + r["label"]}
'
recipe_config 160
t0=$(date +%s.%N)
recipe_train
t1=$(date +%s.%N)
nice -n 10 "${pin[@]}" "$bin" eval-task --model "$work/model" --data "$work/test.jsonl" --task classify \
  --labels "$labels" --template '{text}\nLabel:' --threads 1 --batch 16 --json > "$work/eval.json"

python3 - "$work" "$t0" "$t1" "$steps" "$seq" "$lr" "$batch" "$(recipe_params)" <<'PY'
import json, os, sys
work, t0, t1, steps, seq, lr, batch, params = sys.argv[1:]
ev = json.load(open(f"{work}/eval.json"))
tr = json.load(open(f"{work}/train.json")) if os.path.getsize(f"{work}/train.json") else {}
cfg = json.load(open(f"{work}/model/config.json"))
h, L, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
print(json.dumps({"accuracy": ev["accuracy"], "macro_f1": ev["macro_f1"], "ece_before": None, "ece": ev["ece"],
                  "input_tok_s": ev["tokens_per_s"], "params": int(params), "train_s": round(float(t1) - float(t0), 1),
                  "test_rows": ev["records"], "error_records": ev["error_records"],
                  "recipe": {"name": "label-likelihood SFT", "layers": L, "hidden": h, "vocab": v,
                             "steps": int(steps), "steps_done": tr.get("steps"),
                             "time_budget_s": float(os.environ.get("TIME_BUDGET", "600")), "seq": int(seq), "lr": float(lr), "batch": int(batch),
                             "template": "{text}\\nLabel:"}}))
PY
