#!/usr/bin/env python3
"""A gazetteer + capitalisation baseline for CoNLL-2003 entity extraction, built from train only.

  conll_baseline.py TRAIN.jsonl TEST.jsonl WORK [--limit N]

Rows are {"text": tokens joined by spaces, "entities": [{"type", "text"}, ...]} (bench/task_data.py).

1. Gazetteer: every entity string of TRAIN with its most frequent type, kept when the string is
   an entity in at least half of its occurrences in the TRAIN text (so "The" or "May" seen once
   inside a name do not fire everywhere).
2. Tagging, left to right: at each token the longest gazetteer match wins; otherwise a maximal
   run of name-like tokens (first character an upper-case letter, and the token not mostly
   outside entities in TRAIN) becomes an entity whose type is the majority vote of its tokens'
   types in TRAIN entities (when none of its tokens was seen in one, the majority type of the
   entity strings seen once in TRAIN: a stand-in for names met for the first time).

Scored with the formulas of `corelm eval-task --task extract --entities` (micro/per-type P/R/F1
over the multiset of (type, text) pairs per sentence: tests/pipeline/entity_metrics_oracle.py's
score(), which tests/pipeline/test_eval_task.cc checks against eval-task's own). Writes
WORK/predictions.jsonl ({"text", "entities", "prediction": "TYPE: text; ..."}, the format
eval-task parses) and prints one JSON line: precision, recall, f1, per_type, counts, test_s.
"""
import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "pipeline"))
import entity_metrics_oracle  # noqa: E402

MAX_LEN = 8  # longest gazetteer entry considered, in tokens


def read(path, limit=0):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if limit and len(rows) >= limit:
                break
    return rows


def build(train):
    types = collections.defaultdict(collections.Counter)      # entity tokens -> type counts
    token_types = collections.defaultdict(collections.Counter)  # token -> type counts inside entities
    in_entity, outside = collections.Counter(), collections.Counter()
    overall = collections.Counter()
    for r in train:
        tokens = r["text"].split()
        ent_tokens = collections.Counter()
        for e in r["entities"]:
            key = tuple(e["text"].split())
            types[key][e["type"]] += 1
            overall[e["type"]] += 1
            for t in key:
                token_types[t][e["type"]] += 1
                ent_tokens[t] += 1
        for t, n in collections.Counter(tokens).items():
            in_entity[t] += min(n, ent_tokens[t])
            outside[t] += n - min(n, ent_tokens[t])
    # How often each gazetteer string occurs in the train text at all.
    occurs = collections.Counter()
    for r in train:
        tokens = r["text"].split()
        for i in range(len(tokens)):
            for n in range(1, min(MAX_LEN, len(tokens) - i) + 1):
                key = tuple(tokens[i:i + n])
                if key in types:
                    occurs[key] += 1
    gazetteer = {k: c.most_common(1)[0][0] for k, c in types.items()
                 if len(k) <= MAX_LEN and sum(c.values()) * 2 >= occurs[k]}
    # Unseen spans are typed like the rarest train entities: the majority type of the entity
    # strings seen once (names a tagger meets for the first time are mostly of that kind).
    rare = collections.Counter(c.most_common(1)[0][0] for c in types.values() if sum(c.values()) == 1)
    return gazetteer, token_types, in_entity, outside, (rare or overall).most_common(1)[0][0]


def tag(tokens, model):
    gazetteer, token_types, in_entity, outside, majority = model

    def name_like(t):
        return t[:1].isalpha() and t[:1].isupper() and outside[t] <= in_entity[t]

    out, i = [], 0
    while i < len(tokens):
        for n in range(min(MAX_LEN, len(tokens) - i), 0, -1):
            key = tuple(tokens[i:i + n])
            if key in gazetteer:
                out.append((gazetteer[key], " ".join(key)))
                i += n
                break
        else:
            j = i
            while j < len(tokens) and name_like(tokens[j]) and tuple(tokens[j:j + 1]) not in gazetteer:
                j += 1
            if j == i:
                i += 1
                continue
            votes = collections.Counter()
            for t in tokens[i:j]:
                votes.update(token_types.get(t, {}))
            out.append((votes.most_common(1)[0][0] if votes else majority, " ".join(tokens[i:j])))
            i = j
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("train")
    ap.add_argument("test")
    ap.add_argument("work")
    ap.add_argument("--limit", type=int, default=0, help="score only the first N test sentences")
    a = ap.parse_args()
    t0 = time.perf_counter()
    model = build(read(a.train))
    build_s = time.perf_counter() - t0
    test = read(a.test, a.limit)
    t0 = time.perf_counter()
    preds = [tag(r["text"].split(), model) for r in test]
    test_s = time.perf_counter() - t0
    gold = [[(e["type"], " ".join(e["text"].split())) for e in r["entities"]] for r in test]
    os.makedirs(a.work, exist_ok=True)
    tmp = os.path.join(a.work, ".predictions.jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r, p in zip(test, preds):
            f.write(json.dumps({"text": r["text"], "entities": r["entities"],
                                "prediction": "; ".join(f"{t}: {x}" for t, x in p) or "none"},
                               ensure_ascii=False) + "\n")
    os.replace(tmp, os.path.join(a.work, "predictions.jsonl"))
    out = entity_metrics_oracle.score(gold, preds)
    out.update({"records": len(test), "gazetteer_entries": len(model[0]), "build_s": round(build_s, 2),
                "test_s": round(test_s, 2)})
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
