#!/usr/bin/env python3
"""Hugging Face checkpoints for corelm's model loader (src/model/model_loader.cc).

Each case is a seeded, randomly initialised Qwen2ForCausalLM / LlamaForCausalLM (transformers,
pinned in tests/requirements.txt) saved with `save_pretrained(folder, max_shard_size="200KB")`, so
the folder holds model-0000i-of-0000N.safetensors shards and model.safetensors.index.json exactly
as transformers writes them, plus generation_config.json. The reference logits come from
transformers itself, loading that folder back with from_pretrained (f32 compute); for the bf16
checkpoint also from the bf16 model computing in bf16. Two broken copies test strict mode: one
with a tensor removed, one with an extra tensor.

Writes OUT.json: {"cases": [{name, folder, ids, logits (file), ...}], "missing": folder, "extra": folder}.
Exits 77 (skip) when torch or transformers is missing.

Usage: hf_checkpoint.py OUT.json
"""
import json
import os
import shutil

from oracle_fixture import write_json
from hf_oracle import StagedFixture, random_causal_lm, torch, transformers
from safetensors.torch import load_file, save_file

# name -> (architecture, config fields, torch dtype of the saved weights)
CASES = {
    "qwen2_bias": ("Qwen2ForCausalLM", dict(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, use_sliding_window=False, bos_token_id=1, eos_token_id=[2, 3]), "float32"),
    "llama_gqa_tied": ("LlamaForCausalLM", dict(
        vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2), "float32"),
    "llama_gqa_untied": ("LlamaForCausalLM", dict(
        vocab_size=288, hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=3, max_position_embeddings=64, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False), "float32"),
    "llama_bf16": ("LlamaForCausalLM", dict(
        vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False), "bfloat16"),
}
BATCH, SEQ = 2, 19
WEIGHT_STD = 0.08  # larger than HF's 0.02, so attention is far from uniform


def reload_logits(folder, arch, ids, dtype):
    model = getattr(transformers, arch).from_pretrained(folder, torch_dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def broken_copy(src, dst, edit):
    """A single-file copy of checkpoint `src` with its state dict edited (strict-mode fixtures)."""
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    tensors = {}
    with open(os.path.join(src, "model.safetensors.index.json")) as f:
        for shard in sorted(set(json.load(f)["weight_map"].values())):
            tensors.update(load_file(os.path.join(src, shard)))
    edit(tensors)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def main():
    stage = StagedFixture(__doc__)
    root, tmp_root = stage.root, stage.tmp_root
    cases = []
    for i, (name, (arch, fields, dtype)) in enumerate(CASES.items()):
        model = random_causal_lm(arch, fields, 3000 + i, WEIGHT_STD)
        folder = os.path.join(tmp_root, name)
        if dtype == "bfloat16":
            model = model.to(torch.bfloat16)
            model.config.torch_dtype = torch.bfloat16
        model.save_pretrained(folder, safe_serialization=True, max_shard_size="200KB")
        shards = [f for f in os.listdir(folder) if f.startswith("model-") and f.endswith(".safetensors")]
        assert os.path.exists(os.path.join(folder, "model.safetensors.index.json")) and len(shards) > 1, shards
        ids = torch.randint(0, fields["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(90 + i))
        results = {"logits": reload_logits(folder, arch, ids, torch.float32).contiguous()}
        if dtype == "bfloat16":  # transformers computing in bf16: what "bf16 tolerance" is measured against
            results["logits_bf16_compute"] = reload_logits(folder, arch, ids, torch.bfloat16).contiguous()
        save_file(results, os.path.join(tmp_root, name + ".logits.safetensors"))
        cases.append({"name": name, "folder": os.path.join(root, name), "dtype": dtype, "shards": len(shards),
                      "ids": ids.tolist(), "logits": os.path.join(root, name + ".logits.safetensors")})

    src = os.path.join(tmp_root, "llama_gqa_tied")
    broken_copy(src, os.path.join(tmp_root, "missing"), lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    broken_copy(src, os.path.join(tmp_root, "extra"),
                lambda t: t.__setitem__("model.layers.0.mlp.extra_proj.weight", torch.zeros(4, 4)))
    write_json(os.path.join(tmp_root, "cases.json"), {"cases": cases})
    stage.publish()
    write_json(stage.out, {"cases": cases, "missing": os.path.join(root, "missing"), "extra": os.path.join(root, "extra"),
                     "transformers": transformers.__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main()
