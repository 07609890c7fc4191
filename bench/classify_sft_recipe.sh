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
[[ -x $bin ]] || { echo "classify_sft_recipe: $bin missing (cmake --build --preset release --target corelm_cli)" >&2; exit 1; }
for f in "$train" "$dev" "$test"; do [[ -s $f ]] || { echo "classify_sft_recipe: $f missing or empty" >&2; exit 1; }; done
pin=(); command -v taskset >/dev/null && pin=(taskset -c "${PIN_CORE:-0}")
mkdir -p "$work"

python3 - "$train" "$test" "$work" "$limit" <<'PY'
import json, sys
train, test, work, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(train, encoding="utf-8") as f, open(f"{work}/sft.jsonl", "w", encoding="utf-8") as out:
    for line in f:
        r = json.loads(line)
        out.write(json.dumps({"input": r["text"] + "\nLabel:", "output": " " + r["label"]}, ensure_ascii=False) + "\n")
with open(test, encoding="utf-8") as f, open(f"{work}/test.jsonl", "w", encoding="utf-8") as out:
    for i, line in enumerate(f):
        if limit and i >= limit:
            break
        out.write(line)
PY
cat > "$work/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 4096, "hidden_size": 128, "intermediate_size": 320,
 "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
 "max_position_embeddings": 160, "tie_word_embeddings": true}
JSON
t0=$(date +%s.%N)
if [[ ${REUSE_MODEL:-0} == 1 && -f $work/model/model.safetensors ]]; then :; else
  rm -rf "$work/model"
  nice -n 10 "${pin[@]}" "$bin" train --config "$work/config.json" --sft "$work/sft.jsonl" --out "$work/model" \
    --steps "$steps" --batch "$batch" --seq "$seq" --lr "$lr" --warmup 30 --threads 1 --seed 1 --val-fraction 0.02 \
    --eval-every "$steps" --sample-tokens 0 --time-budget "${TIME_BUDGET:-600}" --no-progress > "$work/train.json"
fi
t1=$(date +%s.%N)
nice -n 10 "${pin[@]}" "$bin" eval-task --model "$work/model" --data "$work/test.jsonl" --task classify \
  --labels "$labels" --template '{text}\nLabel:' --threads 1 --batch 16 --json > "$work/eval.json"

python3 - "$work" "$t0" "$t1" "$steps" "$seq" "$lr" "$batch" <<'PY'
import json, os, sys
work, t0, t1, steps, seq, lr, batch = sys.argv[1:]
ev = json.load(open(f"{work}/eval.json"))
tr = json.load(open(f"{work}/train.json")) if os.path.getsize(f"{work}/train.json") else {}
cfg = json.load(open(f"{work}/model/config.json"))
h, L, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
# Parameters: the element counts of the saved tensors (safetensors: u64 header length, JSON header).
with open(f"{work}/model/model.safetensors", "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
params = 0
for name, t in header.items():
    if name != "__metadata__":
        n = 1
        for d in t["shape"]:
            n *= d
        params += n
print(json.dumps({"accuracy": ev["accuracy"], "macro_f1": ev["macro_f1"], "ece_before": None, "ece": ev["ece"],
                  "input_tok_s": ev["tokens_per_s"], "params": params, "train_s": round(float(t1) - float(t0), 1),
                  "test_rows": ev["records"], "error_records": ev["error_records"],
                  "recipe": {"name": "label-likelihood SFT", "layers": L, "hidden": h, "vocab": v,
                             "steps": int(steps), "steps_done": tr.get("steps"),
                             "time_budget_s": float(os.environ.get("TIME_BUDGET", "600")), "seq": int(seq), "lr": float(lr), "batch": int(batch),
                             "template": "{text}\\nLabel:"}}))
PY
