"""A corelm_hybrid GGUF (docs/INTEROP.md) against the reference GGUF tooling.

Usage: llamacpp_refuses_hybrid.py FILE.gguf

Prints one JSON line:
  gguf_reader_ok / architecture / layer_types / tensors: the gguf package (0.10.0) parses the file
      as well-formed GGUF and sees corelm's keys;
  refused / error: llama-cpp-python (0.3.2) refuses to load the model (llama.cpp logs
      "unknown model architecture" on stderr, which the caller checks) instead of running it.
"""
import json
import sys

import gguf


def field_str(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode() for i in f.data]


def main():
    path = sys.argv[1]
    out = {}
    r = gguf.GGUFReader(path)
    out["gguf_reader_ok"] = True
    out["architecture"] = field_str(r, "general.architecture")[0]
    out["layer_types"] = field_str(r, "corelm_hybrid.layer_types")
    out["tensors"] = sorted(t.name for t in r.tensors)
    try:
        import llama_cpp
    except ImportError:
        out["refused"] = None
        print(json.dumps(out))
        return
    try:
        llama_cpp.Llama(model_path=path, verbose=True, n_ctx=64)
        out["refused"] = False
    except Exception as e:  # llama-cpp-python raises ValueError("Failed to load model from file")
        out["refused"] = True
        out["error"] = str(e)
    sys.stdout.flush()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
