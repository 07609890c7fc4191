#!/usr/bin/env python3
"""Markdown tables of bench/kv_types_vs_llamacpp.sh from its work dir (llama.cpp logs/JSON and
corelm JSON), one JSON line per row on stderr.

  llamacpp_tables.py ppl OUT P:LLAMA_LOG:CORELM_JSON...   corelm vs llama-perplexity, f16 KV
  llamacpp_tables.py quality OUT LLAMA_BASE CORELM_BASE K/V...   KV types side by side
  llamacpp_tables.py speed OUT TYPE...             decode tok/s per KV type and depth

llama-perplexity prints text, not JSON: the figures are read from its final lines
("Final estimate: PPL = x +/- y", "Mean PPL(Q)", "Mean    KLD", "Same top p") and /usr/bin/time's
"time: wall_s=... user_s=..." line the script appends.
"""
import json
import math
import os
import re
import struct
import sys


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def grab(pattern, text, cast=float, default=None):
    m = re.search(pattern, text, re.M)
    return tuple(cast(g) for g in m.groups()) if m else default


def timing(text):
    t = grab(r"time: wall_s=([\d.]+) user_s=([\d.]+) sys_s=([\d.]+)", text)
    return {"wall_s": t[0], "cpu_s": t[1] + t[2]} if t else {"wall_s": math.nan, "cpu_s": math.nan}


def llama_run(path):
    """One llama-perplexity log: PPL ± err (plain or KLD mode), KLD, top-1, chunks, time."""
    text = read(path)
    r = {"log": os.path.basename(path)} | timing(text)
    r["chunks"] = grab(r"(?:calculating perplexity|computing) over (\d+) chunks", text, int, (None,))[0]
    r["fa"] = grab(r"flash_attn\s*=\s*(\S+)", text, str, (None,))[0]
    ppl = grab(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", text) or grab(r"Mean PPL\(Q\)\s*:\s*([\d.]+) ± +([\d.]+)", text)
    if ppl is None:
        sys.exit(f"llamacpp_tables: no perplexity in {path} (see the log)")
    r["ppl"], r["ppl_stderr"] = ppl
    kld = grab(r"Mean +KLD:\s*([\d.eE+-]+) ± +([\d.eE+-]+)", text)
    if kld:
        r["kld"], r["kld_stderr"] = kld
        r["top1"], r["top1_stderr"] = grab(r"Same top p:\s*([\d.]+) ± +([\d.]+) %", text)
        r["dppl"], r["dppl_stderr"] = grab(r"Mean PPL\(Q\)-PPL\(base\)\s*:\s*([\d.-]+) ± +([\d.]+)", text)
    # llama_perf_context_print: "prompt eval time = X ms / N tokens"
    pe = grab(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", text)
    if pe:
        r["eval_ms"], r["eval_tokens"] = pe
    return r


def corelm_run(path):
    j = json.load(open(path))
    j.pop("running", None)
    for side in (".log", ".time"):  # /usr/bin/time's line, in the run's stderr log or its own file
        if os.path.exists(path[:-5] + side) and "time:" in read(path[:-5] + side):
            j |= timing(read(path[:-5] + side))
    return j


def ppl(out, runs):
    """runs: PRECISION:LLAMA_LOG:CORELM_JSON (paths relative to OUT), one comparison each."""
    tokens = read(f"{out}/ppl_llama_tokens.txt").strip() if os.path.exists(f"{out}/ppl_llama_tokens.txt") else "?"
    print("| engine | weights | KV | chunks (scored tokens) | tokens in file | PPL ± err | Δ vs llama.cpp (σ) "
          "| wall s | CPU s | tok/s (CPU) | CPU-time ratio corelm/llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        p, llog, cjson = run.split(":")
        lr = llama_run(f"{out}/{llog}")
        c = corelm_run(f"{out}/{cjson}")
        n_tok = c["chunks"] * c["ctx"]  # tokens each engine evaluates
        sigma = math.hypot(lr["ppl_stderr"], c["ppl_stderr"])
        for name, r in (("llama.cpp", lr), ("corelm", c)):
            print(json.dumps({"engine": name, "precision": p} | r), file=sys.stderr)
        print(f"| llama-perplexity | the GGUF's (native) | f16 | {lr['chunks']} ({lr['chunks'] * (c['ctx'] - 1 - c['ctx'] // 2):,}) "
              f"| {tokens} (llama-cpp-python 0.3.2 tokenizer) | {lr['ppl']:.4f} ± {lr['ppl_stderr']:.4f} | - "
              f"| {lr['wall_s']:.0f} | {lr['cpu_s']:.1f} | {n_tok / lr['cpu_s']:.1f} | - |")
        print(f"| corelm perplexity | {p} (GGUF dequantized) | f16 | {c['chunks']} ({c['scored']:,}) | {c['tokens']:,} "
              f"| {c['ppl']:.4f} ± {c['ppl_stderr']:.4f} | {c['ppl'] - lr['ppl']:+.4f} ({(c['ppl'] - lr['ppl']) / sigma:+.2f} σ) "
              f"| {c['wall_s']:.0f} | {c['cpu_s']:.1f} | {n_tok / c['cpu_s']:.1f} | {c['cpu_s'] / lr['cpu_s']:.2f} |")


def read_tokens(path, corelm):
    """The chunks' token ids stored in a base log-probability file (corelm's CLMLOGP1 or llama.cpp's
    _logits_ file), as one tuple."""
    with open(path, "rb") as f:
        if corelm:
            head = f.read(8 + 32)
            assert head[:8] == b"CLMLOGP1", path
            _, n_vocab, n_ctx, n_chunk = struct.unpack("<4I", head[8:24])
        else:
            head = f.read(8 + 12)
            assert head[:8] == b"_logits_", path
            n_ctx, n_vocab, n_chunk = struct.unpack("<3i", head[8:20])
        return n_ctx, n_chunk, struct.unpack(f"<{n_ctx * n_chunk}i", f.read(4 * n_ctx * n_chunk))


def quality(out, llama_base, corelm_base, pairs):
    if os.path.exists(llama_base) and os.path.exists(corelm_base):
        compare_tokens(llama_base, corelm_base)
    else:
        print("Chunk tokens: not compared (a base file is missing).\n")
    quality_table(out, pairs)


def compare_tokens(llama_base, corelm_base):
    lc, ln, lt = read_tokens(llama_base, False)
    cc, cn, ct = read_tokens(corelm_base, True)
    n = min(len(lt), len(ct))
    diff = next((i for i in range(n) if lt[i] != ct[i]), None)
    same = diff is None and lc == cc and ln == cn
    print(f"tokens: llama.cpp {ln} chunks x {lc}, corelm {cn} chunks x {cc}: "
          + ("identical token ids" if same else f"DIFFER (first at index {diff})"), file=sys.stderr)
    print(f"Chunk tokens: {'identical in both engines' if same else f'differ at index {diff}'} "
          f"({cn} chunks x {cc} tokens).\n")


def quality_table(out, pairs):
    print("| K / V | corelm PPL ± err | corelm KLD ± err | corelm top-1 | llama.cpp PPL ± err | llama.cpp KLD ± err "
          "| llama.cpp top-1 | KLD ratio corelm / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|")
    for pair in pairs:
        pair, _, variant = pair.partition("+")  # K/V+norot: llama.cpp with its K/V rotation off
        k, v = pair.split("/")
        cp = f"{out}/corelm/{k}_{v}.json" if not variant else "-"
        lp = f"{out}/llama_{k}_{v}{'_' + variant if variant else ''}.log"
        c = corelm_run(cp) if os.path.exists(cp) else None
        lr = llama_run(lp) if os.path.exists(lp) else None
        row = [f"{k} / {v}" + (" (llama.cpp rotation off)" if variant == "norot" else "")]
        ck = c.get("kld") if c else None
        if c:
            row += [f"{c['ppl']:.4f} ± {c['ppl_stderr']:.4f}",
                    f"{ck['mean_kld']:.6f} ± {ck['mean_kld_stderr']:.1e}" if ck else "(base)",
                    f"{ck['same_top_pct']:.2f}%" if ck else "-"]
        else:
            row += ["-", "-", "-"]
            if variant:  # the same type's corelm row is above: repeat it for the ratio
                c = corelm_run(f"{out}/corelm/{k}_{v}.json") if os.path.exists(f"{out}/corelm/{k}_{v}.json") else None
                ck = c.get("kld") if c else None
        if lr:
            row += [f"{lr['ppl']:.4f} ± {lr['ppl_stderr']:.4f}",
                    f"{lr['kld']:.6f} ± {lr['kld_stderr']:.1e}" if "kld" in lr else "(base)",
                    f"{lr['top1']:.2f}%" if "kld" in lr else "-"]
        else:
            row += ["(no such type)", "-", "-"]
        row.append(f"{ck['mean_kld'] / lr['kld']:.2f}" if ck and lr and lr.get("kld") else "-")
        print(json.dumps({"pair": pair + (f"+{variant}" if variant else ""), "corelm": c and {x: c.get(x) for x in ("ppl", "ppl_stderr", "kld", "seconds")},
                          "llama": lr}), file=sys.stderr)
        print("| " + " | ".join(row) + " |")


def speed(out, types):
    precs = os.environ.get("SPEED_PRECISIONS", "bf16 q4").split()
    head = " | ".join(f"corelm {p} tok/s ± sd | {p} / llama.cpp" for p in precs)
    print(f"| K / V | test | llama.cpp tok/s ± sd (the GGUF) | {head} | corelm KV bytes |")
    print("|---|---|---|" + "---|---|" * len(precs) + "---|")
    for t in types:
        k, v = (t.split("/") + [t])[:2]
        lj = json.load(open(f"{out}/speed_llama_{k}_{v}.json"))
        cjs = {p: json.load(open(f"{out}/speed_corelm_{k}_{v}_{p}.json")) for p in precs}
        ctests = {p: {(x["n_gen"], x["n_prompt"], x["n_depth"]): x for x in cj["tests"]} for p, cj in cjs.items()}
        for lt in lj:
            key = (lt["n_gen"], lt["n_prompt"], lt["n_depth"])
            name = (f"tg{lt['n_gen']}" if lt["n_gen"] else f"pp{lt['n_prompt']}") + (f" @ d{lt['n_depth']}" if lt["n_depth"] else "")
            cells, kvb = [], "-"
            for p in precs:
                ct = ctests[p].get(key)
                print(json.dumps({"pair": f"{k}/{v}", "test": name, "precision": p, "llama_ts": lt["avg_ts"],
                                  "llama_sd": lt["stddev_ts"], "llama_build": lt.get("build_commit"),
                                  "corelm_ts": ct and ct["avg_ts"], "corelm_sd": ct and ct["stddev_ts"]}), file=sys.stderr)
                cells.append(f"{ct['avg_ts']:.1f} ± {ct['stddev_ts']:.1f}" if ct else "-")
                cells.append(f"{ct['avg_ts'] / lt['avg_ts']:.2f}" if ct else "-")
                if ct:
                    kvb = f"{ct['kv_bytes']:,}"
            print(f"| {k} / {v} | {name} | {lt['avg_ts']:.1f} ± {lt['stddev_ts']:.1f} | {' | '.join(cells)} | {kvb} |")


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "ppl":
        ppl(out, sys.argv[3:])
    elif mode == "quality":
        quality(out, sys.argv[3], sys.argv[4], sys.argv[5:])
    elif mode == "speed":
        speed(out, sys.argv[3:])
    else:
        sys.exit(f"llamacpp_tables: unknown mode {mode}")
