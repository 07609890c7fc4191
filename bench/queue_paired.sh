#!/usr/bin/env bash
# The queue's share of `corelm run batch`, measured as paired ratios (issue 16):
#
#   bench/queue_paired.sh MODEL [NAME=CORELM_BINARY ...]      (default: cur=build/release/corelm)
#
# For each repetition and each binary, one journaled run (`--queue-sync full`) and one `--no-queue`
# run of the same N prompts ("n=<i>:", MAX_TOKENS tokens, temperature 0, --slots SLOTS, one
# thread), back to back and pinned to core CPU; the ratio full / no-queue of each pair is taken
# (CPU = user + sys of the process, and wall), and the median over the repetitions is reported.
# A pair shares the minute it ran in, so the other load on the machine moves both of its runs; the
# fastest-of-N figures of bench/queue_bench.sh pick single lucky runs and move by several percent.
# Environment: N (5000), MAX_TOKENS (8), SLOTS (16), REPS (10), CPU (0), WORK (a temporary folder).
# Prints one JSON object: per binary the median CPU and wall ratios, their range, and the median
# CPU difference per request in µs.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL [NAME=CORELM_BINARY ...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
model=$1; shift
bins=("$@")
[[ ${#bins[@]} -gt 0 ]] || bins=("cur=$here/build/release/corelm")
n=${N:-5000} max_tokens=${MAX_TOKENS:-8} slots=${SLOTS:-16} reps=${REPS:-10} cpu=${CPU:-0}
for b in "${bins[@]}"; do
  [[ $b == *=* && -x ${b#*=} ]] || { echo "queue_paired: '$b' is not NAME=EXECUTABLE" >&2; exit 2; }
done
[[ -e $model ]] || { echo "queue_paired: model $model not found" >&2; exit 2; }
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
python3 - "$n" "$max_tokens" "$work/in.jsonl" <<'PY'
import json, sys
n, m, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": f"n={i}:", "max_tokens": m, "temperature": 0}}) + "\n")
PY
: > "$work/runs.txt"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((rep = 1; rep <= reps; rep++)); do
  for b in "${bins[@]}"; do
    name=${b%%=*} bin=${b#*=}
    for mode in full direct; do
      extra=(--queue-sync full)
      [[ $mode == direct ]] && extra=(--no-queue)
      out="$work/out_${name}_$mode"
      rm -rf "$out"
      s0=$(date +%s.%N)
      taskset -c "$cpu" /usr/bin/time -f "%U %S" -o "$work/time.txt" "$bin" run batch --model "$model" \
        --input "$work/in.jsonl" --out "$out" --threads 1 --slots "$slots" "${extra[@]}" --json > /dev/null 2> "$work/run.log" ||
        { echo "queue_paired: $name $mode failed:" >&2; tail -5 "$work/run.log" >&2; exit 1; }
      s1=$(date +%s.%N)
      echo "$rep $name $mode $(cat "$work/time.txt") $(python3 -c "print($s1 - $s0)")" >> "$work/runs.txt"
      rm -rf "$out"
    done
  done
done
python3 - "$work/runs.txt" "$n" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" "$model" "$max_tokens" "$slots" <<'PY'
import collections, json, statistics as st, sys
path, n, load_before, load_after, model, max_tokens, slots = sys.argv[1:]
n = int(n)
runs = collections.defaultdict(dict)
for line in open(path):
    rep, name, mode, user, sys_s, wall = line.split()
    runs[name].setdefault(mode, []).append((float(user) + float(sys_s), float(wall)))
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][:1]
out = {"bench": "queue_paired", "model": model, "n": n, "max_tokens": int(max_tokens), "slots": int(slots),
       "cpu": cpu[0] if cpu else "?", "load_before": load_before, "load_after": load_after, "binaries": {}}
for name, modes in runs.items():
    full, direct = modes["full"], modes["direct"]
    cr = [f[0] / d[0] for f, d in zip(full, direct)]
    wr = [f[1] / d[1] for f, d in zip(full, direct)]
    out["binaries"][name] = {
        "reps": len(cr), "cpu_ratio_median": round(st.median(cr), 4), "cpu_ratio_range": [round(min(cr), 4), round(max(cr), 4)],
        "wall_ratio_median": round(st.median(wr), 4), "wall_ratio_range": [round(min(wr), 4), round(max(wr), 4)],
        "direct_cpu_s_median": round(st.median(d[0] for d in direct), 3),
        "direct_ms_per_request": round(st.median(d[0] for d in direct) / n * 1e3, 3),
        "queue_cpu_us_per_request_median": round((st.median(f[0] for f in full) - st.median(d[0] for d in direct)) / n * 1e6, 1)}
print(json.dumps(out, indent=1))
PY
