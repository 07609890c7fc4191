#!/usr/bin/env python3
"""PyTorch peer for `corelm bench model`: the same measurements on the same model shape, one thread.

  .venv/bin/python bench/model_peers.py --preset tiny [--corelm build/release/corelm] [--json out.json]

Model: transformers' LlamaForCausalLM (eager attention) with random weights of the preset's shape
(torch.set_num_threads(1); the process pins itself to --cpu, like `taskset -c 0`). Measurements,
each after a warm-up, in fp32 and with bf16 autocast:
  scored_tok_s     prefill of 16 x 256 tokens through the decoder without the LM head (no grad)
  generated_tok_s  batched decode, 16 rows x 128 steps with the KV cache and the full LM head
  decode_b1_tok_s  the same with one row
  train_tok_s      AdamW steps, batch 8 x seq 128, full-softmax cross-entropy, grad clipping
With --corelm, `corelm bench model --json` runs pinned to the same CPU in the same session and
the output holds both and the ratios corelm / torch (against the faster torch precision).
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

# One compute thread in every BLAS/OpenMP layer torch may use: torch.set_num_threads(1) alone
# leaves e.g. OpenBLAS's own pool at nproc threads, all pinned to the one CPU, thrashing.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

PRESETS = {
    "tiny": dict(vocab_size=16384, hidden_size=256, intermediate_size=640, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0),
    "small": dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024, rope_theta=10000.0),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0),
}


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


CPU_RATES = {}  # measurement name -> units per second of process CPU time


def rate(fn, min_seconds, name=None):
    """fn() -> units; one warm-up call, then repeats for >= min_seconds (at least 2); units per
    wall second. The rate per process-CPU second goes to CPU_RATES[name]: on a shared machine the
    wall figure includes time spent waiting for the core, the CPU figure does not."""
    fn()
    total, units, runs = 0.0, 0, 0
    cpu0 = time.process_time()
    while runs < 2 or total < min_seconds:
        t0 = time.perf_counter()
        units += fn()
        total += time.perf_counter() - t0
        runs += 1
    if name:
        CPU_RATES[name] = units / max(time.process_time() - cpu0, 1e-9)
    return units / total


def build_model(preset):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = PRESETS[preset]
    config = LlamaConfig(**cfg, head_dim=cfg["hidden_size"] // cfg["num_attention_heads"], rms_norm_eps=1e-5,
                         tie_word_embeddings=True, attention_bias=False, attn_implementation="eager")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float()


def measure(model, autocast, args):
    import torch
    V = model.config.vocab_size
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else (lambda: torch.autocast("cpu", enabled=False))
    gen = torch.Generator().manual_seed(1)
    out = {}
    model.eval()

    ids = torch.randint(0, V, (args.score_batch, args.score_seq), generator=gen)

    def score():
        with torch.no_grad(), ctx():
            model.model(input_ids=ids, use_cache=False)
        return ids.numel()
    out["scored_tok_s"] = rate(score, args.seconds, "scored")

    def decode(batch):
        step_ids = torch.randint(0, V, (batch, 1), generator=gen)

        def run():
            with torch.no_grad(), ctx():
                o = model(input_ids=step_ids, use_cache=True)
                past = o.past_key_values
                for _ in range(args.gen_steps - 1):
                    o = model(input_ids=step_ids, past_key_values=past, use_cache=True)
                    past = o.past_key_values
            return batch * args.gen_steps
        return run
    out["generated_tok_s"] = rate(decode(args.gen_batch), args.seconds, "generated")
    out["decode_b1_tok_s"] = rate(decode(1), args.seconds, "decode_b1")

    if not args.no_train:
        model.train()
        decay = [p for n, p in model.named_parameters() if "norm" not in n]
        no_decay = [p for n, p in model.named_parameters() if "norm" in n]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=1e-4, betas=(0.9, 0.95), eps=1e-8)

        def step():
            batch = torch.randint(0, V, (args.train_batch, args.train_seq + 1), generator=gen)
            with ctx():
                logits = model(input_ids=batch[:, :-1], use_cache=False).logits
                loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return args.train_batch * args.train_seq
        out["train_tok_s"] = rate(step, args.seconds, "train")
        model.eval()
    out["cpu_time_tok_s"] = dict(CPU_RATES)
    CPU_RATES.clear()
    return out


def run_corelm(args):
    cmd = ["taskset", "-c", str(args.cpu), args.corelm, "bench", "model", "--preset", args.preset, "--threads", "1",
           "--json", "--seconds", str(args.seconds)]
    if args.no_train:
        cmd.append("--no-train")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"corelm bench model failed ({res.returncode}): {res.stderr.strip()}")
    r = json.loads(res.stdout.strip().splitlines()[-1])
    r["cmd"] = " ".join(cmd)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--corelm", help="path to the corelm binary: also run `corelm bench model` and give ratios")
    ap.add_argument("--cpu", type=int, default=0, help="CPU everything is pinned to")
    ap.add_argument("--seconds", type=float, default=1.0, help="minimum measuring time per figure")
    ap.add_argument("--score-batch", type=int, default=16)
    ap.add_argument("--score-seq", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--gen-steps", type=int, default=128)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-seq", type=int, default=128)
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 autocast run")
    ap.add_argument("--json", help="also write the result to this file")
    args = ap.parse_args()

    os.sched_setaffinity(0, {args.cpu})
    import torch
    torch.set_num_threads(1)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu_model(),
              "pinned_cpu": args.cpu, "loadavg": os.getloadavg(), "preset": args.preset, "torch": torch.__version__}
    if args.corelm:
        result["corelm"] = run_corelm(args)
    model = build_model(args.preset)
    result["torch_f32"] = measure(model, False, args)
    if not args.no_bf16:
        try:
            result["torch_bf16_autocast"] = measure(model, True, args)
        except Exception as e:  # autocast coverage differs between torch versions
            result["torch_bf16_autocast"] = {"error": str(e)}
    if args.corelm:
        ratios = {}
        for key in ("scored_tok_s", "generated_tok_s", "decode_b1_tok_s", "train_tok_s"):
            peers = [result[p].get(key) for p in ("torch_f32", "torch_bf16_autocast") if p in result]
            peers = [p for p in peers if isinstance(p, (int, float)) and p > 0]
            ours = result["corelm"].get(key)
            if peers and isinstance(ours, (int, float)):
                ratios[key] = ours / max(peers)
        result["ratio_corelm_over_best_torch"] = ratios
        cpu_ratios = {}
        for key in ("scored", "generated", "decode_b1"):
            peers = [result[p].get("cpu_time_tok_s", {}).get(key) for p in ("torch_f32", "torch_bf16_autocast") if p in result]
            peers = [p for p in peers if p]
            ours = result["corelm"].get("cpu_time_tok_s", {}).get(key)
            if peers and ours:
                cpu_ratios[key] = ours / max(peers)
        result["cpu_time_ratio_corelm_over_best_torch"] = cpu_ratios
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
