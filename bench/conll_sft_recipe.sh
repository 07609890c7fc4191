#!/usr/bin/env bash
# The corelm row of CoNLL-2003 in the task table: SFT a small model on entity-list pairs and score
# `corelm eval-task --task extract --entities` (the corpus runner's `run extract`) on test.
#
#   bench/conll_sft_recipe.sh TRAIN.jsonl TEST.jsonl WORK
#
# Rows are {"text", "entities"} (bench/task_data.py). Pairs: {"input": "<sentence>\nEntities:",
# "output": " PER: Peter Blackburn; LOC: BRUSSELS"} (" none" for a sentence without entities),
# the format eval-task parses. The model is bench/classify_sft_recipe.sh's 2-layer config with
# 256 positions, trained from scratch; generation is greedy, up to MAX_TOKENS, stopping at a
# newline. Prints one JSON line {"precision", "recall", "f1", "per_type", "input_tok_s",
# "train_s", "params", "recipe"}. Runs at nice 10 pinned to core 0. Environment: CORELM_BIN,
# TRAIN_STEPS (3000), SEQ (128), LR (2e-3), BATCH (16), MAX_TOKENS (48), TEST_LIMIT (0 = all 3,453),
# REUSE_MODEL=1, SFT_INIT (start from this model instead of the from-scratch config), TIME_BUDGET (600: training stops and checkpoints after that many seconds; the
# learning-rate schedule is the one of TRAIN_STEPS, so a cut run ends before its decay; steps_done says where).
set -euo pipefail
[[ $# == 3 ]] || { echo "usage: $0 TRAIN.jsonl TEST.jsonl WORK" >&2; exit 2; }
train=$1 test=$2 work=$3
cd "$(dirname "$0")/.."
bin=${CORELM_BIN:-build/release/corelm}
steps=${TRAIN_STEPS:-3000} seq=${SEQ:-128} lr=${LR:-2e-3} batch=${BATCH:-16} max_tokens=${MAX_TOKENS:-48} limit=${TEST_LIMIT:-0}
. bench/recipe_common.sh
recipe_check conll_sft_recipe "$train" "$test"
recipe_prepare "$train" "$test" "$limit" '
def pair(r):
    ents = "; ".join(e["type"] + ": " + e["text"] for e in r["entities"]) or "none"
    return {"input": r["text"] + "\nEntities:", "output": " " + ents}
'
recipe_config 256
t0=$(date +%s.%N)
recipe_train
t1=$(date +%s.%N)
rm -rf "$work/run"
nice -n 10 "${pin[@]}" "$bin" eval-task --model "$work/model" --data "$work/test.jsonl" --task extract --entities \
  --template '{text}\nEntities:' --stop '\n' --max-tokens "$max_tokens" --threads 1 --batch 16 --out "$work/run" \
  --json > "$work/eval.json"

python3 - "$work" "$t0" "$t1" "$steps" "$seq" "$lr" "$batch" "$max_tokens" "$(recipe_params)" <<'PY'
import json, os, sys
work, t0, t1, steps, seq, lr, batch, max_tokens, params = sys.argv[1:]
ev = json.load(open(f"{work}/eval.json"))
tr = json.load(open(f"{work}/train.json")) if os.path.getsize(f"{work}/train.json") else {}
cfg = json.load(open(f"{work}/model/config.json"))
h, L, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
print(json.dumps({"precision": ev["precision"], "recall": ev["recall"], "f1": ev["f1"], "per_type": ev["per_type"],
                  "records": ev["records"], "gold_entities": ev["gold_entities"],
                  "malformed_entries": ev["malformed_entries"], "error_records": ev["error_records"],
                  "input_tok_s": ev["tokens_per_s"], "params": int(params), "train_s": round(float(t1) - float(t0), 1),
                  "recipe": {"name": "entity-list SFT", "init": os.environ.get("SFT_INIT") or None, "layers": L, "hidden": h, "steps": int(steps), "steps_done": tr.get("steps"),
                             "time_budget_s": float(os.environ.get("TIME_BUDGET", "600")), "seq": int(seq),
                             "lr": float(lr), "batch": int(batch), "max_tokens": int(max_tokens),
                             "template": "{text}\\nEntities:"}}))
PY
