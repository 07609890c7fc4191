#!/usr/bin/env python3
"""Scores a `corelm run classify` output directory against gold labels and prints one JSON line.

  score_classify.py --task NAME --gold GOLD.jsonl --work DIR --t0 S --t1 S [--extra k=v ...]

GOLD.jsonl rows carry "id" and "label"; DIR holds run/part-*.jsonl (predictions), run.json (the
run's manifest summary) and train.json (the fine-tune's summary). t0/t1 bracket the training time.
Shared by bench/classify_dicts.sh and bench/agnews_classify.sh.
"""
import argparse
import collections
import glob
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True)
    ap.add_argument("--gold", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--t0", type=float, required=True)
    ap.add_argument("--t1", type=float, required=True)
    ap.add_argument("--extra", action="append", default=[], help="key=value added to the JSON")
    a = ap.parse_args()

    gold = {}
    with open(a.gold, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            gold[r["id"]] = r["label"]
    pred = {}
    for part in sorted(glob.glob(f"{a.work}/run/part-*.jsonl")):
        with open(part, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                pred[r["id"]] = r["label"]
    if not gold:
        raise SystemExit(f"score_classify.py: no gold rows in {a.gold}")
    majority = collections.Counter(gold.values()).most_common(1)[0][1] / len(gold)
    with open(f"{a.work}/run.json", encoding="utf-8") as f:
        run = json.load(f)
    with open(f"{a.work}/train.json", encoding="utf-8") as f:
        train = json.load(f)
    out = {"task": a.task}
    out.update(dict(kv.split("=", 1) for kv in a.extra))
    out.update({"gold": len(gold), "classified": len(pred),
                "accuracy": sum(pred.get(i) == l for i, l in gold.items()) / len(gold),
                "majority_baseline": majority, "train_steps": train["steps"],
                "train_seconds": round(a.t1 - a.t0, 1), "train_val_loss": train["val_loss"],
                "run_input_tokens": run["input_tokens"], "run_tokens_per_s": run["tokens_per_s"],
                "run_records_per_s": run["records_per_s"], "precision": run["precision"]})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
