#!/usr/bin/env bash
# Throughput of `corelm run classify` on one core: the `tiny` preset (random weights), 4 labels,
# 256-token documents. Prints the JSON line of `corelm bench pipeline`.
# Environment: CORELM_BIN (default build/release/corelm), DOCS (default 64), BATCH (default 16),
# PRECISION (bf16 default, int8 or f32).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CORELM_BIN:-build/release/corelm}
pin=(); command -v taskset >/dev/null && pin=(taskset -c 0)
"${pin[@]}" "$bin" bench pipeline --preset tiny --labels 4 --doc-tokens 256 --docs "${DOCS:-64}" \
  --batch "${BATCH:-16}" --threads 1 --precision "${PRECISION:-bf16}"
