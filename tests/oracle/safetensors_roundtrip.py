#!/usr/bin/env python3
"""Cross-check of corelm's safetensors writer/reader and config.json against the PyPI packages.

tests/oracle/test_safetensors_oracle.cc writes, into DIR:
  ours.safetensors   one tensor per dtype, element i = VALUES[i % len(VALUES)] cast to the dtype,
                     plus __metadata__ {"writer": "corelm", "note": ...}
  model_<case>/      config.json (ModelConfig::to_json) + model.safetensors (a seeded Decoder)
                     + ids.json (token ids)
This script (1) loads ours.safetensors with the `safetensors` package and checks every value and
the metadata, then re-saves the same tensors with the package's writer as theirs.safetensors;
(2) loads each model_<case> folder with transformers' AutoModelForCausalLM (no missing or
unexpected weights allowed) and writes its logits for ids.json to hf_logits.safetensors.
The C++ test then reads theirs.safetensors and hf_logits.safetensors back.

Exits 77 (skip) when torch, safetensors or transformers is missing; 1 with a message on mismatch.

Usage: safetensors_roundtrip.py DIR
"""
import glob
import json
import os
import sys

from oracle_fixture import NO_TORCH_EXIT, import_torch

torch = import_torch()
try:
    import transformers
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"safetensors/transformers not importable ({e}): run scripts/setup --test", file=sys.stderr)
    sys.exit(NO_TORCH_EXIT)

# Must match kValues in test_safetensors_oracle.cc; all exactly representable in every dtype.
VALUES = [0.0, 1.0, -2.0, 3.5, 100.0, -7.0, 0.25, 12.0]
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32,
          "I64": torch.int64, "I8": torch.int8, "U8": torch.uint8}


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def check_ours(folder):
    path = os.path.join(folder, "ours.safetensors")
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    if meta.get("writer") != "corelm":
        fail(f"metadata read back as {meta}")
    for name, t in tensors.items():
        st_dtype = name.split("_")[0]
        if t.dtype != DTYPES[st_dtype]:
            fail(f"{name}: dtype {t.dtype}, expected {DTYPES[st_dtype]}")
        values = [VALUES[i % len(VALUES)] for i in range(t.numel())]
        if t.dtype == torch.uint8:
            values = [abs(v) for v in values]
        expected = torch.tensor(values, dtype=torch.float64).to(t.dtype).reshape(t.shape)
        if not torch.equal(t, expected):
            fail(f"{name}: values differ\nread {t}\nexpected {expected}")
    # Re-save with the package's writer (it sorts tensors by dtype alignment, then name).
    save_file(tensors, os.path.join(folder, "theirs.safetensors"), metadata={**meta, "writer": "safetensors"})
    print(f"checked {len(tensors)} tensors of ours.safetensors")


def run_models(folder):
    for case in sorted(glob.glob(os.path.join(folder, "model_*"))):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            case, attn_implementation="eager", torch_dtype=torch.float32, output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        if bad:
            fail(f"{case}: transformers reported loading problems: {bad}")
        if model.config.tie_word_embeddings and model.lm_head.weight is not model.model.embed_tokens.weight:
            fail(f"{case}: embeddings not tied")
        with open(os.path.join(case, "ids.json")) as f:
            ids = torch.tensor(json.load(f), dtype=torch.int64)
        with torch.no_grad():
            logits = model.eval()(input_ids=ids, use_cache=False).logits
        save_file({"logits": logits.contiguous(), "architecture_is_" + type(model).__name__: torch.zeros(1)},
                  os.path.join(case, "hf_logits.safetensors"))
        print(f"{case}: {type(model).__name__} logits {tuple(logits.shape)}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    check_ours(sys.argv[1])
    run_models(sys.argv[1])


if __name__ == "__main__":
    main()
