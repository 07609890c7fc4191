#!/usr/bin/env python3
"""PyTorch oracle for ops::sliding_window_attention (include/corelm/ops.h).

Two parts, written as one JSON fixture for tests/oracle/test_sliding_attention_oracle.cc:
  cases:   seeded f32 q, k, v (GQA layouts), a window, optional document ids [B, S]; torch's output
           with an explicit band (and document) mask, an upstream gradient and the q/k/v gradients.
  mistral: the visibility pattern of transformers' own Mistral eager attention (a tiny random
           MistralModel, output_attentions=True, with and without a KV cache of `past` tokens) for
           a few (T, window, past): which keys each query's probabilities are nonzero on. The C++
           side reads our op's visibility off its output and compares, so the window convention
           (does window W admit W or W + 1 keys?) comes from transformers, not from our reading.

Usage: torch_sliding_attention.py OUT.json
"""
import math
import sys

from oracle_fixture import import_torch, tensor_json, write_json

torch = import_torch()


def band_mask(s, t, window, doc):
    """[T, S] bool: query t (position s - t_count + t) sees key j. doc: [S] ids or None."""
    qpos = torch.arange(t)[:, None] + (s - t)
    kpos = torch.arange(s)[None, :]
    visible = kpos <= qpos
    if window > 0:
        visible &= (qpos - kpos) <= window
    if doc is not None:
        visible &= doc[None, :] == doc[s - t:][:, None]
    return visible


def sliding_attention(q, k, v, window, docs=None, scale=None):
    hq, t, d = q.shape[1], q.shape[2], q.shape[3]
    hkv, s = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    masks = torch.stack([band_mask(s, t, window, None if docs is None else docs[b]) for b in range(q.shape[0])])
    scores = scores.masked_fill(~masks[:, None], float("-inf"))
    return scores.softmax(dim=-1) @ v


def doc_ids(rows):
    return torch.tensor([[d for d, n in enumerate(lengths) for _ in range(n)] for lengths in rows], dtype=torch.int64)


# (name, q shape, kv shape, window, per-row document lengths or None, scale or None). Names and
# arguments must match kCases in test_sliding_attention_oracle.cc (the test checks the names).
CASES = [
    ("swa_gqa_t_eq_s", (2, 2, 40, 8), (2, 1, 40, 8), 7, None, None),
    ("swa_gqa_t_lt_s", (1, 2, 20, 8), (1, 1, 33, 8), 10, None, None),
    ("swa_window_1", (1, 2, 12, 8), (1, 1, 12, 8), 1, None, None),
    ("swa_t_lt_window", (1, 4, 9, 8), (1, 2, 9, 8), 32, None, None),
    ("swa_crosses_blocks_scale", (1, 2, 150, 16), (1, 1, 150, 16), 80, None, 0.3),
    ("swa_docs_3", (2, 2, 50, 8), (2, 1, 50, 8), 12, [[20, 1, 29], [50]], None),
    ("swa_docs_5_unbounded", (1, 2, 40, 16), (1, 1, 40, 16), 0, [[7, 1, 12, 3, 17]], None),
    ("swa_docs_t_lt_s", (2, 2, 30, 8), (2, 1, 45, 8), 9, [[10, 20, 15], [1, 1, 43]], None),
]

# (T, window, past): a prefill without and with a cache, windows smaller and larger than T.
MISTRAL_CASES = [(6, 3, 0), (12, 5, 0), (5, 4, 7), (3, 2, 10)]


def run_case(name, qs, kvs, window, docs, scale):
    q, k, v = (torch.randn(*shape, dtype=torch.float32) for shape in (qs, kvs, kvs))
    ids = None if docs is None else doc_ids(docs)
    xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = sliding_attention(*xs, window, ids, scale)
    upstream = torch.randn(out.shape, dtype=torch.float32)
    out.backward(upstream)
    return {
        "name": name,
        "window": window,
        "scale": scale,
        "inputs": [tensor_json(x) for x in (q, k, v)],
        "doc_ids": tensor_json(ids),
        "output": tensor_json(out),
        "upstream": tensor_json(upstream),
        "grads": [tensor_json(x.grad) for x in xs],
    }


def mistral_visibility(t, window, past):
    """Nonzero pattern [T, past + T] of a Mistral eager attention layer's probabilities."""
    import transformers
    from transformers import MistralConfig, MistralModel

    config = MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                           sliding_window=window, attn_implementation="eager")
    model = MistralModel(config).eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    ids = torch.randint(0, 32, (1, past + t))
    with torch.no_grad():
        cache = None
        if past:
            cache = model(ids[:, :past], use_cache=True).past_key_values
        out = model(ids[:, past:], past_key_values=cache, use_cache=cache is not None, output_attentions=True)
    probs = out.attentions[0][0]  # [heads, T, past + T]
    visible = (probs > 0).to(torch.int64)
    assert torch.equal(visible[0], visible[1]), "heads disagree on the mask"
    return {"t": t, "window": window, "past": past, "transformers": transformers.__version__,
            "visible": tensor_json(visible[0])}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.manual_seed(1717)
    fixture = {"torch_version": torch.__version__,
               "cases": [run_case(*c) for c in CASES],
               "mistral": [mistral_visibility(*c) for c in MISTRAL_CASES]}
    write_json(sys.argv[1], fixture)
    print(f"torch_sliding_attention: {len(fixture['cases'])} cases, {len(fixture['mistral'])} Mistral masks"
          f" -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
