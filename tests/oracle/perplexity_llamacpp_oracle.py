#!/usr/bin/env python3
"""Oracle: `corelm perplexity` against llama.cpp computing the same method (CTest
oracle.perplexity_llamacpp). stories260K (../shared/data) is converted to GGUF f32 by `corelm
convert`; both tools score the first 40 KB of wikitext-2 test at n_ctx 128, 4 chunks: corelm on its
f32 reference path, llama.cpp (the pinned llama-cpp-python, f32 KV cache) through
bench/perplexity_llamacpp.py, which builds the chunks as llama-perplexity does. The token counts must
agree and the PPLs within 1e-6 relative. Exit 77 (skipped) without the shared data or llama_cpp.
Usage: perplexity_llamacpp_oracle.py CORELM_BINARY SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    corelm, src = sys.argv[1], sys.argv[2]
    data = os.path.join(src, "..", "shared", "data")
    model = os.path.join(data, "models", "stories260K")
    text = os.path.join(data, "wikitext-2", "wiki.test.raw")
    if not all(os.path.exists(p) for p in (os.path.join(model, "stories260K.bin"), text)):
        print("SKIP: stories260K or wikitext-2 not under", data)
        return 77
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("SKIP: llama_cpp (llama-cpp-python) not installed")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        gguf = os.path.join(tmp, "stories260K-f32.gguf")
        sample = os.path.join(tmp, "wiki40k.txt")
        with open(text, "rb") as f, open(sample, "wb") as out:
            out.write(f.read(40000))
        subprocess.run([corelm, "convert", os.path.join(model, "stories260K.bin"), gguf, "--dtype", "f32",
                        "--tokenizer", os.path.join(model, "tok512.bin")], check=True, capture_output=True)
        ours_path = os.path.join(tmp, "corelm.json")
        ours = subprocess.run([corelm, "perplexity", "--model", gguf, "--file", sample, "--ctx", "128", "--chunks",
                               "4", "--precision", "f32", "--json"], check=True, capture_output=True, text=True).stdout
        open(ours_path, "w").write(ours)
        peer = subprocess.run([sys.executable, os.path.join(src, "bench", "perplexity_llamacpp.py"), gguf, sample,
                               "--ctx", "128", "--chunks", "4", "--cache-f32", "--corelm-json", ours_path],
                              check=True, capture_output=True, text=True).stdout
    r = json.loads(peer)
    print(json.dumps({"tokens": r["tokens"], "corelm_ppl": r["corelm"]["ppl"], "llama_cpp_ppl": r["ppl"],
                      "rel_err": r["ppl_rel_diff"],
                      "stderr_rel_err": abs(r["corelm"]["ppl_stderr"] - r["ppl_stderr"]) / r["ppl_stderr"]}))
    ok = r["same_token_count"] and r["ppl_rel_diff"] < 1e-6 and r["corelm"]["chunks"] == r["chunks"] == 4
    ok = ok and abs(r["corelm"]["ppl_stderr"] - r["ppl_stderr"]) < 1e-5 * r["ppl_stderr"]
    print("OK" if ok else "FAIL: corelm and llama.cpp disagree")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
