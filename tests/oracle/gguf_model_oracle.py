#!/usr/bin/env python3
"""A llama GGUF written by the reference `gguf` package (pinned in tests/requirements.txt), not by
corelm: a seeded random LlamaForCausalLM (GQA, untied head) from transformers is written with
gguf.GGUFWriter under llama.cpp's names and key names, q/k rows permuted the way llama.cpp's
convert_hf_to_gguf.py permutes them, in F32 and once more with F16 2-D weights. The reference
logits for fixed ids come from transformers on the same weights (for F16: the F16-rounded ones).
tests/oracle/test_llamacpp_oracle.cc loads the files through corelm's load_model and compares.

Usage: gguf_model_oracle.py OUT.json     (exits 77 when torch/transformers/gguf are missing)
"""
import os
import sys

from oracle_fixture import NO_TORCH_EXIT, import_torch, write_json

torch = import_torch()
try:
    import numpy as np
    import transformers
    import gguf
except ImportError as e:
    print(f"transformers/gguf not importable ({e}): run scripts/setup --test", file=sys.stderr)
    sys.exit(NO_TORCH_EXIT)

FIELDS = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5,
              tie_word_embeddings=False)
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    _, _, layer, rest = hf.split(".", 3)
    base, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER[base]}.{kind}"


def permute(w, n_head):  # HF rotate-half rows -> llama.cpp's interleaved pairs
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(path, state, f16):
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("gguf-package-random-llama")
    w.add_vocab_size(FIELDS["vocab_size"])
    w.add_context_length(FIELDS["max_position_embeddings"])
    w.add_embedding_length(FIELDS["hidden_size"])
    w.add_block_count(FIELDS["num_hidden_layers"])
    w.add_feed_forward_length(FIELDS["intermediate_size"])
    w.add_head_count(FIELDS["num_attention_heads"])
    w.add_head_count_kv(FIELDS["num_key_value_heads"])
    w.add_rope_dimension_count(FIELDS["hidden_size"] // FIELDS["num_attention_heads"])
    w.add_rope_freq_base(FIELDS["rope_theta"])
    w.add_layer_norm_rms_eps(FIELDS["rms_norm_eps"])
    w.add_file_type(1 if f16 else 0)
    for name, t in state.items():
        a = t.numpy().astype(np.float32)
        if "q_proj" in name:
            a = permute(a, FIELDS["num_attention_heads"])
        if "k_proj" in name:
            a = permute(a, FIELDS["num_key_value_heads"])
        if f16 and a.ndim == 2:
            a = a.astype(np.float16)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = os.path.abspath(sys.argv[1])
    root = os.path.splitext(out)[0]
    os.makedirs(root, exist_ok=True)
    torch.manual_seed(4242)
    config = transformers.LlamaConfig(hidden_act="silu", **FIELDS)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager",
                                                       torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight") else 0.08 * torch.randn_like(p))
    ids = torch.randint(0, FIELDS["vocab_size"], (1, 15), generator=torch.Generator().manual_seed(5))
    cases = []
    for f16 in (False, True):
        state = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.endswith("inv_freq")}
        if f16:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if p.dim() == 2:
                        p.copy_(p.half().float())
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0]
        path = os.path.join(root, f"random_llama_{'f16' if f16 else 'f32'}.gguf")
        tmp = path + f".{os.getpid()}.tmp"
        write(tmp, state, f16)
        os.replace(tmp, path)
        cases.append({"name": "f16" if f16 else "f32", "gguf": path, "ids": ids[0].tolist(),
                      "logits": logits.reshape(-1).tolist(), "vocab": FIELDS["vocab_size"]})
    write_json(out, {"cases": cases, "gguf_package": getattr(gguf, "__version__", "0.10.0")})


if __name__ == "__main__":
    main()
