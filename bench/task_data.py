#!/usr/bin/env python3
"""Converts the labelled sets in ../shared/data into one JSONL format for the task table.

  task_data.py [--data DIR] [--out DIR] [--sets agnews,sst2,trec,conll] [--seed 1] [--dev-fraction 0.1]
               [--sst2-dev glue|split]

Writes OUT/SET/{train,dev,test}.jsonl and OUT/SET/labels.txt (one label per line, the order
`--labels` takes), and prints one JSON line of counts per set.

  classification: {"text": ..., "label": ...}
  CoNLL-2003:     {"text": tokens joined by single spaces, "entities": [{"type": "PER", "text": ...}, ...]}

Splits (a fixed seed; dev is always held out of train, never added back):
  agnews  train_subset_8k.csv (description only, sorted by class in the file) shuffled; dev = 10 %
          of it; test = test_description_only.csv, all 7,600 rows. Labels World, Sports,
          Business, Sci/Tech (classes.txt).
  sst2    train.tsv (67,349 phrases) shuffled; dev = the GLUE dev.tsv (872 sentences; with
          --sst2-dev split: 10 % of train.tsv, which scores phrases of the training sentences);
          test = test.tsv, which carries labels (1,821 sentences). Labels negative, positive.
  trec    train_5500.label (5,452 questions) shuffled, dev = 10 %; test = TREC_10.label (500).
          Coarse labels, spelled out: abbreviation, description, entity, human, location, number.
  conll   train.tsv / valid.tsv / test.tsv (IOB2) as they are: train, dev, test.

Text: AG News keeps backslash escapes of the original CSV (`\\` where a newline was, `#36;` for
`$`): backslashes become spaces; in every set runs of whitespace collapse to one space and the
ends are trimmed. No lower-casing here (the fastText peer lower-cases its own copy).
"""
import argparse
import csv
import json
import os
import random
import sys

TREC_NAMES = {"ABBR": "abbreviation", "DESC": "description", "ENTY": "entity", "HUM": "human",
              "LOC": "location", "NUM": "number"}
SST2_NAMES = {"0": "negative", "1": "positive"}


def clean(text):
    return " ".join(text.replace("\\", " ").split())


def split_dev(rows, fraction, seed):
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    n_dev = max(1, round(len(rows) * fraction)) if rows else 0
    return rows[n_dev:], rows[:n_dev]


def agnews(data, seed, fraction):
    d = os.path.join(data, "classification", "ag_news")
    with open(os.path.join(d, "classes.txt"), encoding="utf-8") as f:
        classes = [line.strip() for line in f if line.strip()]

    def rows(name):
        with open(os.path.join(d, name), newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                yield {"text": clean(r["content"]), "label": classes[int(r["label"]) - 1]}

    train, dev = split_dev(rows("train_subset_8k.csv"), fraction, seed)
    return classes, {"train": train, "dev": dev, "test": list(rows("test_description_only.csv"))}


def read_tsv(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        label_col = header.index("label")
        text_col = 1 - label_col
        for lineno, r in enumerate(reader, start=2):
            if len(r) != 2 or r[label_col] not in SST2_NAMES:
                raise SystemExit(f"task_data.py: {path}:{lineno}: expected 'label<TAB>text' with label 0 or 1")
            yield {"text": clean(r[text_col]), "label": SST2_NAMES[r[label_col]]}


def sst2(data, seed, fraction, dev_source="glue"):
    d = os.path.join(data, "classification", "sst2")
    if dev_source == "glue":
        # The GLUE dev.tsv (872 whole sentences, like TEST). A random 10 % of train.tsv is not a
        # held-out set here: train.tsv holds every phrase of each training sentence, so such a dev
        # split scores phrases of sentences the model trained on (dev 0.888 against test 0.826 in
        # the first table), and picks checkpoints and temperatures on that.
        train = list(read_tsv(os.path.join(d, "train.tsv")))
        random.Random(seed).shuffle(train)
        dev = list(read_tsv(os.path.join(d, "dev.tsv")))
    else:
        train, dev = split_dev(read_tsv(os.path.join(d, "train.tsv")), fraction, seed)
    return list(SST2_NAMES.values()), {"train": train, "dev": dev, "test": list(read_tsv(os.path.join(d, "test.tsv")))}


def read_trec(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            label, _, question = line.strip().partition(" ")
            coarse = label.split(":", 1)[0]
            if coarse not in TREC_NAMES or not question.strip():
                raise SystemExit(f"task_data.py: {path}:{lineno}: expected 'COARSE:fine question'")
            yield {"text": clean(question), "label": TREC_NAMES[coarse]}


def trec(data, seed, fraction):
    d = os.path.join(data, "classification", "trec")
    train, dev = split_dev(read_trec(os.path.join(d, "train_5500.label")), fraction, seed)
    return list(TREC_NAMES.values()), {"train": train, "dev": dev,
                                       "test": list(read_trec(os.path.join(d, "TREC_10.label")))}


def iob_entities(tokens, tags, where):
    """Entities of one IOB2 sentence; an I- tag that does not continue a chunk starts one (conlleval)."""
    out, cur = [], None
    for i, tag in enumerate(tags + ["O"]):
        prefix, _, typ = tag.partition("-")
        if prefix not in ("B", "I", "O") or (prefix != "O" and not typ):
            raise SystemExit(f"task_data.py: {where}: bad IOB tag '{tag}'")
        if cur is not None and not (prefix == "I" and typ == cur[0]):
            out.append({"type": cur[0], "text": " ".join(tokens[cur[1]:i])})
            cur = None
        if prefix == "B" or (prefix == "I" and cur is None):
            cur = (typ, i)
    return out


def read_conll(path):
    tokens, tags, start = [], [], 1
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(list(f) + [""], start=1):
            line = line.rstrip("\n")
            if not line.strip():
                if tokens:
                    yield {"text": " ".join(tokens), "entities": iob_entities(tokens, tags, f"{path}:{start}")}
                tokens, tags, start = [], [], lineno + 1
                continue
            parts = line.split("\t") if "\t" in line else line.split()
            if len(parts) < 2 or parts[0].startswith("-DOCSTART-"):
                if parts and parts[0].startswith("-DOCSTART-"):
                    continue
                raise SystemExit(f"task_data.py: {path}:{lineno}: expected 'token<TAB>tag'")
            tokens.append(parts[0])
            tags.append(parts[-1])


def conll(data, seed, fraction):
    d = os.path.join(data, "extraction", "conll2003")
    sets = {name: list(read_conll(os.path.join(d, f + ".tsv")))
            for name, f in (("train", "train"), ("dev", "valid"), ("test", "test"))}
    return ["PER", "LOC", "ORG", "MISC"], sets


CONVERTERS = {"agnews": agnews, "sst2": sst2, "trec": trec, "conll": conll}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data"))
    ap.add_argument("--out", default="build/task_table/data")
    ap.add_argument("--sets", default="agnews,sst2,trec,conll")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dev-fraction", type=float, default=0.1)
    ap.add_argument("--sst2-dev", choices=("glue", "split"), default="glue",
                    help="SST-2's dev set: the GLUE dev.tsv, or --dev-fraction of train.tsv")
    a = ap.parse_args()
    for name in a.sets.split(","):
        if name not in CONVERTERS:
            raise SystemExit(f"task_data.py: unknown set '{name}' (one of {', '.join(CONVERTERS)})")
        extra = {"dev_source": a.sst2_dev} if name == "sst2" else {}
        labels, splits = CONVERTERS[name](a.data, a.seed, a.dev_fraction, **extra)
        out = os.path.join(a.out, name)
        os.makedirs(out, exist_ok=True)
        for split, rows in splits.items():
            tmp = os.path.join(out, f".{split}.jsonl.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            os.replace(tmp, os.path.join(out, f"{split}.jsonl"))
        with open(os.path.join(out, "labels.txt"), "w", encoding="utf-8") as f:
            f.write("".join(l + "\n" for l in labels))
        counts = {"set": name, "out": out, **{s: len(r) for s, r in splits.items()}}
        if name == "conll":
            counts["test_entities"] = sum(len(r["entities"]) for r in splits["test"])
        else:
            counts["train_labels"] = {l: sum(r["label"] == l for r in splits["train"]) for l in labels}
        print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    sys.exit(main())
