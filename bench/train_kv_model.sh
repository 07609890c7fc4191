#!/usr/bin/env bash
# Trains the small Llama of docs/BENCHMARKS.md "KV cache types" (4 layers, hidden 128, 2 heads x
# head_dim 64, 1 kv head, a 512-token byte-level BPE trained on the data) on the first 734,000
# bytes of tinystories_valid_head.txt (cut at the next line end), keeps the rest as the held-out
# text, and exports the model to GGUF (f32) so llama.cpp can run the same weights.
#   bench/train_kv_model.sh [out-dir] [build-dir]     (defaults build/kv_model, build/release)
# Writes OUT/model/ (corelm checkpoint), OUT/model-f32.gguf, OUT/train.txt, OUT/heldout.txt.
# Environment: CORPUS (the text), STEPS (400), THREADS (1), FFN (intermediate size, 384).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$here/build/kv_model}")"
build="${2:-$here/build/release}"
corelm="$build/corelm"
corpus="${CORPUS:-$here/../shared/data/corpus/tinystories_valid_head.txt}"
[[ -f $corpus ]] || corpus=/work/shared/data/corpus/tinystories_valid_head.txt
mkdir -p "$out"
# The split: training text first, then the held-out tail that no training step has seen.
python3 - "$corpus" "$out/train.txt" "$out/heldout.txt" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
cut = data.index(b"\n", 734000) + 1
open(sys.argv[2], "wb").write(data[:cut]); open(sys.argv[3], "wb").write(data[cut:])
print(f"train_kv_model: {cut:,} training bytes, {len(data) - cut:,} held out", file=sys.stderr)
PY
cat > "$out/config.json" <<JSON
{"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": ${FFN:-384},
 "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
 "max_position_embeddings": 512, "tie_word_embeddings": true}
JSON
pin=(); command -v taskset >/dev/null && pin=(taskset -c 0)
rm -rf "$out/model"
"${pin[@]}" "$corelm" train --config "$out/config.json" --data "$out/train.txt" --out "$out/model" \
  --steps "${STEPS:-400}" --batch 8 --seq 128 --threads "${THREADS:-1}" --seed 0 --save-every 0 \
  --keep-checkpoints 1 --sample-tokens 0 --no-progress > "$out/train_summary.json"
"$corelm" convert "$out/model" "$out/model-f32.gguf" --dtype f32 >&2
cat "$out/train_summary.json"
