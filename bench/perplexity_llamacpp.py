#!/usr/bin/env python3
"""llama.cpp's perplexity method computed by llama.cpp itself through llama-cpp-python (the pinned
0.3.2 in .venv): its tokenizer (add_special=True, as llama-perplexity tokenizes), its forward over
each chunk of n_ctx tokens with the first token replaced by BOS, NLL of positions n_ctx/2 .. n_ctx-2
predicting the next token, PPL and its error as llama-perplexity prints them. Runs without building
the llama-perplexity binary; bench/perplexity_peer.sh runs the binary itself.

  .venv/bin/python bench/perplexity_llamacpp.py MODEL.gguf TEXT --ctx 512 --chunks 20 [--corelm-json F]

With --corelm-json (the output of `corelm perplexity --json` on the same GGUF and settings) it also
prints the relative PPL difference and whether the token counts agree.
"""
import argparse
import json
import math
import sys
import time

import numpy as np
from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=-1)
    ap.add_argument("--corelm-json")
    ap.add_argument("--cache-f32", action="store_true", help="f32 KV cache (llama.cpp's default is f16)")
    a = ap.parse_args()

    kv = {"type_k": 0, "type_v": 0} if a.cache_f32 else {}  # GGML_TYPE_F32
    llm = Llama(model_path=a.model, n_ctx=a.ctx, n_batch=a.ctx, n_threads=1, logits_all=True, verbose=False, **kv)
    text = open(a.text, "rb").read()
    tokens = llm.tokenize(text, add_bos=True, special=False)
    add_bos = llm.metadata.get("tokenizer.ggml.add_bos_token", "true") != "false"
    bos = llm.token_bos()
    if len(tokens) < 2 * a.ctx:
        sys.exit(f"need at least {2 * a.ctx} tokens, the text has {len(tokens)}")
    n_chunk = len(tokens) // a.ctx
    if a.chunks >= 0:
        n_chunk = min(n_chunk, a.chunks)
    first = a.ctx // 2
    nll = nll2 = 0.0
    count = 0
    t0 = time.time()
    for c in range(n_chunk):
        chunk = list(tokens[c * a.ctx:(c + 1) * a.ctx])
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:a.ctx], dtype=np.float64)
        rows = logits[first:a.ctx - 1]
        mx = rows.max(axis=1, keepdims=True)
        lse = (mx + np.log(np.exp(rows - mx).sum(axis=1, keepdims=True)))[:, 0]
        targets = np.asarray(tokens[c * a.ctx + first + 1:(c + 1) * a.ctx])
        v = lse - rows[np.arange(len(targets)), targets]
        nll += v.sum()
        nll2 += (v * v).sum()
        count += len(v)
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    out = {"tokens": len(tokens), "ctx": a.ctx, "chunks": n_chunk, "bos": add_bos,
           "kv_cache": "f32" if a.cache_f32 else "f16", "ppl": ppl,
           "ppl_stderr": ppl * math.sqrt(var / (count - 1)) if var > 0 else 0.0, "wall_s": time.time() - t0,
           "llama_cpp_python": __import__("llama_cpp").__version__}
    if a.corelm_json:
        ours = json.load(open(a.corelm_json))
        out["corelm"] = {k: ours[k] for k in ("tokens", "chunks", "ppl", "ppl_stderr")}
        out["same_token_count"] = ours["tokens"] == len(tokens)
        out["ppl_rel_diff"] = abs(ours["ppl"] - ppl) / ppl
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
