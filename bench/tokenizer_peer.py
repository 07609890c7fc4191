#!/usr/bin/env python3
"""Peer figures for docs/BENCHMARKS.md: one-thread encode throughput of tiktoken and Hugging Face
tokenizers on the same file and tokenizer as `corelm bench tokenizer`, measured in the same run.

  .venv/bin/python bench/tokenizer_peer.py --corelm build/release/corelm \
      --vocab ../shared/data/tokenizers/gpt2/vocab.json --input ../shared/data/wikitext-2/wiki.test.raw
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "tokenizer"))
from oracle_tokenize import byte_decoder, load_text  # noqa: E402


def best(fn, seconds=2.0):
    times, total = [], 0.0
    while len(times) < 3 or total < seconds:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        total += dt
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corelm", required=True)
    ap.add_argument("--vocab", required=True, help="GPT-2 vocab.json (tokenizer.json must be beside it)")
    ap.add_argument("--input", required=True)
    a = ap.parse_args()
    os.sched_setaffinity(0, {0})
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    text = open(a.input, encoding="utf-8").read()
    mb = len(text.encode("utf-8")) / 1e6
    rows = []
    ours = json.loads(subprocess.run(["taskset", "-c", "0", a.corelm, "bench", "tokenizer", "--tokenizer",
                                      os.path.join(os.path.dirname(a.vocab), "tokenizer.json"), "--input", a.input,
                                      "--json"], check=True, capture_output=True, text=True).stdout)
    rows.append(("corelm", ours["encode_mb_s"], ours["tokens"]))

    import tiktoken
    dec = byte_decoder()
    vocab = json.loads(load_text(a.vocab))
    ranks = {bytes(dec[c] for c in k): v for k, v in vocab.items() if k != "<|endoftext|>"}
    pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding("gpt2_local", pat_str=pat, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
    ids = enc.encode_ordinary(text)
    rows.append(("tiktoken 0.7.0 (encode_ordinary)", mb / best(lambda: enc.encode_ordinary(text)), len(ids)))

    from tokenizers import Tokenizer
    import tokenizers
    hf = Tokenizer.from_file(os.path.join(os.path.dirname(a.vocab), "tokenizer.json"))
    n = len(hf.encode(text, add_special_tokens=False).ids)
    rows.append((f"HF tokenizers {tokenizers.__version__} (encode)", mb / best(lambda: hf.encode(text, add_special_tokens=False)), n))
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"load average during run: {' '.join(load)}")
    print("| engine | encode MB/s (1 thread) | tokens |")
    print("|---|---:|---:|")
    for name, speed, count in rows:
        print(f"| {name} | {speed:.1f} | {count} |")
    print(f"corelm full result: {json.dumps(ours)}")


if __name__ == "__main__":
    main()
