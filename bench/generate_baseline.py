#!/usr/bin/env python3
"""Baseline generation throughput: corelm's fp32 reference path vs PyTorch (Hugging Face
LlamaForCausalLM with its KV cache) on the `tiny` preset with the same random weights.

Greedy, batch 1, a 32-token prompt, 128 new tokens, one thread each (torch.set_num_threads(1);
corelm --threads 1), both under `taskset -c 0`, measured in the same run. The script writes a
model directory (config.json, model.safetensors with HF names, a synthetic byte-level BPE
tokenizer.json with the full 16384-token vocabulary), so both engines run identical weights and
the greedy tokens can be compared too.

  .venv/bin/python bench/generate_baseline.py --corelm build/<dir>/corelm [--json out.json]
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

TINY = dict(vocab_size=16384, hidden_size=256, intermediate_size=640, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
            rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
PROMPT_TOKENS = 32
NEW_TOKENS = 128


def byte_level_alphabet():
    """GPT-2's bytes -> printable characters map (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def synthetic_tokenizer(vocab_size):
    """256 byte tokens, pair merges of byte characters (letters first), one special token."""
    alphabet = byte_level_alphabet()
    chars = [alphabet[b] for b in range(256)]
    vocab = {c: i for i, c in enumerate(chars)}
    preferred = [alphabet[b] for b in b" etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ.,"]
    order = preferred + [c for c in chars if c not in preferred]
    merges = []
    for a in order:
        for b in order:
            if len(vocab) >= vocab_size - 1:
                break
            if a + b in vocab:
                continue
            vocab[a + b] = len(vocab)
            merges.append(f"{a} {b}")
    eos = vocab_size - 1
    return {
        "version": "1.0",
        "added_tokens": [{"id": eos, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def prompt_of_length(tokenizer, n):
    """A prompt text that encodes to exactly n tokens."""
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex jolly vampires".split()
    text = ""
    i = 0
    while True:
        for ch in (" " if text else "") + words[i % len(words)]:
            candidate = text + ch
            if len(tokenizer.encode(candidate).ids) > n:
                return text
            text = candidate
        i += 1


def write_model_dir(out_dir, seed):
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**TINY, hidden_act="silu", attention_bias=False, initializer_range=0.02,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None, torch_dtype="float32")
    model = LlamaForCausalLM(config).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(TINY, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               torch_dtype="float32", initializer_range=0.02)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(synthetic_tokenizer(TINY["vocab_size"]), f, ensure_ascii=False)
    return model


def torch_generate(model, ids, new_tokens, repeats):
    """Greedy decoding with HF's KV cache (past_key_values); prefill and decode timed apart.
    One untimed warm-up, then `repeats` timed runs; the best run is reported."""
    import torch
    best = None
    with torch.inference_mode():
        for rep in range(repeats + 1):
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            out = model(input_ids=x, use_cache=True)
            nxt = out.logits[0, -1].argmax().item()
            t1 = time.perf_counter()
            past, tokens = out.past_key_values, [nxt]
            for _ in range(new_tokens - 1):
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[0, -1].argmax().item()
                tokens.append(nxt)
            t2 = time.perf_counter()
            r = dict(prefill_tok_s=len(ids) / (t1 - t0), decode_tok_s=(new_tokens - 1) / (t2 - t1),
                     total_tok_s=new_tokens / (t2 - t0), tokens=tokens)
            if rep > 0 and (best is None or r["decode_tok_s"] > best["decode_tok_s"]):
                best = r
        # The stock generate() loop (logits processors, stopping criteria) for reference.
        t0 = time.perf_counter()
        g = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           use_cache=True, pad_token_id=0)
        best["generate_api_tok_s"] = new_tokens / (time.perf_counter() - t0)
        best["generate_api_tokens"] = g[0, len(ids):].tolist()
    return best


def markdown(r):
    """The docs/BENCHMARKS.md section body for one result."""
    c, t = r["corelm"], r["torch"]
    load = ", ".join(f"{x:.1f}" for x in r["load_average"])
    return "\n".join([
        f"Measured {r['date']} on {r['machine']} (`lscpu` model name); load average {load} during the run",
        f"(the 2-core machine was shared with other builds, so absolute figures are noisy; both engines",
        f"ran alternately in the same run and each reports its best of {r['rounds'] * r['repeats']} runs).",
        "",
        f"Workload: `tiny` preset ({r['config'].split(' (', 1)[1]}; {r['workload']}.",
        "",
        "| engine | prefill tok/s | decode tok/s |",
        "|---|---:|---:|",
        f"| corelm (fp32 reference kernels, KV cache) | {c['prefill_tok_s']:.0f} | {c['decode_tok_s']:.0f} |",
        f"| PyTorch {r['torch_version'].split()[0]} + transformers {r['torch_version'].split()[1]} LlamaForCausalLM, "
        f"`past_key_values` loop | {t['prefill_tok_s']:.0f} | {t['decode_tok_s']:.0f} |",
        f"| same, `model.generate()` end to end | | {t['generate_api_tok_s']:.0f} |",
        "",
        f"Ratio corelm / PyTorch: decode {r['decode_ratio_corelm_over_torch']:.2f}x, "
        f"prefill {r['prefill_ratio_corelm_over_torch']:.2f}x. Greedy tokens identical to PyTorch's: "
        f"{'yes, all 128' if r['greedy_tokens_equal'] else 'no (common prefix ' + str(r['greedy_tokens_common_prefix']) + ')'}.",
        "",
        "Command: `.venv/bin/python bench/generate_baseline.py --corelm build/<dir>/corelm --update-doc docs/BENCHMARKS.md`",
        "(writes a model directory with random weights and a synthetic 16384-token byte-level BPE tokenizer, then",
        f"runs `{c['command']}` and the PyTorch worker under `taskset -c 0` with `torch.set_num_threads(1)`).",
        "",
        "Notes: on this shared 2-core machine repeated runs of this script have given corelm decode figures",
        "between about 100 and 310 tok/s and decode ratios between 2.3x and 5x; the ratio measured within one",
        "run is the meaningful figure. Debian's torch 1.13 is built with `BLAS_INFO=generic`, i.e. it calls the",
        "system libblas, which here is the reference (netlib) BLAS: PyTorch's matmuls are far slower than a",
        "PyPI/MKL build would be (not measured here). corelm's",
        "prefill computes LM-head logits for every prompt position (the decoder API returns `[B, T, V]`),",
        "about half of its prefill cost at this size.",
    ])


SECTION = "## Baseline generation (reference fp32 path)"


def update_doc(path, body):
    """Replaces this benchmark's section of `path` (or appends it); other sections are kept."""
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else (
        "# Benchmarks\n\nEach section records the command, the machine, the date and the peer measured in the same run.\n")
    section = SECTION + "\n\n" + body.rstrip("\n") + "\n"
    start = text.find(SECTION + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end:] if end >= 0 else "")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corelm", required=True, help="path of the corelm binary")
    ap.add_argument("--worker", choices=["torch"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per engine per round")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (corelm, torch, corelm, ...)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the generated model directory (printed)")
    ap.add_argument("--markdown", action="store_true", help="also print the docs/BENCHMARKS.md section body")
    ap.add_argument("--update-doc", metavar="BENCHMARKS_MD", help="write the section into this file (others kept)")
    args = ap.parse_args()

    if args.worker == "torch":  # runs under taskset, prints one JSON line
        import torch
        from transformers import LlamaForCausalLM
        torch.set_num_threads(1)
        model = LlamaForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32).eval()
        print(json.dumps(torch_generate(model, json.loads(args.prompt_ids), NEW_TOKENS, args.repeats)))
        return

    from tokenizers import Tokenizer
    work = tempfile.mkdtemp(prefix="corelm_genbench_")
    write_model_dir(work, seed=0)
    if args.keep:
        print(f"model directory: {work}", file=sys.stderr)
    tok = Tokenizer.from_file(os.path.join(work, "tokenizer.json"))
    prompt = prompt_of_length(tok, PROMPT_TOKENS)
    ids = tok.encode(prompt).ids
    assert len(ids) == PROMPT_TOKENS, len(ids)

    corelm_cmd = ["taskset", "-c", "0", os.path.abspath(args.corelm), "generate", "--model", work, "--prompt", prompt,
                  "-n", str(NEW_TOKENS), "--greedy", "--ignore-eos", "--threads", "1", "--json"]
    torch_cmd = ["taskset", "-c", "0", sys.executable, os.path.abspath(__file__), "--corelm", args.corelm,
                 "--worker", "torch", "--model-dir", work, "--prompt-ids", json.dumps(ids), "--repeats", str(args.repeats)]

    # Rounds alternate between the engines so that load from other processes hits both alike;
    # each engine's best round is reported (the machine may be shared).
    ours = theirs = None
    for _ in range(args.rounds):
        for _ in range(args.repeats):
            r = json.loads(subprocess.run(corelm_cmd, check=True, capture_output=True, text=True).stdout.splitlines()[0])
            if ours is None or r["decode_tok_s"] > ours["decode_tok_s"]:
                ours = r
        t = json.loads(subprocess.run(torch_cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        if theirs is None or t["decode_tok_s"] > theirs["decode_tok_s"]:
            theirs = t

    cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                if l.startswith("Model name")), "unknown")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": cpu,
        "load_average": os.getloadavg(),
        "config": "tiny (vocab 16384, hidden 256, 6 layers, 4/2 heads of 64, FFN 640), fp32, random weights",
        "workload": f"greedy, batch 1, prompt {PROMPT_TOKENS} tokens, {NEW_TOKENS} new tokens, 1 thread, taskset -c 0",
        "corelm": {"prefill_tok_s": ours["prefill_tok_s"], "decode_tok_s": ours["decode_tok_s"],
                   "prompt_tokens": ours.get("prompt_tokens"), "command": " ".join(corelm_cmd[:4] + ["generate", "--model", "DIR",
                   "--prompt", "'<32-token prompt>'", "-n", str(NEW_TOKENS), "--greedy", "--ignore-eos", "--threads", "1", "--json"])},
        "torch": {k: theirs[k] for k in ("prefill_tok_s", "decode_tok_s", "total_tok_s", "generate_api_tok_s")},
        "torch_version": subprocess.run([sys.executable, "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
                                        capture_output=True, text=True).stdout.strip(),
        "decode_ratio_corelm_over_torch": ours["decode_tok_s"] / theirs["decode_tok_s"],
        "prefill_ratio_corelm_over_torch": ours["prefill_tok_s"] / theirs["prefill_tok_s"],
        "repeats": args.repeats, "rounds": args.rounds, "statistic": "best run per engine",
        "greedy_tokens_equal": ours["tokens"] == theirs["tokens"],
        "torch_generate_api_tokens_equal": ours["tokens"] == theirs["generate_api_tokens"],
        "greedy_tokens_common_prefix": next((i for i, (a, b) in enumerate(zip(ours["tokens"], theirs["tokens"])) if a != b),
                                            min(len(ours["tokens"]), len(theirs["tokens"]))),
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.markdown:
        print()
        print(markdown(result))
    if args.update_doc:
        update_doc(args.update_doc, markdown(result))


if __name__ == "__main__":
    main()
