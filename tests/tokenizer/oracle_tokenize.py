#!/usr/bin/env python3
"""Reference tokenizations for the differential tests (run by test_tokenizer through the venv).

Reads a JSONL file of strings and writes one JSON line per string:
  --kind hf        Hugging Face `tokenizers` (Tokenizer.from_file); ids with special tokens parsed
                   ("ids") and with special-token text as plain text ("plain")
  --kind tiktoken  tiktoken Encoding built from a GPT-2 vocab.json (no download)
  --kind spm       sentencepiece
  --kind pretok    HF Split pre-tokenizer with --regex: the list of pre-token strings
Exit status 3 means a package is missing (the C++ test then skips).
"""
import argparse
import json
import subprocess
import sys
import tempfile


def load_text(path):
    if path.endswith(".zst"):
        return subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout.decode("utf-8")
    with open(path, encoding="utf-8") as f:
        return f.read()


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", required=True, choices=["hf", "tiktoken", "spm", "pretok"])
    ap.add_argument("--tokenizer")
    ap.add_argument("--regex")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    a = ap.parse_args()
    with open(a.input, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f if line.strip()]
    out = []
    try:
        if a.kind == "hf":
            from tokenizers import Tokenizer
            doc = json.loads(load_text(a.tokenizer))
            merges = doc.get("model", {}).get("merges", [])
            if merges and isinstance(merges[0], list):
                # tokenizers 0.19 reads only the older "a b" spelling of merges; byte-level tokens
                # never hold a space, so the two spellings are the same list.
                doc["model"]["merges"] = [" ".join(m) for m in merges]
            with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8") as tmp:
                json.dump(doc, tmp, ensure_ascii=False)
                tmp.flush()
                tok = Tokenizer.from_file(tmp.name)
            for t in texts:
                tok.encode_special_tokens = False
                ids = tok.encode(t, add_special_tokens=False).ids
                tok.encode_special_tokens = True
                plain = tok.encode(t, add_special_tokens=False).ids
                out.append({"ids": ids, "plain": plain, "decoded": tok.decode(ids, skip_special_tokens=False)})
        elif a.kind == "tiktoken":
            import tiktoken
            dec = byte_decoder()
            vocab = json.loads(load_text(a.tokenizer))
            ranks = {bytes(dec[c] for c in k): v for k, v in vocab.items() if k != "<|endoftext|>"}
            pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
            enc = tiktoken.Encoding("gpt2_local", pat_str=pat, mergeable_ranks=ranks,
                                    special_tokens={"<|endoftext|>": vocab["<|endoftext|>"]})
            for t in texts:
                out.append({"ids": enc.encode(t, allowed_special="all"),
                            "plain": enc.encode(t, allowed_special=set(), disallowed_special=())})
        elif a.kind == "spm":
            import sentencepiece
            sp = sentencepiece.SentencePieceProcessor(model_file=a.tokenizer)
            for t in texts:
                ids = sp.encode(t)
                out.append({"ids": ids, "plain": ids, "decoded": sp.decode(ids)})
        else:
            from tokenizers import Regex
            from tokenizers.pre_tokenizers import Split
            split = Split(Regex(a.regex), "isolated")
            for t in texts:
                out.append({"pieces": [p for p, _ in split.pre_tokenize_str(t)]})
    except ImportError as e:
        print(f"oracle_tokenize.py: missing package: {e}", file=sys.stderr)
        return 3
    with open(a.output, "w", encoding="utf-8") as f:
        for o in out:
            f.write(json.dumps(o) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
