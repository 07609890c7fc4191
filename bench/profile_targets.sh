#!/usr/bin/env bash
# perf profiles of the issue-5 workloads that miss their targets (tiny preset, 1 thread, one core):
# bf16/int8 batch-1 decode, bf16/int8 scored, bf16 batched (B=16) generation, training with full and
# with sampled softmax.
#   bench/profile_targets.sh [build-dir] [out-dir]      (defaults: build/profile, BUILD/profiles)
# `corelm bench model` has no flag to run a single figure, so each run profiles one bench process
# (--gen-batch 1: both decode figures are batch 1; gen_bf16 keeps B=16; training runs full, then
# sampled softmax) and bench/profile_summary.py splits the samples by the bench function on the
# DWARF call stack.
# Per run: `perf stat` (its own run, no sampling overhead; its bench JSON gives the tok/s) and
# `perf record -g` (cpu-clock if the VM has no PMU). Writes into out-dir: machine.txt, events.json,
# memory_*.json + gemm*.json (L3 bandwidth, peaks, LM head alone), stat_<run>.txt, bench_<run>.json,
# phases_<run>.json, report_<workload>.txt (perf report --no-children over the workload's time
# window), summary.json; prints a markdown table. About 3-5 minutes (longer on a loaded machine).
# Environment: PROFILE_CPU (0), PROFILE_FREQ (Hz, 499), PROFILE_SECONDS (per inference figure, 1.5),
# PROFILE_TRAIN_STEPS (6), PROFILE_KEEP_DATA=1 keeps the perf.data files (~50-150 MB each).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(realpath -m "${1:-$here/build/profile}")"
out="$(realpath -m "${2:-$build/profiles}")"
corelm="$build/corelm"
summary="$here/bench/profile_summary.py"
cpu="${PROFILE_CPU:-0}"
freq="${PROFILE_FREQ:-499}"
secs="${PROFILE_SECONDS:-1.5}"
export PROFILE_TRAIN_STEPS="${PROFILE_TRAIN_STEPS:-6}"
[[ -x $corelm ]] || { echo "profile_targets: $corelm is missing (build the corelm_cli target)" >&2; exit 1; }
command -v perf > /dev/null || { echo "profile_targets: perf is not installed (Debian: linux-perf)" >&2; exit 1; }
mkdir -p "$out"

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "load: $(uptime)"
  lscpu | grep -E '^(Model name|Hypervisor vendor|L2 cache|L3 cache):'
  echo "flags: $(grep -m1 -o -wE 'avx2|fma|avx512f|avx512_vnni|avx512_bf16|amx_tile|amx_bf16|amx_int8|hypervisor' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "perf: $(perf --version); perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid)"
  echo "binary: $corelm ($(stat -c %y "$corelm")); tree: $(git -C "$here" rev-parse --short HEAD 2> /dev/null || echo '?')," \
       "$(git -C "$here" status --short -- src apps 2> /dev/null | wc -l) uncommitted files under src/ apps/"
} > "$out/machine.txt"
cat "$out/machine.txt" >&2

# Which hardware events this machine exposes to user space (VMs often expose none).
hw_events=(cycles instructions cache-references cache-misses LLC-loads LLC-load-misses L1-dcache-loads
           L1-dcache-load-misses branch-misses cycle_activity.stalls_l3_miss mem_load_retired.l3_miss
           mem_load_retired.l2_miss fp_arith_inst_retired.512b_packed_single)
available=() unavailable=()
for ev in "${hw_events[@]}"; do
  if perf stat -x, -e "$ev:u" true 2>&1 >/dev/null | grep -qE '^[0-9]+,'; then available+=("$ev:u"); else unavailable+=("$ev"); fi
done
python3 - "$out/events.json" "${available[*]:-}" "${unavailable[*]:-}" <<'EOF'
import json, sys
json.dump({"available": sys.argv[2].split(), "unavailable": sys.argv[3].split()}, open(sys.argv[1], "w"), indent=1)
EOF
echo "hardware events available: ${available[*]:-none}; unavailable: ${unavailable[*]:-none}" >&2
stat_events="task-clock,context-switches,cpu-migrations,page-faults"
[[ ${#available[@]} -gt 0 ]] && stat_events+=",$(IFS=,; echo "${available[*]}")"
record_event="cpu-clock:u"
[[ " ${available[*]:-} " == *" cycles:u "* ]] && record_event="cycles:u"

# Ceilings the derived figures are compared with: L3 read bandwidth and the kernel peaks.
# L3 read bandwidth swings between runs on this VM (25-48 GB/s at 16 MiB), so three runs; the
# summary takes the median of their 8, 16 and 32 MiB points.
for i in 1 2 3; do taskset -c "$cpu" "$corelm" bench memory --json --max-mib 32 --seconds 0.1 > "$out/memory_$i.json"; done
# The batch-1 LM head shape (M=1, K=hidden, N=vocab of tiny) alone: its kernel's bandwidth from L3;
# CORELM_ISA=avx512 selects the widening bf16 kernel the bf16 fast path uses (the default ISA here
# reports the vdpbf16ps one).
# Training GEMM shapes (B*T = 1024 rows by the tiny layers and LM head) alone, for the in-model rate.
taskset -c "$cpu" "$corelm" bench gemm --json --seconds 0.2 \
  --shapes "256,256,256;1,256,16384;1024,256,640;1024,640,256;1024,256,16384" > "$out/gemm.json"
CORELM_ISA=avx512 taskset -c "$cpu" "$corelm" bench gemm --json --shapes "1,256,16384" --seconds 0.2 \
  > "$out/gemm_widen.json"

declare -A run_args=(
  [infer_bf16]="--precision bf16 --no-train --gen-batch 1 --seconds $secs"
  [infer_int8]="--precision int8 --no-train --gen-batch 1 --seconds $secs"
  [gen_bf16]="--precision bf16 --no-train --gen-batch 16 --seconds $secs"
  [train]="--precision bf16 --gen-batch 1 --seconds 0.05 --train-steps $PROFILE_TRAIN_STEPS"
)
for run in infer_bf16 infer_int8 gen_bf16 train; do
  # shellcheck disable=SC2206
  args=(bench model --preset tiny --threads 1 --json ${run_args[$run]})
  echo "== $run: corelm ${args[*]}" >&2
  perf stat -x, -e "$stat_events" -o "$out/stat_$run.txt" -- taskset -c "$cpu" "$corelm" "${args[@]}" \
    > "$out/bench_$run.json"
  data="$out/$run.perf.data"
  perf record -q -e "$record_event" -F "$freq" --call-graph dwarf,12288 -o "$data" -- \
    taskset -c "$cpu" "$corelm" "${args[@]}" > "$out/bench_${run}_recorded.json"
  perf script -i "$data" -F time,period,ip,sym --no-inline 2> /dev/null > "$out/$run.script.txt"
  python3 "$summary" split "$run" "$out/$run.script.txt" "$out/phases_$run.json" >&2
  rm -f "$out/$run.script.txt"
  # perf report over each workload's time window (the window also holds the few samples of bench
  # bookkeeping between repeats; phases_<run>.json counts only samples under the workload's frame).
  python3 -c 'import json,sys
for k, v in json.load(open(sys.argv[1]))["phases"].items():
    if v["window"]: print(k, "%.6f,%.6f" % tuple(v["window"]))' "$out/phases_$run.json" |
    while read -r name window; do
      {
        echo "# corelm ${args[*]}  (taskset -c $cpu; event $record_event, $freq Hz; workload $name, window $window)"
        perf report -i "$data" --no-children --percent-limit 2 --stdio -g none --time "$window" 2> /dev/null |
          grep -vE '^#( |$)|^$' || true
      } > "$out/report_$name.txt"
    done
  [[ ${PROFILE_KEEP_DATA:-0} == 1 ]] || rm -f "$data" "$data.old"
done

echo "load after: $(uptime)" >> "$out/machine.txt"
python3 "$summary" summary "$out"
