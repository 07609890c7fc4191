#!/usr/bin/env bash
# Kernel benchmarks in one command: GEMM (with oneDNN beside it when bench/onednn_gemm was built),
# memory bandwidth, and the roofline plot.
#   bench/run_kernel_bench.sh [build-dir] [out-dir]
# Writes <out-dir>/gemm.json, <out-dir>/memory.json and docs/img/roofline.png; pins to core 0.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$here/build/release}"
out="${2:-$build/bench-results}"
mkdir -p "$out" "$here/docs/img"
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
"${pin[@]}" "$build/corelm" bench gemm --json --threads 1 > "$out/gemm.json"
"${pin[@]}" "$build/corelm" bench memory --json > "$out/memory.json"
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3  # Debian python3-matplotlib lives there
"$py" "$here/bench/plot_roofline.py" "$out/gemm.json" "$out/memory.json" "$here/docs/img/roofline.png"
echo "results: $out/gemm.json $out/memory.json docs/img/roofline.png"
