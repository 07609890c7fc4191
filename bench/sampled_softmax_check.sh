#!/usr/bin/env bash
# Learning check for the sampled softmax (corelm train --loss sampled): trains the same small model
# on the same data with the full softmax and with the sampled softmax at several count floors, then
# prints one JSON object with, per run, the FULL-softmax validation loss and the "argmax attractor"
# measure: the fraction of validation positions whose argmax is a token seen fewer than 32 times
# (or never) in the training split. A sampled softmax without a floor leaves rare rows of the LM
# head without negatives, so their logits stay high and they win the argmax when the model is unsure.
#
# usage: bench/sampled_softmax_check.sh [BUILD_DIR]   (env: STEPS=400 FLOORS="32 0" NEGATIVES=1024
#        VOCAB=8192 DATA=/work/shared/data/corpus/tinyshakespeare.txt OUT=/tmp/corelm-sampled-check)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
CORELM="$BUILD/corelm"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DATA="${DATA:-$ROOT/../shared/data/corpus/tinyshakespeare.txt}"
STEPS="${STEPS:-400}"
FLOORS="${FLOORS:-32 0}"
NEGATIVES="${NEGATIVES:-1024}"
VOCAB="${VOCAB:-8192}"
OUT="${OUT:-/tmp/corelm-sampled-check}"
PIN="${PIN:-taskset -c 0}"
[ -x "$CORELM" ] || { echo "no corelm binary at $CORELM (give the build dir)" >&2; exit 2; }
[ -f "$DATA" ] || { echo "no data at $DATA (see /work/shared/data/MANIFEST.md)" >&2; exit 2; }
command -v taskset >/dev/null || PIN=""
rm -rf "$OUT" && mkdir -p "$OUT"

# A small llama-shaped model: the LM head (V x 128) dominates it, as in tiny.
cat > "$OUT/config.json" <<JSON
{"model_type": "llama", "vocab_size": $VOCAB, "hidden_size": 128, "intermediate_size": 384,
 "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true}
JSON
"$CORELM" tokenizer train --input "$DATA" --vocab-size "$VOCAB" --output "$OUT/tokenizer.json" --no-progress >&2
"$CORELM" tokenize --tokenizer "$OUT/tokenizer.json" --input "$DATA" --output "$OUT/tokens.bin" --no-progress >&2

COMMON=(--config "$OUT/config.json" --tokenizer "$OUT/tokenizer.json" --data "$OUT/tokens.bin" --steps "$STEPS"
        --batch 8 --seq 128 --lr 3e-3 --eval-every "$STEPS" --eval-batches 16 --sample-tokens 0 --save-every 0
        --threads 1 --seed 1 --no-progress)
RUNS=()
run() {  # name, extra args...
  local name="$1"; shift
  $PIN "$CORELM" train "${COMMON[@]}" --out "$OUT/$name" "$@" > "$OUT/$name.summary.json"
  RUNS+=("$name")
}
run full --loss full
for f in $FLOORS; do run "sampled_floor$f" --loss sampled --negatives "$NEGATIVES" --count-floor "$f"; done

"$PY" - "$OUT" "$NEGATIVES" "${RUNS[@]}" <<'PY'
import json, sys, pathlib
import numpy as np, torch
from transformers import LlamaForCausalLM
out, negatives, runs = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
side = json.loads((out / "tokens.bin.json").read_text())
dtype = np.uint16 if "16" in json.dumps(side) else np.uint32
ids = np.fromfile(out / "tokens.bin", dtype=dtype).astype(np.int64)
seq, vocab = 128, json.loads((out / "config.json").read_text())["vocab_size"]
val = max(int(len(ids) * 0.05), seq + 1)  # train::split_tokens with the default --val-fraction 0.05
train_ids, val_ids = ids[: len(ids) - val], ids[len(ids) - val :]
counts = np.bincount(train_ids, minlength=vocab)
rare, unseen = counts < 32, counts == 0
torch.set_num_threads(1)
report = {"data_tokens": int(len(ids)), "val_tokens": int(len(val_ids)), "vocab": vocab,
          "vocab_rare_lt32": int(rare.sum()), "vocab_unseen": int(unseen.sum()), "negatives": negatives, "runs": {}}
for name in runs:
    summary = json.loads((out / f"{name}.summary.json").read_text())
    model = LlamaForCausalLM.from_pretrained(out / name, torch_dtype=torch.float32).eval()
    n = argmax_rare = argmax_unseen = target_rare = correct = 0
    with torch.no_grad():
        for start in range(0, len(val_ids) - 1, seq):
            x = torch.tensor(val_ids[start : start + seq + 1])
            if len(x) < 2: break
            pred = model(x[:-1].unsqueeze(0)).logits[0].argmax(-1).numpy()
            tgt = x[1:].numpy()
            n += len(tgt); correct += int((pred == tgt).sum())
            argmax_rare += int(rare[pred].sum()); argmax_unseen += int(unseen[pred].sum())
            target_rare += int(rare[tgt].sum())
    report["runs"][name] = {"val_loss_full_softmax": summary["val_loss"], "train_loss": summary["train_loss"],
                            "train_tok_s": summary["tokens_per_s"], "val_positions": n,
                            "argmax_accuracy": correct / n, "argmax_rare_lt32_frac": argmax_rare / n,
                            "argmax_unseen_frac": argmax_unseen / n, "target_rare_lt32_frac": target_rare / n}
print(json.dumps(report, indent=1))
PY
