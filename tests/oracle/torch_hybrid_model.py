#!/usr/bin/env python3
"""Oracle for corelm's hybrid decoder (docs/HYBRID.md): reads DIR/config.json, DIR/model.safetensors
and DIR/ids.json (written by tests/oracle/test_hybrid_model_oracle.cc from a corelm Decoder) and
writes DIR/torch.json with the logits of bench/hybrid_torch.py (the PyTorch implementation written
from the spec) and the gradient of the mean next-token cross-entropy for every parameter.
Exit 77 without torch."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

from oracle_fixture import import_torch, tensor_json, write_json  # noqa: E402

torch = import_torch()
import hybrid_torch  # noqa: E402


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "ids.json")) as f:
        ids = json.load(f)
    logits, grads = hybrid_torch.logits_and_grads(os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"),
                                                  ids)
    write_json(os.path.join(d, "torch.json"),
               {"logits": tensor_json(logits), "grads": {k: tensor_json(v) for k, v in grads.items()}})


if __name__ == "__main__":
    main()
