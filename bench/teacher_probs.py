#!/usr/bin/env python3
"""Soft targets for distillation (round 3 of the classify recipe, docs/TRAINING.md).

Scores TRAIN with each teacher model (`corelm run classify`, the head with its fitted temperature)
and writes TRAIN again with one more field per record: the mean of the teachers' probabilities,
{label: p}, as `corelm train --task classify --teacher-field FIELD` reads it.

  bench/teacher_probs.py --train TRAIN.jsonl --out OUT.jsonl --models DIR [DIR ...] [--field teacher]

Every teacher must carry a head over the same labels; a record a teacher could not score (an
error record of `run classify`) stops the script naming it. Blank lines of TRAIN are kept.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def score(corelm, model, train, out_dir, threads):
    subprocess.run([corelm, "run", "classify", "--model", model, "--input", train, "--out", out_dir,
                    "--overwrite", "--threads", str(threads), "--batch", "16"],
                   check=True, stdout=subprocess.DEVNULL)
    errors = [l for f in glob.glob(os.path.join(out_dir, "errors-*.jsonl")) for l in open(f) if l.strip()]
    if errors:
        sys.exit(f"teacher_probs: {model} could not score {len(errors)} record(s) of {train}, first: {errors[0].strip()}")
    probs = {}
    for f in glob.glob(os.path.join(out_dir, "part-*.jsonl")):
        for line in open(f, encoding="utf-8"):
            r = json.loads(line)
            probs[int(r["id"].rsplit(":", 1)[1])] = r["probs"]
    return probs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", required=True, help="teacher model directories (classification heads)")
    ap.add_argument("--field", default="teacher")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--corelm", default=os.environ.get("CORELM_BIN", os.path.join(ROOT, "build/release/corelm")))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="teacher_probs_") as tmp:
        runs = [score(a.corelm, m, a.train, os.path.join(tmp, str(i)), a.threads) for i, m in enumerate(a.models)]
    labels = sorted(next(iter(runs[0].values())))
    for m, r in zip(a.models, runs):
        got = sorted(next(iter(r.values())))
        if got != labels:
            sys.exit(f"teacher_probs: {m} has labels {got}, the first teacher {labels}")
    n = 0
    tmp_out = a.out + ".tmp"
    with open(a.train, encoding="utf-8") as src, open(tmp_out, "w", encoding="utf-8") as dst:
        for lineno, line in enumerate(src, 1):
            if not line.strip():
                dst.write(line)
                continue
            rec = json.loads(line)
            missing = [m for m, r in zip(a.models, runs) if lineno not in r]
            if missing:
                sys.exit(f"teacher_probs: {a.train}:{lineno} has no score from {missing[0]}")
            rec[a.field] = {l: sum(r[lineno][l] for r in runs) / len(runs) for l in labels}
            dst.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp_out, a.out)
    print(json.dumps({"out": a.out, "records": n, "teachers": a.models, "field": a.field}))


if __name__ == "__main__":
    main()
