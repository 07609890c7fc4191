"""Independent numpy computation of the classification metrics `corelm eval-task` reports.

Reads {"labels": L, "gold": [...], "pred": [...], "conf": [...], "bins": B} on stdin, prints the
metrics as JSON: accuracy, macro_f1 (mean per-label F1, 0 where undefined), per-label precision,
recall, f1, support, the confusion matrix [gold][pred] and the ECE over B equal-width bins
(bin k holds confidences in (k/B, (k+1)/B], 0 in the first bin).
"""
import json
import sys

import numpy as np

case = json.load(sys.stdin)
L = case["labels"]
gold = np.array(case["gold"], dtype=np.int64)
pred = np.array(case["pred"], dtype=np.int64)
conf = np.array(case["conf"], dtype=np.float64)
bins = case["bins"]

cm = np.zeros((L, L), dtype=np.int64)
np.add.at(cm, (gold, pred), 1)
tp = np.diag(cm).astype(np.float64)
predicted = cm.sum(axis=0)
support = cm.sum(axis=1)
with np.errstate(divide="ignore", invalid="ignore"):
    precision = np.where(predicted > 0, tp / np.maximum(predicted, 1), 0.0)
    recall = np.where(support > 0, tp / np.maximum(support, 1), 0.0)
    denom = precision + recall
    f1 = np.where(denom > 0, 2 * precision * recall / np.where(denom > 0, denom, 1), 0.0)

correct = (gold == pred).astype(np.float64)
idx = np.clip(np.ceil(conf * bins).astype(np.int64) - 1, 0, bins - 1)
ece = 0.0
for b in range(bins):
    sel = idx == b
    if sel.any():
        ece += sel.sum() / len(conf) * abs(correct[sel].mean() - conf[sel].mean())

print(json.dumps({
    "accuracy": float(correct.mean()),
    "macro_f1": float(f1.mean()),
    "ece": float(ece),
    "precision": precision.tolist(),
    "recall": recall.tolist(),
    "f1": f1.tolist(),
    "support": support.tolist(),
    "confusion": cm.tolist(),
}))
