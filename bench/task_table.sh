#!/usr/bin/env bash
# The task table (issue 14): corelm against fastText on every labelled set, plus CoNLL-2003 entities.
#
#   bench/task_table.sh            # everything; WORK/table.md and WORK/table.json
#
# Per classification set (AG News 8k, SST-2, TREC): bench/task_data.py's split, the fastText peer
# (bench/fasttext_peer.py: lr x epoch chosen on dev), the label-likelihood SFT recipe
# (bench/classify_sft_recipe.sh) and the classification-head recipe (${RECIPE:-bench/classify_recipe.sh},
# skipped with a message when missing). Both recipes take TRAIN DEV TEST LABELS WORK and print one
# JSON line {"accuracy", "macro_f1", "ece_before", "ece", "input_tok_s", "params", "train_s", "recipe"}.
# CoNLL-2003: the gazetteer/capitalisation baseline (bench/conll_baseline.py) and the entity-list
# SFT row (bench/conll_sft_recipe.sh, scored by `corelm eval-task --task extract --entities`).
#
# Environment:
#   WORK        output folder (build/task_table)
#   DATA        the shared data folder (../shared/data)
#   SETS        comma-separated subset of agnews,sst2,trec,conll (all)
#   STEPS       comma-separated subset of data,fasttext,sft,head,conll_baseline,conll_sft (all);
#               a step not run keeps its earlier result file, which the table still shows;
#               STEPS=none only rewrites the table from the result files
#   TEST_LIMIT  score only the first N test rows (0 = all; the table says so)
#   RECIPE      the head recipe script (bench/classify_recipe.sh)
#   SFT_TRAIN_STEPS, CONLL_TRAIN_STEPS  training steps of the two SFT recipes (1500, 3000)
#   CONLL_INIT  start the CoNLL entity-list SFT from this model (e.g. the pretrained tiny) instead
#               of the from-scratch 2-layer model
#   INIT, ADAPT_STEPS, ADAPT, LRS, POOLINGS, ...  passed to the head recipe (see its header)
#   CORELM_BIN  (build/release/corelm); PIN_CORE the core every step is pinned to (0)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-build/task_table}
data=${DATA:-../shared/data}
sets=${SETS:-agnews,sst2,trec,conll}
steps=${STEPS:-data,fasttext,sft,head,conll_baseline,conll_sft}
limit=${TEST_LIMIT:-0}
recipe=${RECIPE:-bench/classify_recipe.sh}
export CORELM_BIN=${CORELM_BIN:-build/release/corelm}
mkdir -p "$work"
has() { [[ ",$1," == *",$2,"* ]]; }
# The recipes read STEPS as their own knob in some scripts: never pass the table's list down.
child() { env -u STEPS TEST_LIMIT="$limit" "$@"; }
# Runs a step, its stdout's last line being its JSON result, into FILE (kept only when it
# succeeded); FILE.cmd keeps the command for the table.
step() {
  local file=$1; shift
  echo "task_table: $*" >&2
  if child "$@" > "$file.log" 2> "$file.err"; then
    tail -n 1 "$file.log" > "$file.tmp" && mv "$file.tmp" "$file"
    { [[ $limit != 0 ]] && echo -n "TEST_LIMIT=$limit "; echo "$*"; } > "$file.cmd"
  else
    echo "task_table: step failed ($*), see $file.err" >&2
    tail -n 5 "$file.err" >&2 || true
    rm -f "$file"
  fi
}

if has "$steps" data; then
  [[ -d $data/classification && -d $data/extraction ]] ||
    { echo "task_table: $data has no classification/ and extraction/ (set DATA; see ../shared/data/MANIFEST.md)" >&2; exit 1; }
  python3 bench/task_data.py --data "$data" --out "$work/data" | tee "$work/data_counts.jsonl"
  echo "python3 bench/task_data.py --data $data --out $work/data" > "$work/data.cmd"
fi

for s in agnews sst2 trec; do
  has "$sets" "$s" || continue
  d=$work/data/$s
  [[ -s $d/train.jsonl ]] || { echo "task_table: $d/train.jsonl missing (run with STEPS including data)" >&2; continue; }
  labels=$(paste -sd, "$d/labels.txt")
  mkdir -p "$work/$s"
  ft_limit=(); [[ $limit != 0 ]] && ft_limit=(--test-limit "$limit")
  has "$steps" fasttext && step "$work/$s/fasttext.json" nice -n 10 taskset -c "${PIN_CORE:-0}" python3 bench/fasttext_peer.py \
    "$d/train.jsonl" "$d/dev.jsonl" "$d/test.jsonl" "$labels" "$work/$s/fasttext" "${ft_limit[@]}"
  has "$steps" sft && step "$work/$s/sft.json" env TRAIN_STEPS="${SFT_TRAIN_STEPS:-1500}" bench/classify_sft_recipe.sh \
    "$d/train.jsonl" "$d/dev.jsonl" "$d/test.jsonl" "$labels" "$work/$s/sft"
  if has "$steps" head; then
    if [[ -x $recipe ]]; then
      step "$work/$s/head.json" "$recipe" "$d/train.jsonl" "$d/dev.jsonl" "$d/test.jsonl" "$labels" "$work/$s/head"
    else
      echo "task_table: $recipe not found (or not executable): the classification-head row of $s is skipped" >&2
    fi
  fi
done

if has "$sets" conll; then
  d=$work/data/conll
  mkdir -p "$work/conll"
  bl_limit=(); [[ $limit != 0 ]] && bl_limit=(--limit "$limit")
  has "$steps" conll_baseline && step "$work/conll/baseline.json" python3 bench/conll_baseline.py \
    "$d/train.jsonl" "$d/test.jsonl" "$work/conll/baseline" "${bl_limit[@]}"
  has "$steps" conll_sft && step "$work/conll/sft.json" env TRAIN_STEPS="${CONLL_TRAIN_STEPS:-3000}" SFT_INIT="${CONLL_INIT:-}" \
    bench/conll_sft_recipe.sh "$d/train.jsonl" "$d/test.jsonl" "$work/conll/sft"
fi

python3 - "$work" "$limit" "$recipe" <<'PY'
import datetime, json, os, subprocess, sys
work, limit, recipe = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(path):
    try:
        with open(path) as f:
            return json.loads(f.read().strip() or "null")
    except (OSError, json.JSONDecodeError):
        return None
info = {k.strip(): v.strip() for k, v in (l.split(":", 1) for l in open("/proc/cpuinfo") if ":" in l)}
cpu = "%s (family %s, model %s)" % (info.get("model name", "unknown"), info.get("cpu family", "?"), info.get("model", "?"))
meta = {"machine": cpu, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load": open("/proc/loadavg").read().split()[:3], "test_limit": limit,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()}
names = {"agnews": "AG News (8k train, 7,600 test)", "sst2": "SST-2 (1,821 test)", "trec": "TREC coarse (500 test)"}
out = {"meta": meta, "sets": {}}
fmt = lambda x, p=3: "–" if x is None else f"{x:.{p}f}"
lines = [f"Machine: {cpu}; {meta['date']}; load {' '.join(meta['load'])}; commit {meta['commit']}" +
         (f"; TEST_LIMIT={limit} (first {limit} test rows only)" if limit else ""), "",
         "| set | fastText acc (lr, epoch) | system | accuracy | macro-F1 | ECE before → after | input tok/s | params | train s | Δ acc vs fastText |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for s in ("agnews", "sst2", "trec"):
    ft = load(f"{work}/{s}/fasttext.json")
    rows = {r: load(f"{work}/{s}/{r}.json") for r in ("sft", "head")}
    if ft is None and not any(rows.values()):
        continue
    out["sets"][s] = {"fasttext": ft, **rows}
    ft_cell = "–" if ft is None else f"{ft['accuracy']:.3f} ({ft['lr']}, {ft['epoch']})"
    if ft is not None:
        lines.append(f"| {names[s]} | {ft_cell} | (fastText itself) | {ft['accuracy']:.3f} | {ft['macro_f1']:.3f} | "
                     f"– → {fmt(ft.get('ece'))} | {ft['test_tok_s']:,} words | – | {ft['train_s']} | – |")
    for r, label in (("sft", "label-likelihood SFT"), ("head", "classification head")):
        j = rows[r]
        if j is None:
            continue
        delta = "–" if ft is None else f"{100 * (j['accuracy'] - ft['accuracy']):+.1f} pts"
        ece = f"{fmt(j.get('ece_before'))} → {fmt(j.get('ece'))}"
        lines.append(f"| {names[s]} | {ft_cell} | {label} | {j['accuracy']:.3f} | {j['macro_f1']:.3f} | {ece} | "
                     f"{j['input_tok_s']:,.0f} | {j['params']:,} | {j['train_s']} | {delta} |")
bl, sft = load(f"{work}/conll/baseline.json"), load(f"{work}/conll/sft.json")
if bl or sft:
    out["sets"]["conll"] = {"baseline": bl, "sft": sft}
    lines += ["", "CoNLL-2003 test (3,453 sentences, 5,648 entities): entity micro P/R/F1 over (type, text) pairs",
              "", "| system | precision | recall | F1 | PER F1 | LOC F1 | ORG F1 | MISC F1 | input tok/s | train s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, j in (("gazetteer + capitalisation baseline (train split)", bl), ("corelm entity-list SFT, eval-task --entities", sft)):
        if not j:
            continue
        pt = lambda t: fmt(j["per_type"].get(t, {}).get("f1"))
        tok = f"{j['input_tok_s']:,.0f}" if "input_tok_s" in j else "–"
        lines.append(f"| {name} | {j['precision']:.3f} | {j['recall']:.3f} | {j['f1']:.3f} | {pt('PER')} | {pt('LOC')} | "
                     f"{pt('ORG')} | {pt('MISC')} | {tok} | {j.get('train_s', '–')} |")
cmds = []
for c in [f"{work}/data.cmd"] + [f"{work}/{s}/{r}.json.cmd" for s in ("agnews", "sst2", "trec") for r in ("fasttext", "sft", "head")] + \
         [f"{work}/conll/{r}.json.cmd" for r in ("baseline", "sft")]:
    if os.path.exists(c):
        cmds += open(c).read().splitlines()
out["commands"] = cmds
lines += ["", "Commands (from the repository root):", "", "```"] + cmds + ["```"]
with open(f"{work}/table.json.tmp", "w") as f:
    json.dump(out, f, indent=1)
os.replace(f"{work}/table.json.tmp", f"{work}/table.json")
with open(f"{work}/table.md.tmp", "w") as f:
    f.write("\n".join(lines) + "\n")
os.replace(f"{work}/table.md.tmp", f"{work}/table.md")
print("\n".join(lines))
PY
