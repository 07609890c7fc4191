#!/usr/bin/env python3
"""The fastText peer of the task table: Debian `fasttext supervised`, tuned on the dev split.

  fasttext_peer.py TRAIN.jsonl DEV.jsonl TEST.jsonl LABELS WORK [--lrs 0.1,0.25,0.5,1.0] [--epochs 5,10,25,50] [--test-limit N]

Rows are {"text", "label"} (bench/task_data.py). Every set gets the same preprocessing: lower
case, then words split from punctuation (`\\w+` runs and single non-space, non-word characters,
Unicode-aware) and joined by single spaces. The training file is shuffled with a fixed seed
(fastText reads it in order). Each (lr, epoch) pair of the grid is trained on TRAIN with
`-wordNgrams 2 -thread 1 -seed 1` (otherwise fastText's defaults: dim 100, softmax loss) and
scored on DEV; the best dev accuracy (ties: the earlier pair) is retrained on TRAIN (not
TRAIN + DEV) and scored on TEST. Prints one JSON line: accuracy, macro_f1, ece (15 bins, on the
top label's probability from `predict-prob`), lr, epoch, dev_accuracy, train_s (the final
training), test_tok_s (preprocessed test words per second of `predict-prob`, model load
included), and the grid.
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time

TOKEN = re.compile(r"\w+|[^\w\s]")


def preprocess(text):
    return " ".join(TOKEN.findall(text.lower()))


def read(path, labels):
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("label") not in labels:
                raise SystemExit(f"fasttext_peer.py: {path}:{lineno}: label {r.get('label')!r} is not one of {labels}")
            rows.append((labels.index(r["label"]), preprocess(r["text"])))
    if not rows:
        raise SystemExit(f"fasttext_peer.py: {path}: no rows")
    return rows


def write_ft(path, rows):
    # fastText labels may not hold spaces; the label index keeps them apart from the text.
    with open(path, "w", encoding="utf-8") as f:
        for k, text in rows:
            f.write(f"__label__{k} {text}\n")


def train(ft, data, model, lr, epoch):
    t0 = time.perf_counter()
    subprocess.run([ft, "supervised", "-input", data, "-output", model, "-lr", str(lr), "-epoch", str(epoch),
                    "-wordNgrams", "2", "-thread", "1", "-seed", "1", "-verbose", "0"], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def predict(ft, model, rows, work):
    path = os.path.join(work, "predict.txt")
    with open(path, "w", encoding="utf-8") as f:
        for _, text in rows:
            f.write(text + "\n")
    t0 = time.perf_counter()
    out = subprocess.run([ft, "predict-prob", model + ".bin", path, "1"], check=True, capture_output=True,
                         text=True).stdout.splitlines()
    secs = time.perf_counter() - t0
    if len(out) != len(rows):
        raise SystemExit(f"fasttext_peer.py: predict-prob gave {len(out)} lines for {len(rows)} rows")
    preds = []
    for line in out:
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith("__label__"):
            preds.append((int(parts[0][len("__label__"):]), min(1.0, max(0.0, float(parts[1])))))
        else:  # an empty line after preprocessing gets no label: count it wrong, confidence 0
            preds.append((-1, 0.0))
    return preds, secs


def metrics(rows, preds, n_labels, bins=15):
    gold = [k for k, _ in rows]
    correct = [g == p for g, (p, _) in zip(gold, preds)]
    f1s = []
    for k in range(n_labels):
        tp = sum(g == k and p == k for g, (p, _) in zip(gold, preds))
        predicted = sum(p == k for p, _ in preds)
        support = sum(g == k for g in gold)
        prec = tp / predicted if predicted else 0.0
        rec = tp / support if support else 0.0
        f1s.append(2 * prec * rec / (prec + rec) if prec + rec else 0.0)
    ece = 0.0
    for b in range(bins):
        idx = [i for i, (_, c) in enumerate(preds) if min(bins - 1, max(0, math.ceil(c * bins) - 1)) == b]
        if idx:
            acc = sum(correct[i] for i in idx) / len(idx)
            conf = sum(preds[i][1] for i in idx) / len(idx)
            ece += len(idx) / len(rows) * abs(acc - conf)
    return sum(correct) / len(rows), sum(f1s) / n_labels, ece


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("train", "dev", "test", "labels", "work"):
        ap.add_argument(name)
    ap.add_argument("--lrs", default="0.1,0.25,0.5,1.0")
    ap.add_argument("--epochs", default="5,10,25,50")
    ap.add_argument("--fasttext", default=os.environ.get("FASTTEXT", "fasttext"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--test-limit", type=int, default=0, help="score only the first N test rows")
    a = ap.parse_args()
    labels = a.labels.split(",")
    os.makedirs(a.work, exist_ok=True)
    train_rows, dev_rows, test_rows = (read(p, labels) for p in (a.train, a.dev, a.test))
    if a.test_limit:
        test_rows = test_rows[:a.test_limit]
    random.Random(a.seed).shuffle(train_rows)
    train_txt = os.path.join(a.work, "train.txt")
    write_ft(train_txt, train_rows)
    model = os.path.join(a.work, "model")
    grid = []
    for lr in (float(x) for x in a.lrs.split(",")):
        for epoch in (int(x) for x in a.epochs.split(",")):
            train(a.fasttext, train_txt, model, lr, epoch)
            preds, _ = predict(a.fasttext, model, dev_rows, a.work)
            grid.append({"lr": lr, "epoch": epoch, "dev_accuracy": metrics(dev_rows, preds, len(labels))[0]})
    best = max(grid, key=lambda g: g["dev_accuracy"])  # max keeps the first of equal values
    train_s = train(a.fasttext, train_txt, model, best["lr"], best["epoch"])
    preds, secs = predict(a.fasttext, model, test_rows, a.work)
    acc, macro_f1, ece = metrics(test_rows, preds, len(labels))
    words = sum(len(t.split()) for _, t in test_rows)
    print(json.dumps({"accuracy": acc, "macro_f1": macro_f1, "ece": ece, "lr": best["lr"], "epoch": best["epoch"],
                      "dev_accuracy": best["dev_accuracy"], "train_s": round(train_s, 2),
                      "test_tok_s": round(words / secs), "test_rows": len(test_rows), "train_rows": len(train_rows),
                      "grid": grid}))


if __name__ == "__main__":
    sys.exit(main())
