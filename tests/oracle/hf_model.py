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

from oracle_fixture import write_json
from hf_oracle import StagedFixture, random_causal_lm, torch, transformers
from safetensors.torch import save_file

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
    # A real sliding window (4, far below T = 20): every layer slides (corelm's sliding block).
    "mistral": ("MistralForCausalLM", dict(
        vocab_size=300, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=4,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False), 2, 20),
}

# Weights larger than HF's default 0.02 so attention is far from uniform and every path matters.
WEIGHT_STD = 0.08


def main():
    stage = StagedFixture(__doc__)
    root, tmp_root = stage.root, stage.tmp_root
    cases = []
    for i, (name, (arch, fields, batch, seq)) in enumerate(CASES.items()):
        model = random_causal_lm(arch, dict(fields, initializer_range=WEIGHT_STD), 1000 + i, WEIGHT_STD)
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
    stage.publish()
    write_json(stage.out, {"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases})


if __name__ == "__main__":
    main()
