#!/usr/bin/env bash
# Thread scaling of `corelm bench model`: the same preset at 1 thread on one core (taskset -c 0)
# and at 2 threads on two cores (taskset -c 0,1); prints one JSON object with both runs and the
# ratio 2-thread / 1-thread per figure (wall and process-CPU-time rates), and lists any figure
# where 2 threads are slower than 1 under "slower_at_2_threads".
#   bench/thread_scaling.sh [build-dir] [extra `bench model` flags...]   (default build/release)
# Environment: SCALING_PRESET (default tiny), SCALING_CPUS_1 / SCALING_CPUS_2 (default 0 / 0,1).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(realpath -m "${1:-$here/build/release}")"
shift || true
corelm="$build/corelm"
[[ -x $corelm ]] || { echo "thread_scaling: $corelm is missing (build the corelm target first)" >&2; exit 1; }
preset="${SCALING_PRESET:-tiny}"
cpus1="${SCALING_CPUS_1:-0}"
cpus2="${SCALING_CPUS_2:-0,1}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

uptime > "$tmp/load"
taskset -c "$cpus1" "$corelm" bench model --preset "$preset" --threads 1 --json "$@" > "$tmp/t1.json"
taskset -c "$cpus2" "$corelm" bench model --preset "$preset" --threads 2 --json "$@" > "$tmp/t2.json"

python3 - "$tmp/t1.json" "$tmp/t2.json" "$(cat "$tmp/load")" "$cpus1" "$cpus2" <<'EOF'
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:3])
figures = ("scored_tok_s", "generated_tok_s", "decode_b1_tok_s", "train_tok_s")
ratio = {f: two[f] / one[f] for f in figures if one.get(f) and two.get(f)}
# CPU-time rates: tokens per second of process CPU time summed over threads, so a perfect 2-thread
# split gives 1.0 here and 2.0 in the wall ratio; below 1 is the parallel overhead.
cpu1, cpu2 = one.get("cpu_time_tok_s") or {}, two.get("cpu_time_tok_s") or {}
cpu_ratio = {k: cpu2[k] / cpu1[k] for k in cpu1 if cpu1.get(k) and cpu2.get(k)}
print(json.dumps({
    "preset": one.get("preset"), "isa": one.get("isa"), "load": sys.argv[3],
    "cpus": {"1": sys.argv[4], "2": sys.argv[5]},
    "threads_1": {f: one.get(f) for f in figures},
    "threads_2": {f: two.get(f) for f in figures},
    "scaling_2_over_1": ratio,
    "cpu_time_efficiency_2_over_1": cpu_ratio,
    "slower_at_2_threads": sorted(f for f, r in ratio.items() if r < 1.0),
}, indent=2))
EOF
