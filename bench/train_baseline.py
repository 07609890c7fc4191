#!/usr/bin/env python3
"""Training throughput baseline: PyTorch (Debian torch, 1 thread) vs `corelm train`, same config,
same batch x seq, both pinned to CPU 0, measured in the same run.

    .venv/bin/python bench/train_baseline.py --corelm build/release/corelm --data /tmp/kjv.txt \
        --preset tiny --batch 8 --seq 64 --steps 6

The PyTorch model is transformers' LlamaForCausalLM built from the config.json that corelm writes
(so both train exactly the same shape); AdamW, cross-entropy, global-norm clipping as corelm does.
Prints one JSON object: tokens/s of each, the ratio corelm/torch, the machine and the date.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def run_corelm(args, out_dir, tokenizer=None):
    cmd = ["taskset", "-c", str(args.cpu), args.corelm, "train",
           *(["--config", args.config] if args.config else ["--preset", args.preset]), "--data", *args.data,
           "--steps", str(args.steps), "--out", out_dir, "--threads", "1", "--batch", str(args.batch),
           "--seq", str(args.seq), "--eval-every", str(args.steps), "--eval-batches", "1", "--sample-tokens", "0",
           "--save-every", "0", "--no-progress", "--seed", "0"]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"corelm train failed ({res.returncode}): {res.stderr.strip()}")
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    # Per-step figures from the log; the first step (allocations, page faults) is left out.
    steps = [json.loads(l) for l in open(os.path.join(out_dir, "train_log.jsonl"))]
    rates = [s["tokens_per_s"] for s in steps[1:]] or [summary["tokens_per_s"]]
    tokens_per_step = args.batch * args.seq
    seconds = sum(tokens_per_step / r for r in rates)
    return {"tokens_per_s": tokens_per_step * len(rates) / seconds, "steps_timed": len(rates), "cmd": " ".join(cmd)}


def run_torch(args, config_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = json.load(open(config_path))
    config = LlamaConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], rope_theta=cfg.get("rope_theta", 10000.0),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5), max_position_embeddings=cfg["max_position_embeddings"],
        tie_word_embeddings=cfg.get("tie_word_embeddings", True), attention_bias=cfg.get("attention_bias", False))
    model = LlamaForCausalLM(config).float().train()
    decay = [p for n, p in model.named_parameters() if "norm" not in n and "bias" not in n]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n or "bias" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(0)
    times = []
    for step in range(args.steps):
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), generator=gen)
        t0 = time.perf_counter()
        logits = model(input_ids=ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    timed = times[1:] or times
    return {"tokens_per_s": args.batch * args.seq * len(timed) / sum(timed), "steps_timed": len(timed),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corelm", required=True, help="path to the corelm binary")
    ap.add_argument("--data", nargs="+", required=True, help="training text for corelm (e.g. the KJV text)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--config", help="a config.json instead of the preset")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--cpu", type=int, default=0, help="CPU both runs are pinned to")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each engine; the best is kept")
    args = ap.parse_args()

    os.sched_setaffinity(0, {args.cpu})  # this process (the torch run) = taskset -c CPU
    corelm_runs, torch_runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            out = os.path.join(tmp, f"run{r}")
            tok = os.path.join(tmp, "run0", "tokenizer.json") if r else None
            corelm_runs.append(run_corelm(args, out, tok))
            torch_runs.append(run_torch(args, os.path.join(tmp, "run0", "config.json")))
    corelm = max(corelm_runs, key=lambda x: x["tokens_per_s"])
    torch_res = max(torch_runs, key=lambda x: x["tokens_per_s"])
    load = os.getloadavg()
    print(json.dumps({
        "config": args.config or args.preset, "batch": args.batch, "seq": args.seq, "steps": args.steps,
        "corelm_tokens_per_s": round(corelm["tokens_per_s"], 1),
        "torch_tokens_per_s": round(torch_res["tokens_per_s"], 1),
        "ratio_corelm_over_torch": round(corelm["tokens_per_s"] / torch_res["tokens_per_s"], 3),
        "corelm_all_runs": [round(x["tokens_per_s"], 1) for x in corelm_runs],
        "torch_all_runs": [round(x["tokens_per_s"], 1) for x in torch_runs],
        "torch_version": torch_res["torch"], "torch_threads": torch_res["threads"],
        "cpu": cpu_model(), "pinned_cpu": args.cpu, "loadavg_1m": round(load[0], 2),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "corelm_cmd": corelm["cmd"],
    }, indent=1))


if __name__ == "__main__":
    main()
