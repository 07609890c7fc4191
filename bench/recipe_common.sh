# Shared steps of the from-scratch SFT recipes of the task table (bench/classify_sft_recipe.sh,
# bench/conll_sft_recipe.sh); sourced, not run. The functions read the caller's variables
# bin, work, steps, batch, seq, lr (set before calling) and set/read the array pin, so each
# recipe states only what differs: its pair format, its positions and its eval-task call.

# recipe_check NAME FILE...: the corelm binary and every input file must exist (files non-empty);
# then sets pin (taskset to core ${PIN_CORE:-0} when available) and creates WORK.
recipe_check() {
  local name=$1 f; shift
  [[ -x $bin ]] || { echo "$name: $bin missing (cmake --build --preset release --target corelm_cli)" >&2; exit 1; }
  for f in "$@"; do [[ -s $f ]] || { echo "$name: $f missing or empty" >&2; exit 1; }; done
  pin=(); command -v taskset >/dev/null && pin=(taskset -c "${PIN_CORE:-0}")
  mkdir -p "$work"
}

# recipe_prepare TRAIN TEST LIMIT PAIR_PY: writes WORK/sft.jsonl (one pair per TRAIN row, made by
# PAIR_PY, Python source defining pair(row) -> {"input", "output"}) and WORK/test.jsonl (the first
# LIMIT rows of TEST; 0 = all).
recipe_prepare() {
  python3 - "$1" "$2" "$work" "$3" "$4" <<'PY'
import json, sys
train, test, work, limit, pair_py = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
scope = {}
exec(pair_py, scope)
pair = scope["pair"]
with open(train, encoding="utf-8") as f, open(f"{work}/sft.jsonl", "w", encoding="utf-8") as out:
    for line in f:
        out.write(json.dumps(pair(json.loads(line)), ensure_ascii=False) + "\n")
with open(test, encoding="utf-8") as f, open(f"{work}/test.jsonl", "w", encoding="utf-8") as out:
    for i, line in enumerate(f):
        if limit and i >= limit:
            break
        out.write(line)
PY
}

# recipe_config POSITIONS: WORK/config.json, the recipes' 2-layer model (hidden 128, vocabulary
# 4096) with POSITIONS positions.
recipe_config() {
  cat > "$work/config.json" <<JSON
{"model_type": "llama", "vocab_size": 4096, "hidden_size": 128, "intermediate_size": 320,
 "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
 "max_position_embeddings": $1, "tie_word_embeddings": true}
JSON
}

# recipe_train: `corelm train --sft` from scratch (or from the model SFT_INIT names, its tokenizer and
# shape, when SFT_INIT is set) into WORK/model, matrix products in ${COMPUTE:-f32} (--compute-dtype) (kept when REUSE_MODEL=1 and a
# model is there), stopping after TIME_BUDGET seconds (600); its JSON goes to WORK/train.json.
recipe_train() {
  if [[ ${REUSE_MODEL:-0} == 1 && -f $work/model/model.safetensors ]]; then :; else
    rm -rf "$work/model"
    local start=(--config "$work/config.json")
    [[ -n ${SFT_INIT:-} ]] && start=(--init "$SFT_INIT")
    nice -n 10 "${pin[@]}" "$bin" train "${start[@]}" --sft "$work/sft.jsonl" --out "$work/model" \
      --steps "$steps" --batch "$batch" --seq "$seq" --lr "$lr" --warmup 30 --threads 1 --seed 1 --val-fraction 0.02 --compute-dtype "${COMPUTE:-f32}" \
      --eval-every "$steps" --sample-tokens 0 --time-budget "${TIME_BUDGET:-600}" --no-progress > "$work/train.json"
  fi
}

# recipe_params: prints the parameter count of WORK/model, the element counts of its saved tensors
# (safetensors: u64 header length, JSON header).
recipe_params() {
  python3 - "$work/model/model.safetensors" <<'PY'
import json, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
params = 0
for name, t in header.items():
    if name != "__metadata__":
        n = 1
        for d in t["shape"]:
            n *= d
        params += n
print(params)
PY
}
