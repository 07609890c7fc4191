#!/usr/bin/env python3
"""Splits `perf script` samples of a `corelm bench model` run into its workloads and summarises them.

  profile_summary.py split KIND PERF_SCRIPT_TXT OUT_JSON   KIND: infer_bf16 | infer_int8 | gen_bf16 | train
  profile_summary.py summary OUTDIR                        writes OUTDIR/summary.json, prints a table

`bench model` runs its figures one after another in one process, so a workload is identified by the
bench function on the call stack (DWARF unwinding): prefill_rate = scored, decode_rate = decode
(run with --gen-batch 1, so both decode figures are batch 1; gen_bf16 keeps --gen-batch 16 and
ends the batched figure at the last multi-row tile sample, as batch 1 runs only 1-row tiles), train_rate + train::train = training;
the full-softmax run comes before the sampled one, which begins where the second train_rate call
sets up its model (the last non-train::train sample before the first sampled-loss frame); both
train::train calls of each count (warm-up and measured), their checkpoint saves do not.
Standard library only (profile_targets.sh calls this).
"""
import json
import os
import re
import sys

CATEGORIES = [  # first match wins; the regexes see the shortened symbol
    ("quantize", r"quantize"),  # int8 path: per-row activation quantization before each linear
    ("linear_int8", r"dp_tile|linear_int8|int8_tile"),
    ("linear_bf16", r"widen_tile|linear_bf16|bf16_tile"),
    ("gemm_f32", r"f32_tile|gemm_f32"),
    ("gemm_pack", r"pack_b_panel|pack_a_panel|transpose8x8"),
    ("lm_head_loss", r"lm_head|cross_entropy|train_exp_shift_sum|train_dot"),
    ("attention", r"attention|transpose_sum16"),
    ("optimizer", r"AdamW|clip"),
    ("elementwise", r"rms_norm|swiglu|rope|silu|fused_|train_|softmax|accumulate|add_"),
    ("memory", r"memmove|memset|memcpy|strided_copy|Storage::|malloc|free|_int_"),
]
SAMPLED_MARK = re.compile(r"sampled_linear_cross_entropy|draw_candidates|UnigramProposal|Sampled", re.I)


def short(sym):
    sym = sym.replace("(anonymous namespace)::", "").replace("corelm::", "")
    return re.sub(r"\s*\(inlined\)$", "", sym).strip()


def category(sym):
    for name, rx in CATEGORIES:
        if re.search(rx, sym):
            return name
    return "other"


def read_samples(path):
    """Yields (time_s, period_ns, [frame symbols, innermost first]) from `perf script -F time,period,ip,sym`."""
    head, frames = None, []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            if not line[0].isspace():
                if head:
                    yield head[0], head[1], frames
                m = re.match(r"\s*(\d+\.\d+):\s+(\d+)", line)
                head, frames = ((float(m.group(1)), int(m.group(2))) if m else None), []
            else:
                parts = line.strip().split(None, 1)
                frames.append(short(parts[1]) if len(parts) > 1 else "[unknown]")
    if head:
        yield head[0], head[1], frames


def tile_rows(sym):
    """Rows of a linear micro-kernel tile (widen_tile<Zmm, ROWS, ..>, dp_tile<ROWS, ..>), else 0."""
    m = re.search(r"(?:widen_tile|dp_tile)<(?:[^<>]*?Zmm,\s*)?(\d+),", sym)
    return int(m.group(1)) if m else 0


def has(frames, needle):
    return any(needle in fr for fr in frames)


def step_samples(part):
    """Optimizer steps of both train::train calls of a train_rate (the one-step warm-up call and the
    measured one), without their checkpoint saves (not in the bench's tok/s; mostly kernel time)."""
    return [s for s in part if has(s[2], "train::train") and not has(s[2], "save_checkpoint")]


def phase_stats(samples):
    """Self-symbol shares, category shares and CPU seconds of one workload's samples."""
    total = sum(p for _, p, _ in samples) or 1
    by_sym, by_cat = {}, {}
    for _, p, fr in samples:
        sym = fr[0] if fr else "[unknown]"
        by_sym[sym] = by_sym.get(sym, 0) + p
        cat = category(sym)
        by_cat[cat] = by_cat.get(cat, 0) + p
    top = sorted(by_sym.items(), key=lambda kv: -kv[1])
    one_row = sum(p for _, p, fr in samples if fr and tile_rows(fr[0]) == 1)
    return {
        "samples": len(samples),
        "one_row_tile_share": one_row / total,
        "cpu_s": total / 1e9,
        "window": [min(t for t, _, _ in samples), max(t for t, _, _ in samples)] if samples else None,
        "top_symbols": [{"symbol": s, "share": v / total} for s, v in top[:15]],
        "categories": {k: v / total for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
    }


def split(kind, script, out):
    samples = sorted(read_samples(script), key=lambda s: s[0])
    phases = {}
    if kind.startswith("infer_"):
        prec = kind.split("_", 1)[1]
        phases["scored_" + prec] = [s for s in samples if has(s[2], "prefill_rate")]
        phases["decode_b1_" + prec] = [s for s in samples if has(s[2], "decode_rate")]
    elif kind == "gen_bf16":
        dec = [s for s in samples if has(s[2], "decode_rate")]
        last_multi = max((t for t, _, fr in dec if fr and tile_rows(fr[0]) > 1), default=None)
        batched = [s for s in dec if last_multi is not None and s[0] <= last_multi]
        phases["generated_b16_bf16"] = batched
    elif kind == "train":
        tr = [s for s in samples if has(s[2], "train_rate")]
        first_sampled = next((i for i, s in enumerate(tr) if any(SAMPLED_MARK.search(f) for f in s[2])), None)
        boundary = first_sampled if first_sampled is not None else len(tr)
        for i in range(boundary - 1, -1, -1):  # back to the second train_rate call's setup
            if not has(tr[i][2], "train::train"):
                boundary = i + 1
                break
        phases["train_full"], phases["train_sampled"] = step_samples(tr[:boundary]), step_samples(tr[boundary:])
    else:
        sys.exit(f"profile_summary: unknown kind {kind}")
    result = {"kind": kind, "total_samples": len(samples), "phases": {k: phase_stats(v) for k, v in phases.items()}}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    for name, st in result["phases"].items():
        print(f"{name}: {st['samples']} samples, {st['cpu_s']:.2f} CPU s, window {st['window']}")
        if not st["samples"]:
            print(f"warning: no samples of {name}: the bench function was not found on any call stack "
                  "(needs perf record --call-graph dwarf and a corelm with its symbols)", file=sys.stderr)


def load(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def parse_stat(path):
    """perf stat -x, output -> {event: value or None when not supported/counted}."""
    counters = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) < 3 or line.startswith("#"):
                    continue
                val = parts[0]
                counters[parts[2]] = None if val.startswith("<") else float(val)
    except OSError:
        pass
    return counters


def l3_read_gb_s(mems):
    """Median read bandwidth at 8-32 MiB working sets over the memory runs (a tiny decode step
    streams 8-17 MB of weights: more than L2, well inside L3)."""
    vals = sorted(p["read_gb_s"] for m in mems for p in (m or {}).get("points", [])
                  if (8 << 20) <= p["bytes"] <= (32 << 20))
    return vals[len(vals) // 2] if vals else None


def head_alone_gb_s(gemm, prec, k=256, n=16384):
    """Weight bandwidth of the linear kernel on the M=1 LM-head shape alone (`corelm bench gemm`)."""
    for r in (gemm or {}).get("results", []):
        if (r.get("M"), r.get("K"), r.get("N")) == (1, k, n) and r.get(f"linear_{prec}_us"):
            return r[f"weight_bytes_{prec}"] / r[f"linear_{prec}_us"] / 1e3
    return None


def derived(name, bench, stats, peaks, l3):
    """Achieved bandwidth / throughput of the dominant kernel class, from tok/s and its cycle share."""
    cfg = bench.get("config", {})
    body = bench.get("params_non_embedding", 0)
    head = cfg.get("vocab_size", 0) * cfg.get("hidden_size", 0)
    cats = stats["categories"]
    d = {}
    # Attention FLOPs per token (QK^T and PV, 2 FLOPs each per head dim per context position) at the
    # figure's mean context: causal prefill of T tokens sees (T+1)/2, decoding `steps` from 0 the same.
    ctx = bench.get("scored_shape", [16, 256])[1] if name.startswith("scored") else bench.get("generated_steps", 128)
    attn_flops = (cfg.get("num_hidden_layers", 0) * cfg.get("num_attention_heads", 0) * 4 * cfg.get("head_dim", 0)
                  * (ctx + 1) / 2)
    if name.startswith("decode_b1"):
        prec = name.rsplit("_", 1)[1]
        cat = "linear_" + prec
        bytes_tok = (body + head) * (2 if prec == "bf16" else 1)
        tok_s = bench.get("cpu_time_tok_s", {}).get("decode_b1")
        share = cats.get(cat, 0)
        d.update(tok_s_cpu=tok_s, weight_bytes_per_token=bytes_tok, kernel_class=cat, kernel_share=share,
                 l3_read_gb_s=l3)
        if tok_s and share:
            d["kernel_gb_s"] = bytes_tok * tok_s / share / 1e9
        if l3:
            d["roofline_tok_s_at_l3"] = l3 * 1e9 / bytes_tok
        d["lm_head_alone_gb_s"] = peaks.get("head_alone_gb_s_" + prec)
    elif name.startswith(("scored", "generated")):
        prec = name.rsplit("_", 1)[1]
        cat = "linear_" + prec
        scored = name.startswith("scored")
        tok_s = bench.get("cpu_time_tok_s", {}).get("scored" if scored else "generated")
        share = cats.get(cat, 0)
        flops = bench.get("flops_per_token_no_head", 2 * body) + (0 if scored else 2 * head)
        d.update(tok_s_cpu=tok_s, flops_per_token=flops, kernel_class=cat, kernel_share=share)
        if tok_s and share:
            d["kernel_gflop_s"] = flops * tok_s / share / 1e9
        d["peak_gflop_s"] = peaks.get("peak_int8_gops" if prec == "int8" else "peak_fp32_gflops")
        if prec == "bf16":
            d["peak_vdpbf16ps_gflop_s"] = peaks.get("peak_bf16_gflops")
    if not name.startswith("train") and d.get("tok_s_cpu") and cats.get("attention"):
        d["attention_share"] = cats["attention"]
        d["attention_gflop_s"] = attn_flops * d["tok_s_cpu"] / cats["attention"] / 1e9
    if name.startswith("train"):
        batch, seq = bench.get("train_shape", [8, 128])
        negatives = bench.get("train_sampled_negatives", 1024)
        # forward 2 + backward 4 FLOPs per weight; the sampled head touches ~negatives + distinct
        # targets rows (about 2 x negatives for uniform random tokens), not the whole vocabulary.
        head_rows = cfg.get("vocab_size", 0) if name == "train_full" else 2 * negatives
        flops = 6 * (body + head_rows * cfg.get("hidden_size", 0))
        steps = bench.get("_train_steps", 4) + 2  # warm-up call (1 step) + measured call (steps + 1)
        tok_s = steps * batch * seq / stats["cpu_s"] if stats["cpu_s"] else None
        share = cats.get("gemm_f32", 0) + cats.get("gemm_pack", 0) + cats.get("lm_head_loss", 0)
        d.update(tok_s_cpu_from_samples=tok_s, flops_per_token=flops, kernel_class="gemm_f32+gemm_pack+lm_head_loss",
                 kernel_share=share, tile_share=cats.get("gemm_f32", 0), peak_gflop_s=peaks.get("peak_fp32_gflops"),
                 gemm_alone_gflop_s=peaks.get("gemm_f32_alone_gflops_m1024"))
        if tok_s and share:
            d["kernel_gflop_s"] = flops * tok_s / share / 1e9
        if tok_s and cats.get("gemm_f32"):
            d["tile_gflop_s"] = flops * tok_s / cats["gemm_f32"] / 1e9
        if peaks.get("peak_fp32_gflops"):
            d["roofline_tok_s_at_peak"] = peaks["peak_fp32_gflops"] * 1e9 / flops
    return d


WALL_KEYS = {"scored": "scored_tok_s", "decode_b1": "decode_b1_tok_s", "generated": "generated_tok_s",
             "train_full": "train_tok_s", "train_sampled": "train_sampled_tok_s"}
TARGETS = {"scored": 20000, "decode_b1": 4500, "generated": 11000, "train_full": 3500, "train_sampled": 6600}


def summary(outdir):
    events = load(os.path.join(outdir, "events.json"), {})
    gemm = load(os.path.join(outdir, "gemm.json"), {})
    mems = [load(os.path.join(outdir, f)) for f in sorted(os.listdir(outdir)) if re.match(r"memory.*\.json$", f)]
    l3 = l3_read_gb_s(mems)
    peaks = {k: gemm.get(k) for k in ("peak_fp32_gflops", "peak_bf16_gflops", "peak_int8_gops")}
    peaks["head_alone_gb_s_int8"] = head_alone_gb_s(gemm, "int8")
    train_shapes = [r["gemm_f32_gflops"] for r in gemm.get("results", []) if r.get("M") == 1024 and r.get("gemm_f32_gflops")]
    peaks["gemm_f32_alone_gflops_m1024"] = sorted(train_shapes)[len(train_shapes) // 2] if train_shapes else None
    peaks["head_alone_gb_s_bf16"] = head_alone_gb_s(load(os.path.join(outdir, "gemm_widen.json"), {}), "bf16")
    rows = []
    for run in ("infer_bf16", "infer_int8", "gen_bf16", "train"):
        ph = load(os.path.join(outdir, f"phases_{run}.json"))
        bench = load(os.path.join(outdir, f"bench_{run}.json"), {})
        if not ph:
            continue
        bench["_train_steps"] = int(os.environ.get("PROFILE_TRAIN_STEPS", "6"))
        counters = parse_stat(os.path.join(outdir, f"stat_{run}.txt"))
        cyc, ins = counters.get("cycles:u"), counters.get("instructions:u")
        for name, st in ph["phases"].items():
            key = next(v for k, v in WALL_KEYS.items() if name.startswith(k))
            top5 = st["top_symbols"][:5]
            rows.append({
                "workload": name,
                "run": run,
                "tok_s_wall": bench.get(key),
                "target_tok_s": next(v for k, v in TARGETS.items() if name.startswith(k)),
                "samples": st["samples"],
                "ipc": ins / cyc if cyc and ins else None,
                "ipc_scope": "whole bench process" if cyc and ins else "unavailable (no hardware PMU events)",
                "top5": top5,
                "top5_share": sum(t["share"] for t in top5),
                "categories": st["categories"],
                "cache_miss_rates": {k: v for k, v in counters.items() if "miss" in k} or None,
                "process_counters": counters,
                "derived": derived(name, bench, st, peaks, l3),
                "stat_file": f"stat_{run}.txt",
                "report_file": f"report_{name}.txt",
            })
    result = {"events": events, "peaks": peaks, "l3_read_gb_s_8_32mib_median": l3, "workloads": rows}
    with open(os.path.join(outdir, "summary.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("| workload | target | tok/s wall | tok/s CPU | samples | top symbol (share) | top-5 share | derived |")
    print("|---|---:|---:|---:|---:|---|---:|---|")
    fmt = lambda v: f"{v:.0f}" if v else "-"
    for r in rows:
        t = r["top5"][0] if r["top5"] else {"symbol": "-", "share": 0}
        d = r["derived"]
        extra = ", ".join(f"{k}={v:.3g}" for k, v in d.items() if isinstance(v, float) and ("gb_s" in k or "gflop" in k))
        cpu = d.get("tok_s_cpu") or d.get("tok_s_cpu_from_samples")
        print(f"| {r['workload']} | {r['target_tok_s']} | {fmt(r['tok_s_wall'])} | {fmt(cpu)} | {r['samples']} "
              f"| {t['symbol'][:60]} ({100 * t['share']:.1f}%) | {100 * r['top5_share']:.1f}% | {extra} |")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "split":
        split(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        sys.exit(__doc__)
