#!/bin/sh
# One-core model benchmark with the PyTorch peer in the same session: corelm bench model (tiny)
# and bench/model_peers.py, both pinned to CPU 0. Usage: bench/run_model_bench.sh [build dir] [preset]
set -eu
build=${1:-build/release}
preset=${2:-tiny}
here=$(cd "$(dirname "$0")/.." && pwd)
python=${CORELM_PYTHON:-$here/.venv/bin/python}
cmake --build "$here/$build" --target corelm_cli -j2 >/dev/null
taskset -c 0 "$here/$build/corelm" bench model --preset "$preset" --threads 1 --pp 512 --tg 128 --batch 1,16,32 --depth 0,256
"$python" "$here/bench/model_peers.py" --preset "$preset" --corelm "$here/$build/corelm" --cpu 0
