# Shared by the benches that need a `tiny`-shaped model without a pretrained one
# (bench/llama_cpp_peer.sh, bench/serve_bench.sh, bench/queue_bench.sh); sourced, not run.
#
# make_random_tiny CORELM REPO WORK DEST: the `tiny` preset with random weights (HF init plus one
# optimizer step, so the checkpoint comes from the normal training path) and a 16,384-token BPE
# learned from the KJV text (scripts/kjv-text), so a GGUF export carries a real vocabulary.
# Written to DEST.tmp and renamed, so an interrupted run never leaves a half model; kept when
# DEST/config.json exists. The KJV text and tokenizer are cached in WORK.
make_random_tiny() {
  local corelm=$1 repo=$2 work=$3 dest=$4
  [[ -f $dest/config.json ]] && return 0
  echo "making a random-weight tiny model in $dest" >&2
  mkdir -p "$work"
  [[ -f $work/kjv.txt ]] || "$repo/scripts/kjv-text" "$work/kjv.txt"
  [[ -f $work/tokenizer.json ]] ||
    "$corelm" tokenizer train --vocab-size 16384 --input "$work/kjv.txt" --output "$work/tokenizer.json" \
      --no-progress >/dev/null
  rm -rf "$dest.tmp"
  "$corelm" train --preset tiny --tokenizer "$work/tokenizer.json" --data "$work/kjv.txt" --steps 1 \
    --batch 1 --seq 32 --out "$dest.tmp" --no-progress >/dev/null
  mv "$dest.tmp" "$dest"
}
