#!/usr/bin/env python3
"""Turns the raw outputs of bench/llama_cpp_peer.sh into bench-results/llama_cpp.json and a markdown
table (stdout): llama.cpp (llama-bench, llama-batched-bench) next to `corelm bench model`.

  bench/llama_cpp_report.py RAW_DIR "bf16 q8_0 f32" OUT.json
"""
import datetime
import json
import os
import sys


def read_json(path):
    with open(path) as f:
        return json.load(f)


def llama_bench_figures(path):
    """pp512 / tg128 tokens/s from `llama-bench -o json` (a list of test records)."""
    figures = {}
    for rec in read_json(path):
        if rec.get("n_prompt", 0) > 0 and rec.get("n_gen", 0) == 0:
            figures[f"pp{rec['n_prompt']}_tok_s"] = rec["avg_ts"]
            figures[f"pp{rec['n_prompt']}_stddev"] = rec.get("stddev_ts")
        elif rec.get("n_gen", 0) > 0 and rec.get("n_prompt", 0) == 0:
            figures[f"tg{rec['n_gen']}_tok_s"] = rec["avg_ts"]
            figures[f"tg{rec['n_gen']}_stddev"] = rec.get("stddev_ts")
        for key in ("build_commit", "build_number", "cpu_info", "model_type", "model_size", "model_n_params",
                    "n_threads", "type_k"):
            if key in rec:
                figures.setdefault("info", {})[key] = rec[key]
    return figures


def batched_figures(path):
    """Generated tokens/s per batch size from `llama-batched-bench --output-format jsonl`."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rec = json.loads(line)
                out[str(rec["pl"])] = {"generated_tok_s": rec["speed_tg"], "prompt": rec["pp"], "steps": rec["tg"],
                                       "n_threads": rec["n_threads"]}
    return out


def core_share(path):
    """(user + sys) / elapsed of one timed run (see timed() in llama_cpp_peer.sh), or None."""
    try:
        elapsed, user, system = (float(x) for x in open(path).read().split()[-3:])
    except (OSError, ValueError):
        return None
    return (user + system) / elapsed if elapsed > 0 else None


def corelm_figures(raw, precision):
    path = os.path.join(raw, f"corelm_{precision}.json")
    if not os.path.exists(path):
        return None
    main = read_json(path)
    b32 = read_json(os.path.join(raw, f"corelm_{precision}_b32.json"))
    return {"scored_tok_s": main["scored_tok_s"], "scored_shape": main["scored_shape"],
            "decode_b1_tok_s": main["decode_b1_tok_s"],
            "generated_tok_s": {str(main["generated_batch"]): main["generated_tok_s"],
                                str(b32["generated_batch"]): b32["generated_tok_s"]},
            "cpu_time_tok_s": main.get("cpu_time_tok_s"), "isa": main.get("isa"), "threads": main.get("threads")}


def fmt(v):
    return "—" if v is None else f"{v:,.0f}"


def main():
    raw, dtypes, out_path = sys.argv[1], sys.argv[2].split(), sys.argv[3]
    llama = {}
    for dt in dtypes:
        figures = llama_bench_figures(os.path.join(raw, f"bench_{dt}.json"))
        figures["batched"] = batched_figures(os.path.join(raw, f"batched_{dt}.jsonl"))
        figures["core_share"] = {"llama_bench": core_share(os.path.join(raw, f"time_bench_{dt}.txt")),
                                 "batched_bench": core_share(os.path.join(raw, f"time_batched_{dt}.txt"))}
        llama[dt] = figures
    corelm = {p: c for p in ("bf16", "int8") if (c := corelm_figures(raw, p)) is not None}

    def read(path):
        return open(os.path.join(raw, path)).read().strip() if os.path.exists(os.path.join(raw, path)) else None

    rows = [  # (key, label, llama.cpp getter, corelm getter)
        ("prefill", "prefill: llama.cpp pp512 / corelm scored 16x256 (no LM head)",
         lambda l: l.get("pp512_tok_s"), lambda c: c["scored_tok_s"]),
        ("decode_b1", "decode batch 1: tg128 / decode_b1 (128 steps)",
         lambda l: l.get("tg128_tok_s"), lambda c: c["decode_b1_tok_s"]),
        ("batched_b16", "batched decode B=16, 128 steps (generated tok/s)",
         lambda l: l["batched"].get("16", {}).get("generated_tok_s"), lambda c: c["generated_tok_s"].get("16")),
        ("batched_b32", "batched decode B=32, 128 steps (generated tok/s)",
         lambda l: l["batched"].get("32", {}).get("generated_tok_s"), lambda c: c["generated_tok_s"].get("32")),
    ]
    # corelm bf16 against llama.cpp bf16 (same weight bytes); corelm int8 against llama.cpp q8_0.
    ratios = {}
    for key, _, lget, cget in rows:
        for prec, c in corelm.items():
            peer = "q8_0" if prec == "int8" else "bf16"
            if peer in llama and lget(llama[peer]) and cget(c):
                ratios.setdefault(f"corelm_{prec}_over_llama_cpp_{peer}", {})[key] = cget(c) / lget(llama[peer])

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "llama_cpp": {"source": "llama.cpp vendored in llama-cpp-python==0.3.2 (bench/build_llama_cpp.sh)",
                      "threads": 1, "by_weight_type": llama},
        "corelm": corelm,
        "ratios": ratios,
        "load": {"before": read("uptime_before.txt"), "after": read("uptime_after.txt")},
    }
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(tmp, out_path)

    cols = [f"llama.cpp {dt}" for dt in dtypes] + [f"corelm {p}" for p in corelm]
    print(f"\nllama.cpp peer, 1 thread, tokens/s ({result['date']}; load {result['load']['before']})\n")
    print("| figure | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for _, label, lget, cget in rows:
        cells = [fmt(lget(llama[dt])) for dt in dtypes] + [fmt(cget(c)) for c in corelm.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")
    shares = [v for dt in dtypes for v in llama[dt]["core_share"].values() if v is not None]
    if shares:
        print(f"\nshare of core {'/'.join(f'{v:.2f}' for v in shares)} for the llama.cpp runs "
              "((user + sys) / elapsed; below ~0.95 the machine was busy and wall-clock figures are low)")
    for name, by_figure in ratios.items():
        print(f"\n{name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in by_figure.items()))
    print(f"\nJSON: {out_path}")


if __name__ == "__main__":
    main()
