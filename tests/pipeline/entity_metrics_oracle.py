"""Independent computation of the entity metrics `corelm eval-task --task extract --entities` reports.

As a script: reads {"cases": [{"tokens": [...], "gold": [IOB2 tags], "pred": [IOB2 tags]}, ...]}
on stdin and prints micro and per-type precision/recall/F1 with counts, and the fraction of
sentences whose predicted chunks equal the gold ones. Chunks are read from the tags the way
conlleval/seqeval do (a chunk starts at B-X, or at I-X after a tag of another type or O, and runs
over the following I-X), and compared by position.

As a module (bench/conll_baseline.py): chunks(tags) and score(gold_lists, pred_lists), the
latter over multisets of (type, text) pairs per record, the formulas eval-task uses.
"""
import collections
import json
import sys


def chunks(tags):
    """(type, start, end) chunks of one IOB2 (or IOB1) tag sequence, end exclusive."""
    out, cur = [], None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, typ = tag.partition("-")
        if cur is not None and not (prefix == "I" and typ == cur[0]):
            out.append((cur[0], cur[1], i))
            cur = None
        if prefix == "B" or (prefix == "I" and cur is None):
            cur = (typ, i)
    return out


def prf(correct, predicted, gold):
    p = correct / predicted if predicted else 0.0
    r = correct / gold if gold else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
            "gold": gold, "predicted": predicted, "correct": correct}


def score(gold_lists, pred_lists):
    """Micro and per-type scores of records given as lists of (type, text) pairs."""
    tot = collections.Counter()
    per = collections.defaultdict(collections.Counter)
    exact = 0
    for g, p in zip(gold_lists, pred_lists, strict=True):
        gc, pc = collections.Counter(map(tuple, g)), collections.Counter(map(tuple, p))
        for (typ, _), n in gc.items():
            per[typ]["gold"] += n
        for (typ, _), n in pc.items():
            per[typ]["pred"] += n
        for (typ, _), n in (gc & pc).items():
            per[typ]["correct"] += n
        exact += gc == pc
    for c in per.values():
        tot.update(c)
    out = prf(tot["correct"], tot["pred"], tot["gold"])
    out["exact_match"] = exact / len(gold_lists) if gold_lists else 0.0
    out["per_type"] = {t: prf(c["correct"], c["pred"], c["gold"]) for t, c in sorted(per.items())}
    return out


def main():
    cases = json.load(sys.stdin)["cases"]
    gold_lists, pred_lists = [], []
    for c in cases:
        # Position-based chunks, keyed by position so that equal texts at different places differ.
        gold_lists.append([(t, (s, e)) for t, s, e in chunks(c["gold"])])
        pred_lists.append([(t, (s, e)) for t, s, e in chunks(c["pred"])])
    print(json.dumps(score(gold_lists, pred_lists)))


if __name__ == "__main__":
    main()
