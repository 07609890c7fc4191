#!/usr/bin/env bash
# Thread scaling of `corelm bench model`: the same preset at 1 thread on one core (taskset -c 0)
# and at 2 threads on two cores (taskset -c 0,1); prints one JSON object with both runs and the
# ratio 2-thread / 1-thread per figure (wall and process-CPU-time rates), and lists any figure
# where 2 threads are slower than 1 under "slower_at_2_threads".
#   bench/thread_scaling.sh [build-dir] [extra `bench model` flags...]   (default build/release)
# Environment: SCALING_PRESET (default tiny), SCALING_CPUS_1 / SCALING_CPUS_2 (default 0 / 0,1),
# SCALING_REPEATS (default 1): runs of each configuration, alternated 1, 2, 1, 2, ... so that a
# change in machine load hits both; figures are then medians and every run's values are listed
# under "runs". CORELM_SPIN_US (the pool's polling time) is passed through and reported.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(realpath -m "${1:-$here/build/release}")"
shift || true
corelm="$build/corelm"
[[ -x $corelm ]] || { echo "thread_scaling: $corelm is missing (build the corelm target first)" >&2; exit 1; }
preset="${SCALING_PRESET:-tiny}"
cpus1="${SCALING_CPUS_1:-0}"
cpus2="${SCALING_CPUS_2:-0,1}"
repeats="${SCALING_REPEATS:-1}"
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "thread_scaling: SCALING_REPEATS must be a positive integer, got '$repeats'" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

uptime > "$tmp/load_before"
for ((r = 0; r < repeats; ++r)); do
  taskset -c "$cpus1" "$corelm" bench model --preset "$preset" --threads 1 --json "$@" > "$tmp/t1_$r.json"
  taskset -c "$cpus2" "$corelm" bench model --preset "$preset" --threads 2 --json "$@" > "$tmp/t2_$r.json"
done
uptime > "$tmp/load_after"

python3 - "$tmp" "$repeats" "$cpus1" "$cpus2" "${CORELM_SPIN_US-}" <<'EOF_PY'
import json, os, statistics, sys
tmp, repeats, cpus1, cpus2, spin = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
load = lambda name: open(os.path.join(tmp, name)).read().strip()
runs = {t: [json.load(open(os.path.join(tmp, f"t{t}_{r}.json"))) for r in range(repeats)] for t in (1, 2)}
figures = ("scored_tok_s", "generated_tok_s", "decode_b1_tok_s", "train_tok_s")

def median(values):
    values = [v for v in values if v]
    return statistics.median(values) if values else None

def medians(results, pick):
    keys = list(dict.fromkeys(k for r in results for k in (pick(r) or {})))  # first-seen order
    return {k: median([(pick(r) or {}).get(k) for r in results]) for k in keys}

one = medians(runs[1], lambda r: {f: r.get(f) for f in figures})
two = medians(runs[2], lambda r: {f: r.get(f) for f in figures})
ratio = {f: two[f] / one[f] for f in figures if one.get(f) and two.get(f)}
# CPU-time rates: tokens per second of process CPU time summed over threads, so a perfect 2-thread
# split gives 1.0 here and 2.0 in the wall ratio; below 1 is the parallel overhead.
cpu1 = medians(runs[1], lambda r: r.get("cpu_time_tok_s"))
cpu2 = medians(runs[2], lambda r: r.get("cpu_time_tok_s"))
cpu_ratio = {k: cpu2[k] / cpu1[k] for k in cpu1 if cpu1.get(k) and cpu2.get(k)}
out = {
    "preset": runs[1][0].get("preset"), "isa": runs[1][0].get("isa"),
    "load": load("load_before"), "load_after": load("load_after"),
    "cpus": {"1": cpus1, "2": cpus2}, "corelm_spin_us": spin or "default", "repeats": repeats,
    "threads_1": one,
    "threads_2": two,
    "scaling_2_over_1": ratio,
    "cpu_time_efficiency_2_over_1": cpu_ratio,
    "slower_at_2_threads": sorted(f for f, r in ratio.items() if r < 1.0),
}
if repeats > 1:
    out["runs"] = {f"threads_{t}": {f: [r.get(f) for r in runs[t]] for f in figures} for t in (1, 2)}
print(json.dumps(out, indent=2))
EOF_PY
