#!/usr/bin/python3
"""GEMM roofline plot from `corelm bench gemm --json` and `corelm bench memory --json`.

    python3 bench/plot_roofline.py gemm.json memory.json docs/img/roofline.png

x: arithmetic intensity (flops per byte of compulsory traffic: X and Y in fp32, W in fp32 for
gemm_f32 and in bf16 for linear_bf16); y: GFLOP/s. Ceilings: the measured fp32 FMA and bf16
vdpbf16ps peaks, and the measured read bandwidth of L2 and DRAM (from bench memory). Needs
matplotlib (Debian: python3-matplotlib); nothing in the product depends on it.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load_json(path):
    with open(path) as f:
        return json.load(f)


def bandwidth_at(points, lo, hi):
    """Best read GB/s among working sets in [lo, hi) bytes (a cache level's plateau)."""
    vals = [p["read_gb_s"] for p in points if lo <= p["bytes"] < hi]
    return max(vals) if vals else None


def intensity(r, weight_bytes):
    m, k, n = r["M"], r["K"], r["N"]
    flops = 2.0 * m * k * n
    traffic = 4.0 * m * k + weight_bytes * k * n + 4.0 * m * n
    return flops / traffic


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    gemm, mem, out = load_json(argv[1]), load_json(argv[2]), argv[3]
    pts = mem["points"]
    bw = {
        "L2 (256 KiB-1 MiB)": bandwidth_at(pts, 256 << 10, (1 << 20) + 1),
        "L3 (4-32 MiB)": bandwidth_at(pts, 4 << 20, (32 << 20) + 1),
        "DRAM (>= 128 MiB)": bandwidth_at(pts, 128 << 20, 1 << 62),
    }
    peaks = {"fp32 FMA peak": gemm["peak_fp32_gflops"], "bf16 vdpbf16ps peak": gemm["peak_bf16_gflops"]}

    fig, ax = plt.subplots(figsize=(9, 6))
    xs = [0.05, 2000]
    for (name, peak), style in zip(peaks.items(), ["-", "--"]):
        if peak:
            ax.plot(xs, [peak, peak], "k" + style, lw=1.2)
            ax.text(xs[1], peak, f" {name} {peak:.0f}", va="center", fontsize=8)
    top = max(p for p in peaks.values() if p)
    for (name, gbs), color in zip(bw.items(), ["tab:green", "tab:purple", "tab:red"]):
        if gbs:
            x_ridge = top / gbs
            ax.plot([xs[0], x_ridge], [gbs * xs[0], top], color=color, lw=1.2)
            ax.text(xs[0] * 1.2, gbs * xs[0] * 1.4, f"{name}: {gbs:.0f} GB/s", color=color, fontsize=8,
                    rotation=28)

    series = [("gemm_f32", 4.0, "o", "tab:blue"), ("linear_bf16", 2.0, "s", "tab:orange")]
    for key, wbytes, marker, color in series:
        x = [intensity(r, wbytes) for r in gemm["results"]]
        y = [r[key + "_gflops"] for r in gemm["results"]]
        ax.scatter(x, y, marker=marker, color=color, s=22, label=f"corelm {key}", zorder=3)
    if gemm["results"] and "onednn_bf16_gflops" in gemm["results"][0]:
        x = [intensity(r, 2.0) for r in gemm["results"]]
        ax.scatter(x, [r["onednn_bf16_gflops"] for r in gemm["results"]], marker="x", color="tab:gray", s=22,
                   label="oneDNN bf16 matmul", zorder=2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(xs[0], xs[1] * 8)
    ax.set_ylim(1, top * 2)
    ax.set_xlabel("arithmetic intensity (flop / byte of X, W, Y)")
    ax.set_ylabel("GFLOP/s (one core)")
    ax.set_title(f"corelm GEMM roofline: isa {gemm['isa']}, {gemm['threads']} thread(s)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv)
