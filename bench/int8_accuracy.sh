#!/usr/bin/env bash
# Perplexity of one model under each inference precision (f32 reference, bf16, int8 and q4 fast
# paths) on the same text, and the delta vs f32: the accuracy cost of --precision int8 (issue 5)
# and --precision q4 (issue 18).
#
#   bench/int8_accuracy.sh [CORELM] [MODEL] [TOKENIZER] [TEXT] [PARAGRAPHS]
# Defaults: build/release/corelm (or $CORELM), the pretrained llama2.c stories260K + tok512 from
# ../shared/data, and the whole of tinystories_valid_head.txt (PARAGRAPHS > 0: only the first that
# many non-empty paragraphs). Prints one JSON object per precision, then a markdown table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
corelm=${1:-${CORELM:-$root/build/release/corelm}}
data=$root/../shared/data
model=${2:-$data/models/stories260K/stories260K.bin}
tokenizer=${3:-$data/models/stories260K/tok512.bin}
text=${4:-$data/corpus/tinystories_valid_head.txt}
paragraphs=${5:-0}
for f in "$corelm" "$model" "$tokenizer" "$text"; do
  [[ -e $f ]] || { echo "int8_accuracy: $f not found" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ((paragraphs > 0)); then
  awk -v n="$paragraphs" 'NF && kept < n { print; ++kept }' "$text" >"$work/text.txt"
else
  cp "$text" "$work/text.txt"
fi
tok_args=()
[[ $model == *.bin ]] && tok_args=(--tokenizer "$tokenizer")
for precision in f32 bf16 int8 q4; do
  "$corelm" eval --model "$model" "${tok_args[@]}" --data "$work/text.txt" --precision "$precision" --threads 1 \
    --json >"$work/$precision.jsonl"
done
python3 - "$work" "$model" "$paragraphs" <<'PY'
import json, math, sys
work, model, paragraphs = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = {}
for p in ("f32", "bf16", "int8", "q4"):
    parts = [json.loads(line) for line in open(f"{work}/{p}.jsonl") if line.strip()]
    tokens = sum(x["tokens"] for x in parts)
    loss = sum(x["mean_loss"] * x["tokens"] for x in parts) / tokens
    rows[p] = {"precision": p, "tokens": tokens, "mean_loss": loss, "perplexity": math.exp(loss)}
base = rows["f32"]["perplexity"]
for r in rows.values():
    r["ppl_delta_vs_f32"] = r["perplexity"] - base
    r["ppl_delta_pct"] = 100 * (r["perplexity"] / base - 1)
    print(json.dumps({"model": model, "paragraphs": paragraphs, **r}))
print("\n| precision | tokens | mean loss | perplexity | delta vs f32 |\n|---|---|---|---|---|")
for r in rows.values():
    print(f"| {r['precision']} | {r['tokens']} | {r['mean_loss']:.5f} | {r['perplexity']:.4f} | "
          f"{r['ppl_delta_vs_f32']:+.4f} ({r['ppl_delta_pct']:+.2f}%) |")
PY
