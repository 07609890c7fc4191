#!/usr/bin/env python3
"""Hugging Face oracle for corelm's Decoder (src/model/decoder.cc).

For each case, a seeded LlamaForCausalLM / Qwen2ForCausalLM (transformers, pinned in
tests/requirements.txt) with every parameter random -- norm weights and biases included, so their
handling is tested too -- is saved with `save_pretrained` (HF's config.json + model.safetensors,
written by the `safetensors` package), then run in f32 on fixed ids with eager attention. One
training step's loss (mean cross-entropy of each position predicting the next token) is
differentiated, and the logits, the loss and the gradient of every parameter are saved to
results.safetensors. The JSON written to the path on the command line lists the cases;
tests/oracle/test_model_oracle.cc loads the same folder into corelm and compares.

Exits 77 (skip) when torch or transformers is missing.

Usage: hf_model.py OUT.json
"""
import os
import shutil
import sys
import time

from oracle_fixture import NO_TORCH_EXIT, import_torch, write_json

torch = import_torch()
try:
    import transformers
    from safetensors.torch import save_file
except ImportError as e:
    print(f"transformers/safetensors not importable ({e}): run scripts/setup --test", file=sys.stderr)
    sys.exit(NO_TORCH_EXIT)

# name -> (architecture, config fields, batch, seq). "llama" is the real `tiny` preset shape.
CASES = {
    "llama": ("LlamaForCausalLM", dict(
        vocab_size=16384, hidden_size=256, intermediate_size=640, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True), 2, 24),
    # Shrunk shapes, untied: lm_head, the Qwen2 q/k/v biases and Llama's attention_bias (which
    # biases o_proj too) are covered here.
    "qwen2": ("Qwen2ForCausalLM", dict(
        vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
        use_sliding_window=False), 3, 17),
    "llama_bias": ("LlamaForCausalLM", dict(
        vocab_size=300, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True), 2, 13),
}

# Weights larger than HF's default 0.02 so attention is far from uniform and every path matters.
WEIGHT_STD = 0.08


def build(arch, fields, seed):
    torch.manual_seed(seed)
    config_cls = {"LlamaForCausalLM": transformers.LlamaConfig, "Qwen2ForCausalLM": transformers.Qwen2Config}[arch]
    config = config_cls(hidden_act="silu", initializer_range=WEIGHT_STD, torch_dtype="float32", **fields)
    model = getattr(transformers, arch)._from_config(config, attn_implementation="eager", torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(WEIGHT_STD * torch.randn_like(p))
    if fields["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "HF did not tie the embeddings"
    return model.float().eval()


def publish(tmp_root, root, started):
    """Moves tmp_root to root. A root published by a run that began before this one is stale and
    replaced; one published after this run started comes from a concurrent run of the same script
    (identical, seeded content) and may be in use, so it is kept and ours dropped."""
    with open(os.path.join(tmp_root, "published"), "w") as f:
        f.write(repr(time.time()))
    try:
        with open(os.path.join(root, "published")) as f:
            if float(f.read()) >= started:
                shutil.rmtree(tmp_root, ignore_errors=True)
                return
    except (OSError, ValueError):
        pass
    old = f"{root}.old.{os.getpid()}"
    try:
        os.rename(root, old)
    except FileNotFoundError:
        old = None
    try:
        os.rename(tmp_root, root)
    except OSError:
        shutil.rmtree(tmp_root, ignore_errors=True)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    started = time.time()
    out = os.path.abspath(sys.argv[1])
    root = os.path.splitext(out)[0]
    # Tests running in parallel may each regenerate the fixture; everything is written under a
    # private temp folder first and then renamed into place (see publish), so no test ever reads
    # a half-written file. The content is seeded, so whichever copy wins is the same.
    tmp_root = f"{root}.tmp.{os.getpid()}"
    shutil.rmtree(tmp_root, ignore_errors=True)
    cases = []
    for i, (name, (arch, fields, batch, seq)) in enumerate(CASES.items()):
        model = build(arch, fields, 1000 + i)
        folder = os.path.join(tmp_root, name)
        os.makedirs(folder, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)

        gen = torch.Generator().manual_seed(77 + i)
        ids = torch.randint(0, fields["vocab_size"], (batch, seq), generator=gen)
        model.zero_grad()
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()

        results = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
        for pname, p in model.named_parameters():
            results["grad." + pname] = p.grad.detach().contiguous()
        save_file(results, os.path.join(folder, "results.safetensors"))
        cases.append({
            "name": name, "folder": os.path.join(root, name), "architecture": arch, "ids": ids.tolist(),
            "parameters": [n for n, _ in model.named_parameters()],
        })
    publish(tmp_root, root, started)
    write_json(out, {"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases})


if __name__ == "__main__":
    main()
