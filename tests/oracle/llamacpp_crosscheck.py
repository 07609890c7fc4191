#!/usr/bin/env python3
"""Runs a GGUF file in llama.cpp (through llama-cpp-python, which builds llama.cpp from source) and
records what corelm must reproduce: the greedy continuation of fixed prompt ids and the logits of
every position. tests/oracle/test_llamacpp_oracle.cc writes the GGUF with corelm and compares.

Usage: llamacpp_crosscheck.py MODEL.gguf PROMPT_IDS(comma-separated) N_NEW ALLOWED_VOCAB OUT.json
(greedy picks among the first ALLOWED_VOCAB ids: the tokenizer's, as corelm's sampler does when the
embedding table is padded past the vocabulary)
Exits 77 (skip) when llama_cpp is not importable.
"""
import json
import os
import sys

try:
    import numpy as np
    import llama_cpp
except ImportError as e:
    print(f"llama_cpp not importable ({e}): pip install -r tests/requirements-llamacpp.txt", file=sys.stderr)
    sys.exit(77)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    path, prompt, n_new = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
    allowed, out = int(sys.argv[4]), sys.argv[5]
    llm = llama_cpp.Llama(model_path=path, n_ctx=len(prompt) + n_new + 8, n_threads=1, n_batch=64,
                          logits_all=True, verbose=False, seed=0,
                          # f32 KV cache (llama.cpp defaults to f16, which alone costs ~1e-3 relative)
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    llm.eval(prompt)
    generated = []
    for _ in range(n_new):
        last = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        tok = int(np.argmax(last[:allowed]))  # first index on ties, as corelm's argmax
        generated.append(tok)
        llm.eval([tok])
    # Logits of every evaluated position: the prompt and all generated tokens (the last one too).
    logits = np.asarray(llm.scores[:llm.n_tokens], dtype=np.float32)
    result = {"llama_cpp_python": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode(),
              "n_vocab": llm.n_vocab(), "generated": generated, "logits": logits.reshape(-1).tolist(),
              "positions": int(llm.n_tokens)}
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
