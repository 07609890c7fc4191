#!/usr/bin/env bash
# Persistent-queue benchmarks (issue 16): what the queue costs per request, and a million queued
# prompts through one `corelm serve`.
#   bench/queue_bench.sh [build-dir] [out-dir]
#     build-dir  holds the corelm binary (default build/release)
#     out-dir    results (default <build-dir>/bench-results/queue): overhead.json, load.json, logs
# Phases (ONLY=overhead | load to run one):
#   overhead  N prompts "n=<i>:" at max_tokens MAX_TOKENS, temperature 0 (the same tokens on every
#             path), --threads 1, pinned to SERVER_CPUS:
#               run_batch_full    corelm run batch (journal in queue.sqlite, fsync per ack group)
#               run_batch_normal  the same with --queue-sync normal (survives kill -9, not power loss)
#               run_batch_direct  corelm run batch --no-queue: the same execution core and scheduler,
#                                 results in memory (the baseline: only the queue is missing)
#               generate          corelm generate --prompt-file (no scheduler, batches of SLOTS)
#               serve_queue       corelm serve --state-dir + /v1/generate (bench/queue_load.py)
#             ratios are tok/s of each path over run_batch_direct; queue_us_per_request =
#             (wall - wall of run_batch_direct) / N.
#   load      LOAD_TOTAL (1,000,000) prompts via /v1/generate in chunks of 1,000, max_tokens 1..4,
#             drained for at most DRAIN_SECONDS (600; the rest is extrapolated, and said so):
#             peak RSS, DB size after enqueue and drain, enqueue and drain rates.
# Also (with perf): perf_attribution, the queue's CPU share from perf samples of a journaled and a
# --no-queue run of the first PERF_ROWS (5000) rows: insensitive to the machine's other load.
# Environment: REPS (3: interleaved repetitions of each offline path, the fastest kept) SKIP_SERVE (set: overhead without the serve_queue path) N (20000) MAX_TOKENS (8) SLOTS (16) SERVER_CPUS (0) LOAD_CPUS (1) NICE (10)
#   LOAD_TOTAL (1000000) DRAIN_SECONDS (600) LOAD_SYNC (normal)
#   MODEL (default /work/pretrained/tiny-corpus when present, else a random-weight `tiny` from
#   bench/random_tiny.sh, cached in <build-dir>/queue_bench)
# Loopback only; every server started here is killed on exit. Prints overhead.json / load.json.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(realpath -m "${1:-$here/build/release}")"
out="$(realpath -m "${2:-$build/bench-results/queue}")"
corelm="$build/corelm"
python="$here/.venv/bin/python"
[[ -x $python ]] || python=python3
n="${N:-20000}"
max_tokens="${MAX_TOKENS:-8}"
slots="${SLOTS:-16}"
server_cpus="${SERVER_CPUS:-0}"
load_cpus="${LOAD_CPUS:-1}"
nice_n="${NICE:-10}"
load_total="${LOAD_TOTAL:-1000000}"
drain_seconds="${DRAIN_SECONDS:-600}"
load_sync="${LOAD_SYNC:-normal}"
only="${ONLY:-}"
reps="${REPS:-3}"
work="$build/queue_bench"
mkdir -p "$out" "$work"
[[ -x $corelm ]] || { echo "queue_bench: $corelm not found (build corelm_cli first)" >&2; exit 1; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
stop_server() { kill -9 "$srv_pid" 2>/dev/null || true; wait "$srv_pid" 2>/dev/null || true; }
trap cleanup EXIT

model="${MODEL:-}"
if [[ -z $model && -f /work/pretrained/tiny-corpus/config.json ]]; then model=/work/pretrained/tiny-corpus; fi
if [[ -z $model ]]; then
  model="$work/model"
  . "$here/bench/random_tiny.sh"
  make_random_tiny "$corelm" "$here" "$work" "$model"
fi
model_id="$(basename "$model")"
model_id="${model_id%.gguf}"
run_pinned() { nice -n "$nice_n" taskset -c "$server_cpus" "$@"; }
now() { date +%s.%N; }

# `corelm serve` on a free port with a state dir; sets srv_pid and srv_port.
start_server() {
  local state="$1" log="$2"; shift 2
  rm -rf "$state"; mkdir -p "$state"
  # Not through run_pinned: `func &` forks a subshell, and $! would be that shell, not the server
  # (nice and taskset exec, so $! here is the server's own pid: its RSS, its kill).
  nice -n "$nice_n" taskset -c "$server_cpus" "$corelm" serve --model "$model" --port 0 --threads 1 --slots "$slots" \
    --state-dir "$state" "$@" >"$log" 2>&1 &
  srv_pid=$!
  pids+=("$srv_pid")
  srv_port=""
  for _ in $(seq 600); do
    srv_port="$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://')" || true
    [[ -n $srv_port ]] && curl -sf "http://127.0.0.1:$srv_port/health" >/dev/null 2>&1 && return 0
    kill -0 "$srv_pid" 2>/dev/null || { cat "$log" >&2; return 1; }
    sleep 0.1
  done
  echo "queue_bench: the server did not become ready" >&2; return 1
}

overhead() {
  local d="$work/overhead"
  rm -rf "$d"; mkdir -p "$d"
  "$python" - "$n" "$max_tokens" "$d" <<'EOF'
import json, sys
n, m, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with open(f"{d}/in.jsonl", "w") as b, open(f"{d}/prompts.txt", "w") as p:
    for i in range(n):
        b.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": f"n={i}:", "max_tokens": m, "temperature": 0}}) + "\n")
        p.write(f"n={i}:\n")
EOF
  local load_before; load_before="$(uptime)"
  # Interleaved repetitions (full, normal, direct, generate, full, ...), the fastest of each kept:
  # on a shared machine the other load comes and goes, and the minimum is the least disturbed.
  local rep
  for ((rep = 0; rep < reps; rep++)); do
    for mode in full normal direct; do
      local extra=(--queue-sync "$mode")
      [[ $mode == direct ]] && extra=(--no-queue)
      rm -rf "$d/rb_$mode"
      local s0; s0="$(now)"
      run_pinned /usr/bin/time -o "$d/rb_${mode}_cpu.$rep.json" -f '{"user": %U, "sys": %S}' "$corelm" run batch --model "$model" --input "$d/in.jsonl" --out "$d/rb_$mode" --threads 1 \
        --slots "$slots" "${extra[@]}" --json >"$d/rb_$mode.$rep.json" 2>"$d/rb_$mode.log"
      echo "{\"seconds\": $("$python" -c "print($(now) - $s0)")}" >"$d/rb_${mode}_wall.$rep.json"
    done
    local t0; t0="$(now)"
    run_pinned /usr/bin/time -o "$d/generate_cpu.$rep.json" -f '{"user": %U, "sys": %S}' "$corelm" generate --model "$model" --prompt-file "$d/prompts.txt" --batch-size "$slots" -n "$max_tokens" \
      --greedy --threads 1 --json >"$d/generate.jsonl" 2>"$d/generate.log"
    echo "{\"seconds\": $("$python" -c "print($(now) - $t0)")}" >"$d/generate_wall.$rep.json"
  done
  # Load-insensitive attribution: perf samples of one journaled and one --no-queue run of the same
  # first PERF_ROWS rows. The model's own cycles (the corelm binary) are the same work in both, so
  # the ratio of their shares is the queue's CPU cost (SQLite, its syscalls, the extra copies),
  # however busy the machine is. Skipped without perf.
  rm -f "$d/perf_shares.json"
  if command -v perf >/dev/null 2>&1; then
    head -n "${PERF_ROWS:-5000}" "$d/in.jsonl" >"$d/perf_in.jsonl"
    local pm
    for pm in normal direct; do
      local pextra=(--queue-sync normal)
      [[ $pm == direct ]] && pextra=(--no-queue)
      rm -rf "$d/perf_$pm"
      if run_pinned perf record -F 2000 -o "$d/perf_$pm.data" "$corelm" run batch --model "$model" \
          --input "$d/perf_in.jsonl" --out "$d/perf_$pm" --threads 1 --slots "$slots" "${pextra[@]}" >/dev/null 2>&1; then
        perf report -i "$d/perf_$pm.data" --no-children --sort dso -g none 2>/dev/null |
          "$python" -c 'import json,sys; print(json.dumps({l.split()[1]: float(l.split()[0].rstrip("%")) for l in sys.stdin if l.strip() and not l.startswith("#") and "%" in l}))' \
          >"$d/perf_$pm.json"
      fi
    done
  fi
  if [[ -z ${SKIP_SERVE:-} ]]; then
    start_server "$d/state" "$d/serve.log" --queue-sync full
    nice -n "$nice_n" taskset -c "$load_cpus" "$python" "$here/bench/queue_load.py" --url "http://127.0.0.1:$srv_port" \
      --pid "$srv_pid" --state-dir "$d/state" --total "$n" --chunk 1000 --max-tokens "$max_tokens" --fixed-max-tokens \
      --count-tokens --drain-seconds 600 --model "$model_id" >"$d/serve_queue.json"
    stop_server
  else
    rm -f "$d/serve_queue.json"
  fi
  "$python" - "$d" "$n" "$load_before" "$(uptime)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" "$model" \
    "$slots" "$max_tokens" >"$out/overhead.json" <<'EOF'
import json, os, sys
d, n = sys.argv[1], int(sys.argv[2])
import glob
def fastest(pattern):
    return min(json.load(open(f))["seconds"] for f in glob.glob(f"{d}/{pattern}"))
rb = {m: json.load(open(sorted(glob.glob(f"{d}/rb_{m}.*.json"))[0])) for m in ("full", "normal", "direct")}
wall = {m: fastest(f"rb_{m}_wall.*.json") for m in ("full", "normal", "direct")}
reps = len(glob.glob(f"{d}/generate_wall.*.json"))
gen = [json.loads(l) for l in open(f"{d}/generate.jsonl") if l.strip()]
gen_wall = fastest("generate_wall.*.json")
import os
sq = json.load(open(f"{d}/serve_queue.json")) if os.path.exists(f"{d}/serve_queue.json") else None
# Whole-process wall times (validation, enqueue, model load, run, output files): the model load is
# the same on every path, the queue's work (enqueue, leases, acks, reading results back) is not.
base_s, base_tok = wall["direct"], rb["direct"]["completion_tokens"]
def path(sec, tok):
    return {"wall_s": round(sec, 3), "completion_tokens": tok, "tokens_per_s": round(tok / sec, 1),
            "ratio_vs_direct": round((tok / sec) / (base_tok / base_s), 4),
            "queue_us_per_request": round((sec - base_s) / n * 1e6, 1)}
# CPU seconds (user + sys) of the process: what the queue's work costs on the one core, much less
# disturbed by the other load of a shared machine than wall time (fsync waits are not CPU: they
# overlap with decoding, up to slots + max(slots, 64) rows being in flight).
def cpu(pattern):
    return min(sum(json.load(open(f)).values()) for f in glob.glob(f"{d}/{pattern}"))
cpus = {m: cpu(f"rb_{m}_cpu.*.json") for m in ("full", "normal", "direct")}
res = {}
for m in ("full", "normal", "direct"):
    res[f"run_batch_{m}"] = path(wall[m], rb[m]["completion_tokens"])
    res[f"run_batch_{m}"]["cpu_s"] = round(cpus[m], 3)
    res[f"run_batch_{m}"]["cpu_ratio_vs_direct"] = round(cpus[m] / cpus["direct"], 4)
    res[f"run_batch_{m}"]["queue_cpu_us_per_request"] = round((cpus[m] - cpus["direct"]) / n * 1e6, 1)
    res[f"run_batch_{m}"]["run_phase_s"] = round(min(json.load(open(f))["seconds"] for f in glob.glob(f"{d}/rb_{m}.*.json")), 3)
gtok = sum(g.get("tokens", 0) if isinstance(g.get("tokens"), int) else len(g.get("tokens", [])) for g in gen)
perf = {}
if os.path.exists(f"{d}/perf_normal.json") and os.path.exists(f"{d}/perf_direct.json"):
    q, b = json.load(open(f"{d}/perf_normal.json")), json.load(open(f"{d}/perf_direct.json"))
    model_q, model_b = q.get("corelm", 0), b.get("corelm", 0)
    if model_q > 0:
        ratio = model_b / model_q  # total cycles of the journaled run over the baseline's
        per_req_us = cpus["direct"] / n * 1e6
        perf = {"rows": sum(1 for _ in open(f"{d}/perf_in.jsonl")), "dso_share_queue_run": q,
                "dso_share_direct_run": b, "cpu_ratio_vs_direct": round(ratio, 4),
                "queue_cpu_us_per_request": round((ratio - 1) * per_req_us, 1),
                "note": "perf sampling: the model's cycles (corelm) are equal work in both runs, so "
                        "share(direct)/share(queue) is the journaled run's total CPU over the baseline's; "
                        "us per request = (ratio - 1) x the baseline's CPU seconds per request"}
res["generate"] = path(gen_wall, gtok)
res["generate"]["cpu_s"] = round(cpu("generate_cpu.*.json"), 3)
res["generate"]["note"] = "wall time of the process, model load included; no scheduler"
if sq:
    res["serve_queue"] = path(sq["end_to_end_s"], sq.get("completion_tokens", 0))
    res["serve_queue"]["note"] = "submit of all prompts via /v1/generate to the last row done, HTTP included"
    if "server_cpu_s" in sq:
        res["serve_queue"]["cpu_s"] = sq["server_cpu_s"]
        res["serve_queue"]["note"] += "; cpu_s: the server process during that time (no model load)"
print(json.dumps({"bench": "queue_overhead", "n": n, "reps_fastest_of": reps, "model": sys.argv[6], "slots": int(sys.argv[7]),
                  "max_tokens": int(sys.argv[8]), "threads": 1, "cpu": sys.argv[5].strip(),
                  "uptime_before": sys.argv[3].strip(), "uptime_after": sys.argv[4].strip(), "paths": res,
                  "perf_attribution": perf}, indent=1))
EOF
  cat "$out/overhead.json"
}

load() {
  local d="$work/load"
  rm -rf "$d"; mkdir -p "$d"
  local load_before; load_before="$(uptime)"
  start_server "$d/state" "$d/serve.log" --queue-sync "$load_sync" --max-queued $((load_total + 1000))
  nice -n "$nice_n" taskset -c "$load_cpus" "$python" "$here/bench/queue_load.py" --url "http://127.0.0.1:$srv_port" \
    --pid "$srv_pid" --state-dir "$d/state" --total "$load_total" --chunk 1000 --max-tokens 4 \
    --drain-seconds "$drain_seconds" --model "$model_id" >"$d/load.json"
  stop_server
  "$python" - "$d/load.json" "$load_before" "$(uptime)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" "$model" \
    "$slots" "$load_sync" >"$out/load.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
r.update({"bench": "queue_load", "model": sys.argv[5], "slots": int(sys.argv[6]), "queue_sync": sys.argv[7],
          "threads": 1, "cpu": sys.argv[4].strip(), "uptime_before": sys.argv[2].strip(),
          "uptime_after": sys.argv[3].strip()})
print(json.dumps(r, indent=1))
EOF
  cat "$out/load.json"
}

[[ -z $only || $only == overhead ]] && overhead
[[ -z $only || $only == load ]] && load
exit 0
