#!/usr/bin/env bash
# Serving load benchmark: `corelm serve` against llama.cpp's llama-server (the llama.cpp that
# llama-cpp-python==0.3.2 vendors, built by bench/build_llama_cpp.sh) on the same GGUF, the same
# cores and threads, the same number of slots, under the same bounded loopback load
# (bench/serve_load.py: C concurrent streaming clients, R requests, M tokens each, temperature 0).
#   bench/serve_bench.sh [build-dir] [out-dir]
#     build-dir  holds the corelm binary (default build/release)
#     out-dir    results (default <build-dir>/bench-results): serve_llama.json, serve_corelm.json,
#                serve_bench.json (both plus the ratios), server logs
# Environment:
#   SERVER_CPUS   cores both servers are pinned to (taskset -c; default 0)
#   THREADS       threads of each server (default: the number of SERVER_CPUS)
#   LOAD_CPUS     cores of the load generator (default: the first core not in SERVER_CPUS, else none)
#   SLOTS (64) CTX (512 per slot) CLIENTS (64) REQUESTS (256) MAX_TOKENS (64) SEED (1)
#   DTYPE         GGUF weight type (bf16 | f32 | q8_0; default bf16)
#   MODEL_SRC     model to convert (default /work/pretrained/tiny-corpus-17M when present, else a
#                 random-weight `tiny` from bench/random_tiny.sh, also with MODEL_SRC=random);
#                 GGUF=path skips the conversion
#   ONLY          llama | corelm: run one server only (the other's JSON already in out-dir, if any,
#                 still goes into serve_bench.json and the ratios)
#   LLAMA_CPP_BIN (default build/llama.cpp/bin)   NICE (default 10)
# llama-server: -m GGUF -t T -tb T -np SLOTS -c CTX*SLOTS -cb (its context is split over the slots).
# corelm:       corelm serve --model GGUF --threads T --slots SLOTS --ctx CTX --port 0.
# Loopback only; every server started here is killed on exit.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(realpath -m "${1:-$here/build/release}")"
out="$(realpath -m "${2:-$build/bench-results}")"
llama_bin="${LLAMA_CPP_BIN:-$here/build/llama.cpp/bin}"
corelm="$build/corelm"
python="$here/.venv/bin/python"
[[ -x $python ]] || python=python3
server_cpus="${SERVER_CPUS:-0}"
slots="${SLOTS:-64}"
ctx="${CTX:-512}"
clients="${CLIENTS:-64}"
requests="${REQUESTS:-256}"
max_tokens="${MAX_TOKENS:-64}"
seed="${SEED:-1}"
dtype="${DTYPE:-bf16}"
only="${ONLY:-}"
nice_n="${NICE:-10}"

# Expands a taskset list (0,2-3) into one core per line.
expand_cpus() {
  local part
  IFS=, read -ra parts <<< "$1"
  for part in "${parts[@]}"; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}
threads="${THREADS:-$(expand_cpus "$server_cpus" | wc -l)}"
if [[ -z ${LOAD_CPUS+x} ]]; then
  LOAD_CPUS=""
  for ((c = 0; c < $(nproc); c++)); do
    expand_cpus "$server_cpus" | grep -qx "$c" || { LOAD_CPUS=$c; break; }
  done
fi
load_pin=()
[[ -n $LOAD_CPUS ]] && load_pin=(taskset -c "$LOAD_CPUS")

[[ $only == corelm || -x $llama_bin/llama-server ]] ||
  { echo "serve_bench: $llama_bin/llama-server is missing (bench/build_llama_cpp.sh builds it)" >&2; exit 1; }
[[ ( $only == llama && -n ${GGUF:-} ) || -x $corelm ]] ||
  { echo "serve_bench: $corelm is missing (build the corelm_cli target first)" >&2; exit 1; }
mkdir -p "$out"
work="$build/serve_bench"
mkdir -p "$work"

# The model, converted once and cached in $work.
gguf="${GGUF:-}"
if [[ -z $gguf ]]; then
  src="${MODEL_SRC:-}"
  if [[ -z $src && -f /work/pretrained/tiny-corpus-17M/config.json ]]; then src=/work/pretrained/tiny-corpus-17M; fi
  if [[ -z $src || $src == random ]]; then
    src="$work/random-tiny"
    . "$here/bench/random_tiny.sh"
    make_random_tiny "$corelm" "$here" "$work" "$src"
  fi
  gguf="$work/$(basename "$src")-$dtype.gguf"
  if [[ ! -f $gguf ]]; then
    "$corelm" convert "$src" "$gguf.tmp" --to gguf --dtype "$dtype" > "$work/convert.log" 2>&1 ||
      { cat "$work/convert.log" >&2; exit 1; }
    mv "$gguf.tmp" "$gguf"
  fi
fi
[[ -f $gguf ]] || { echo "serve_bench: no GGUF at $gguf" >&2; exit 1; }

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap cleanup EXIT

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits (up to 120 s) for GET $1/health to answer 200 while pid $2 lives.
wait_health() {
  local url="$1" pid="$2" i
  for ((i = 0; i < 1200; i++)); do
    kill -0 "$pid" 2>/dev/null || return 1
    if "$python" - "$url" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/health", timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
    sleep 0.1
  done
  return 1
}

# Runs the load against $1 (url) with api $2, server pid $3, writing $4.
load() {
  "${load_pin[@]}" nice -n "$nice_n" "$python" "$here/bench/serve_load.py" --url "$1" --api "$2" --pid "$3" \
    --clients "$clients" --requests "$requests" --max-tokens "$max_tokens" --seed "$seed" --out "$4" ||
    echo "serve_bench: the load against $1 had errors (see $4)" >&2
}

stop_server() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

uptime > "$out/serve_uptime_before.txt"
if [[ $only != corelm ]]; then
  port=$(free_port)
  echo "serve_bench: llama-server on cores $server_cpus, $threads thread(s), $slots slots, port $port" >&2
  taskset -c "$server_cpus" nice -n "$nice_n" "$llama_bin/llama-server" -m "$gguf" -t "$threads" -tb "$threads" \
    -np "$slots" -c $((ctx * slots)) -cb --host 127.0.0.1 --port "$port" > "$out/serve_llama.log" 2>&1 &
  lpid=$!
  pids+=("$lpid")
  wait_health "http://127.0.0.1:$port" "$lpid" ||
    { tail -n 20 "$out/serve_llama.log" >&2; echo "serve_bench: llama-server did not get ready" >&2; exit 1; }
  rm -f "$out/serve_llama.json"
  load "http://127.0.0.1:$port" llama "$lpid" "$out/serve_llama.json"
  stop_server "$lpid"
fi
if [[ $only != llama ]]; then
  echo "serve_bench: corelm serve on cores $server_cpus, $threads thread(s), $slots slots" >&2
  taskset -c "$server_cpus" nice -n "$nice_n" "$corelm" serve --model "$gguf" --host 127.0.0.1 --port 0 \
    --threads "$threads" --slots "$slots" --ctx "$ctx" > "$out/serve_corelm.log" 2>&1 &
  cpid=$!
  pids+=("$cpid")
  url=""
  for ((i = 0; i < 600; i++)); do
    kill -0 "$cpid" 2>/dev/null || break
    url=$(grep -o -m1 'listening on http://[0-9.]*:[0-9]*' "$out/serve_corelm.log" | sed 's/^listening on //' || true)
    [[ -z $url ]] || break
    sleep 0.1
  done
  [[ -n $url ]] && wait_health "$url" "$cpid" ||
    { tail -n 20 "$out/serve_corelm.log" >&2; echo "serve_bench: corelm serve did not get ready" >&2; exit 1; }
  rm -f "$out/serve_corelm.json"
  load "$url" openai "$cpid" "$out/serve_corelm.json"
  stop_server "$cpid"
fi
uptime > "$out/serve_uptime_after.txt"

"$python" - "$out" "$gguf" "$server_cpus" "$threads" "$slots" "$ctx" <<'EOF'
import json, os, sys
out, gguf, cpus, threads, slots, ctx = sys.argv[1:]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
llama, corelm = load("serve_llama.json"), load("serve_corelm.json")
res = {"gguf": gguf, "server_cpus": cpus, "threads": int(threads), "slots": int(slots), "ctx_per_slot": int(ctx),
       "uptime_before": open(os.path.join(out, "serve_uptime_before.txt")).read().strip(),
       "uptime_after": open(os.path.join(out, "serve_uptime_after.txt")).read().strip(),
       "llama_server": llama, "corelm": corelm}
if llama and corelm:
    def ratio(key, invert=False):
        a, b = corelm.get(key), llama.get(key)
        if not a or not b:
            return None
        return round((b / a) if invert else (a / b), 3)
    # > 1 means corelm is better for every ratio below.
    res["ratios_corelm_over_llama"] = {
        "generated_tok_s": ratio("generated_tok_s"),
        "ttft_p50_llama_over_corelm": ratio("ttft_ms_p50", True),
        "ttft_p99_llama_over_corelm": ratio("ttft_ms_p99", True),
        "itl_p99_llama_over_corelm": ratio("itl_ms_p99", True),
        "tpot_p50_llama_over_corelm": ratio("tpot_ms_p50", True),
        "tpot_p99_llama_over_corelm": ratio("tpot_ms_p99", True),
        "peak_rss_llama_over_corelm": ratio("peak_rss_mb", True),
    }
with open(os.path.join(out, "serve_bench.json"), "w") as f:
    json.dump(res, f, indent=1)
print(json.dumps(res, indent=1))
EOF
