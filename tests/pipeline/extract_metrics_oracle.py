"""Independent computation of the extraction metrics `corelm eval-task --task extract` reports.

Reads {"pairs": [[prediction, [reference, ...]], ...]} on stdin and prints, per pair, the exact
match and token F1 (best over the references) after SQuAD-style normalisation: lower case, ASCII
punctuation removed, the articles a/an/the dropped, whitespace collapsed.
"""
import collections
import json
import string
import sys

PUNCT = set(string.punctuation)


def normalize(s):
    s = "".join(ch for ch in s if ch not in PUNCT).lower()
    return " ".join(w for w in s.split() if w not in ("a", "an", "the"))


def f1(pred, ref):
    p, r = normalize(pred).split(), normalize(ref).split()
    if not p or not r:
        return float(p == r)
    common = sum((collections.Counter(p) & collections.Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


pairs = json.load(sys.stdin)["pairs"]
print(json.dumps([[max(float(normalize(p) == normalize(r)) for r in refs), max(f1(p, r) for r in refs)]
                  for p, refs in pairs]))
