#!/usr/bin/env python3
"""Hugging Face oracle for corelm's classification head (score.weight, src/train/classify.cc and
the head path of src/pipeline/engine.cc).

A seeded LlamaForSequenceClassification (transformers, pinned in tests/requirements.txt) with every
parameter random is saved with `save_pretrained` (config.json with id2label/label2id/pad_token_id,
model.safetensors with score.weight), then run in f32 on a padded batch: HF pools the hidden state
of the token before each row's first pad token. The ids, the row lengths and HF's logits
[B, num_labels] go to results.safetensors; tests/oracle/test_classify_head_oracle.cc loads the same
folder into corelm and compares.

Exits 77 (skip) when torch or transformers is missing.

Usage: hf_classify_head.py OUT.json
"""
import os

from oracle_fixture import write_json
from hf_oracle import StagedFixture, torch, transformers
from safetensors.torch import save_file

LABELS = ["world", "sports", "business", "sci_tech", "other"]
PAD = 0
WEIGHT_STD = 0.08


def main():
    stage = StagedFixture(__doc__)
    torch.manual_seed(2024)
    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, hidden_act="silu", torch_dtype="float32", pad_token_id=PAD,
        id2label={i: l for i, l in enumerate(LABELS)}, label2id={l: i for i, l in enumerate(LABELS)})
    model = transformers.LlamaForSequenceClassification._from_config(
        config, attn_implementation="eager", torch_dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(WEIGHT_STD * torch.randn_like(p))
    model.eval()
    folder = os.path.join(stage.tmp_root, "model")
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)

    gen = torch.Generator().manual_seed(99)
    lengths = [17, 5, 1, 12]
    T = max(lengths)
    ids = torch.full((len(lengths), T), PAD, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(1, config.vocab_size, (n,), generator=gen)  # no pad inside a row
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    save_file({"ids": ids.contiguous(), "lengths": torch.tensor(lengths, dtype=torch.long),
               "logits": logits.contiguous()}, os.path.join(folder, "results.safetensors"))
    stage.publish()
    write_json(stage.out, {"transformers": transformers.__version__, "torch": torch.__version__,
                           "folder": os.path.join(stage.root, "model"), "labels": LABELS})


if __name__ == "__main__":
    main()
