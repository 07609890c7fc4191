#!/usr/bin/python3
"""Compares training-loss curves of fp32 and bf16-compute runs (bench/train_precision_curves.sh).

    python3 bench/plot_train_curves.py [--title TITLE] [--x step|tokens|seconds] OUT.png OUT.json LABEL=DIR [LABEL=DIR ...]

Each DIR holds a train_log.jsonl of `corelm train`; LABEL is "<dtype>_s<seed>" (e.g. f32_s1,
bf16_s2), or any name for a single run (bench/pretrain_tiny.sh: no f32/bf16 comparison then).
--x tokens puts tokens seen on the x axis instead of the optimizer step, --x seconds the wall-clock
time since the run started (train_log's elapsed_s: runs compared at equal time). Prints (and writes to OUT.json) one JSON object: per run the final train loss (mean of
the last 20 steps), the final validation loss; and the largest gap between the smoothed curves of
f32 and bf16 with the same seed, next to the largest gap between two seeds of the same dtype (the
noise band). Smoothing: a centred moving average over 21 steps, since single-step losses jump by
more than either effect. The PNG needs matplotlib (Debian: python3-matplotlib).
"""
import json
import sys

WINDOW = 21
TAIL = 20


X_AXIS = "step"


def parse_label(label):
    dt, sep, seed = label.partition("_s")
    return (dt, seed) if sep else (label, "")


def read_log(path):
    """(x values, training losses, [(x, validation loss)], last step); x is the step or tokens seen."""
    steps, loss, val, last = [], [], [], 0
    key = {"tokens": "tokens_seen", "seconds": "elapsed_s"}.get(X_AXIS, "step")
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            steps.append(rec[key])
            last = rec["step"]
            loss.append(rec["loss"])
            if "val_loss" in rec:
                val.append((rec[key], rec["val_loss"]))
    return steps, loss, val, last


def smooth(values):
    half = WINDOW // 2
    out = []
    for i in range(len(values)):
        lo, hi = max(0, i - half), min(len(values), i + half + 1)
        out.append(sum(values[lo:hi]) / (hi - lo))
    return out


def max_gap(a, b, skip):
    """Largest |a - b| over the common steps after the first `skip` (the steep start, where a
    step's shift dominates and says nothing about precision)."""
    n = min(len(a), len(b))
    return max((abs(a[i] - b[i]) for i in range(skip, n)), default=float("nan"))


def main():
    global X_AXIS
    args, title = sys.argv[1:], "fp32 vs bf16 compute (fp32 master weights and AdamW state)"
    while args and args[0] in ("--title", "--x"):
        if len(args) < 2:
            sys.exit(__doc__)
        if args[0] == "--title":
            title = args[1]
        else:
            X_AXIS = args[1]
        args = args[2:]
    if len(args) < 3 or X_AXIS not in ("step", "tokens", "seconds"):
        sys.exit(__doc__)
    png, out_json, runs = args[0], args[1], {}
    for arg in args[2:]:
        label, _, d = arg.partition("=")
        runs[label] = read_log(d + "/train_log.jsonl")

    summary = {"runs": {}, "smoothing_window": WINDOW}
    smoothed = {}
    for label, (steps, loss, val, last) in runs.items():
        smoothed[label] = smooth(loss)
        tail = loss[-TAIL:]
        summary["runs"][label] = {
            "steps": last,
            "final_train_loss": sum(tail) / len(tail) if tail else None,
            "final_val_loss": val[-1][1] if val else None,
            "val_curve": val,
        }

    skip = max(len(next(iter(runs.values()))[0]) // 10, WINDOW)
    seeds = sorted({parse_label(label)[1] for label in runs})
    precision_gaps, seed_gaps, val_precision, val_seed = [], [], [], []
    for s in seeds:
        a, b = f"f32_s{s}", f"bf16_s{s}"
        if a in runs and b in runs:
            precision_gaps.append(max_gap(smoothed[a], smoothed[b], skip))
            va, vb = summary["runs"][a]["final_val_loss"], summary["runs"][b]["final_val_loss"]
            if va is not None and vb is not None:
                val_precision.append(abs(va - vb))
    for dt in ("f32", "bf16"):
        labels = [f"{dt}_s{s}" for s in seeds if f"{dt}_s{s}" in runs]
        for i in range(len(labels)):
            for j in range(i + 1, len(labels)):
                seed_gaps.append(max_gap(smoothed[labels[i]], smoothed[labels[j]], skip))
                va, vb = summary["runs"][labels[i]]["final_val_loss"], summary["runs"][labels[j]]["final_val_loss"]
                if va is not None and vb is not None:
                    val_seed.append(abs(va - vb))
    if any(seed for seed in seeds):  # an f32/bf16 comparison
        summary["compared_from_step"] = skip + 1
        summary["max_abs_diff_f32_vs_bf16_same_seed"] = max(precision_gaps, default=None)
        summary["max_abs_diff_seed_to_seed"] = max(seed_gaps, default=None)
        summary["final_val_diff_f32_vs_bf16"] = max(val_precision, default=None)
        summary["final_val_diff_seed_to_seed"] = max(val_seed, default=None)
        p, n = summary["max_abs_diff_f32_vs_bf16_same_seed"], summary["max_abs_diff_seed_to_seed"]
        summary["within_noise"] = p is not None and n is not None and p <= n
    text = json.dumps(summary, indent=1)
    print(text)
    with open(out_json, "w") as f:
        f.write(text + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {"f32": "tab:blue", "bf16": "tab:orange"}
    others = ["tab:green", "tab:purple", "tab:brown", "tab:gray"]  # runs named otherwise, in order
    styles = ["-", "--", ":", "-."]
    for i, (label, (steps, loss, val, _)) in enumerate(runs.items()):
        dt, seed = parse_label(label)
        style = styles[seeds.index(seed) % len(styles)]
        name = f"{dt} compute, seed {seed}" if seed else f"{dt}: training loss"
        color = colors.get(dt, others[i % len(others)])
        ax.plot(steps, smoothed[label], style, color=color, label=name)
        if val:
            ax.plot([v[0] for v in val], [v[1] for v in val], "o", color=color, ms=4,
                    label=None if seed else f"{dt}: validation loss")
    ax.set_xlabel({"tokens": "tokens seen", "seconds": "wall-clock seconds (training + evaluation)"}.get(X_AXIS, "optimizer step"))
    ax.set_ylabel(f"training loss ({WINDOW}-step moving average); dots: validation")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
