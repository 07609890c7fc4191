#!/usr/bin/env bash
# llama.cpp peer: the `tiny` shape with random weights, exported from corelm to GGUF, measured by
# llama.cpp's own tools at one thread on core 0, next to `corelm bench model` in the same run.
#   bench/llama_cpp_peer.sh [build-dir] [out-dir]
#     build-dir  holds the corelm binary (default build/release)
#     out-dir    results (default <build-dir>/bench-results): llama_cpp.json + a markdown table on stdout
# Environment: LLAMA_CPP_BIN (default build/llama.cpp/bin, made by bench/build_llama_cpp.sh),
#   LLAMA_PEER_DTYPES (GGUF weight types, default "bf16 q8_0 f32"), LLAMA_PEER_CPU (default 0).
# llama.cpp figures:
#   pp512       llama-bench -t 1 -p 512 -n 0: prompt tokens/s (logits of the last token only)
#   tg128       llama-bench -t 1 -p 0 -n 128: batch-1 decode tokens/s
#   batched B   llama-batched-bench -npp 1 -ntg 128 -npl B: generated tokens/s of B sequences
# Exits 0 with a message (and no JSON) when llama.cpp is not built: it is an optional peer.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(realpath -m "${1:-$here/build/release}")"
out="$(realpath -m "${2:-$build/bench-results}")"
llama_bin="${LLAMA_CPP_BIN:-$here/build/llama.cpp/bin}"
dtypes="${LLAMA_PEER_DTYPES:-bf16 q8_0 f32}"
cpu="${LLAMA_PEER_CPU:-0}"
corelm="$build/corelm"

for tool in llama-bench llama-batched-bench; do
  if [[ ! -x $llama_bin/$tool ]]; then
    echo "llama_cpp_peer: skipped: $llama_bin/$tool is missing (build it with bench/build_llama_cpp.sh, or scripts/setup --bench)"
    exit 0
  fi
done
[[ -x $corelm ]] || { echo "llama_cpp_peer: $corelm is missing (build the corelm target first)" >&2; exit 1; }
mkdir -p "$out"
work="$build/llama_cpp_peer"
mkdir -p "$work"

# The model: `tiny` preset, random weights with a KJV BPE (bench/random_tiny.sh), so llama.cpp
# finds a real vocabulary in the GGUF (corelm pads it to the model's 16384 ids). Cached in $work.
. "$here/bench/random_tiny.sh"
make_random_tiny "$corelm" "$here" "$work" "$work/model"
for dt in $dtypes; do
  [[ -f $work/tiny-$dt.gguf ]] && continue
  "$corelm" convert "$work/model" "$work/tiny-$dt.gguf.tmp" --to gguf --dtype "$dt" >/dev/null 2>&1 ||
    "$corelm" convert "$work/model" "$work/tiny-$dt.gguf.tmp" --to gguf --dtype "$dt"
  mv "$work/tiny-$dt.gguf.tmp" "$work/tiny-$dt.gguf"
done

# Runs "$@", writing "<elapsed s> <user s> <sys s>" to $1 when /usr/bin/time exists: on a shared
# machine (user + sys) / elapsed shows how much of the core a llama.cpp run actually had (corelm's
# JSON carries its own process-CPU-time rates).
timed() {
  local to="$1"
  shift
  if [[ -x /usr/bin/time ]]; then /usr/bin/time -f "%e %U %S" -o "$to" "$@"; else "$@"; fi
}

raw="$work/raw"
rm -rf "$raw"
mkdir -p "$raw"
uptime > "$raw/uptime_before.txt"
for dt in $dtypes; do
  gguf="$work/tiny-$dt.gguf"
  echo "llama_cpp_peer: llama.cpp $dt" >&2
  timed "$raw/time_bench_$dt.txt" taskset -c "$cpu" "$llama_bin/llama-bench" -m "$gguf" -t 1 -p 512 -n 128 -r 5 -o json \
    > "$raw/bench_$dt.json" 2> "$raw/bench_$dt.log"
  # Unified KV cache sized for B=32 rows of 1 + 128 tokens.
  timed "$raw/time_batched_$dt.txt" taskset -c "$cpu" "$llama_bin/llama-batched-bench" -m "$gguf" -t 1 -tb 1 -c 4160 -b 2048 -ub 512 \
    -npp 1 -ntg 128 -npl 16,32 --output-format jsonl > "$raw/batched_$dt.jsonl" 2> "$raw/batched_$dt.log"
done

echo "llama_cpp_peer: corelm bench model (bf16)" >&2
taskset -c "$cpu" "$corelm" bench model --preset tiny --threads 1 --no-train --json > "$raw/corelm_bf16.json"
taskset -c "$cpu" "$corelm" bench model --preset tiny --threads 1 --no-train --gen-batch 32 --json \
  > "$raw/corelm_bf16_b32.json"
# The int8 path, when this corelm has one (a corelm without it rejects the flag: then skipped).
if taskset -c "$cpu" "$corelm" bench model --preset tiny --threads 1 --no-train --precision int8 --json \
    > "$raw/corelm_int8.json" 2> "$raw/corelm_int8.log"; then
  echo "llama_cpp_peer: corelm bench model (int8)" >&2
  taskset -c "$cpu" "$corelm" bench model --preset tiny --threads 1 --no-train --precision int8 --gen-batch 32 \
    --json > "$raw/corelm_int8_b32.json"
else
  echo "llama_cpp_peer: corelm has no int8 path yet ($(head -n 1 "$raw/corelm_int8.log")): int8 column skipped" >&2
  rm -f "$raw/corelm_int8.json"
fi
uptime > "$raw/uptime_after.txt"

python3 "$here/bench/llama_cpp_report.py" "$raw" "$dtypes" "$out/llama_cpp.json"
