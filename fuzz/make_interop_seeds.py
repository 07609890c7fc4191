#!/usr/bin/env python3
"""Writes small seed files for fuzz_safetensors_header and fuzz_gguf_reader into
fuzz/seeds/safetensors and fuzz/seeds/gguf: valid files of every dtype / ggml type and a tiny llama
model (so the fuzzer starts from inputs that get past the magic and the header checks).
Needs numpy and the `gguf` package (tests/requirements.txt). Usage: make_interop_seeds.py"""
import json
import os
import struct

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))


def safetensors_bytes(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write_safetensors_seeds(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 4)).astype(np.float32)
    seeds = {
        "all_dtypes": {"a": ("F32", [3, 4], f32.tobytes()), "b": ("F16", [4], np.ones(4, np.float16).tobytes()),
                       "c": ("BF16", [2, 2], b"\x80\x3f" * 4), "d": ("I32", [2], b"\x01\0\0\0\x02\0\0\0"),
                       "e": ("I64", [1], b"\x07" + b"\0" * 7), "f": ("I8", [3], b"\x01\x02\xff"),
                       "g": ("U8", [2], b"\x00\xff"), "empty": ("F32", [0, 5], b"")},
        "metadata": {"w": ("F32", [2], f32.tobytes()[:8])},
        "scalar": {"s": ("F32", [], f32.tobytes()[:4])},
    }
    for name, tensors in seeds.items():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(safetensors_bytes(tensors, {"format": "pt"} if name == "metadata" else None))


def write_gguf_seeds(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1)
    # Every metadata value type and tensor type.
    w = gguf.GGUFWriter(os.path.join(out, "types.gguf"), "llama")
    w.add_uint8("t.u8", 7); w.add_int8("t.i8", -7); w.add_uint16("t.u16", 700); w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000); w.add_int32("t.i32", -70000); w.add_float32("t.f32", 1.5); w.add_bool("t.b", True)
    w.add_string("t.s", "hello"); w.add_uint64("t.u64", 1 << 40); w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 2.25); w.add_array("t.arr", [1, 2, 3]); w.add_array("t.sarr", ["a", "bc"])
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w.add_tensor("f32", x)
    w.add_tensor("f16", x.astype(np.float16))
    w.add_tensor("q8_0", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q4_0", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0), raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    # A tiny llama model (hidden 8, 1 layer, vocab 4) that load_gguf_model accepts.
    w = gguf.GGUFWriter(os.path.join(out, "tiny_llama.gguf"), "llama")
    for key, value in [("llama.embedding_length", 8), ("llama.block_count", 1), ("llama.feed_forward_length", 16),
                       ("llama.attention.head_count", 2), ("llama.attention.head_count_kv", 1),
                       ("llama.context_length", 16), ("llama.vocab_size", 4)]:
        w.add_uint32(key, value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    shapes = {"token_embd.weight": (4, 8), "output_norm.weight": (8,), "blk.0.attn_norm.weight": (8,),
              "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (4, 8), "blk.0.attn_v.weight": (4, 8),
              "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_norm.weight": (8,), "blk.0.ffn_gate.weight": (16, 8),
              "blk.0.ffn_up.weight": (16, 8), "blk.0.ffn_down.weight": (8, 16)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

    # A tiny corelm_hybrid model (docs/INTEROP.md; layers linear, sliding) that load_gguf_model
    # accepts, so the fuzzer starts inside the hybrid reader's key and tensor checks.
    # Its own generator, so that the seeds written after it stay byte for byte as they were.
    hrng = np.random.default_rng(2)
    w = gguf.GGUFWriter(os.path.join(out, "tiny_hybrid.gguf"), "corelm_hybrid")
    for key, value in [("embedding_length", 8), ("block_count", 2), ("feed_forward_length", 16),
                       ("attention.head_count", 2), ("attention.head_count_kv", 1), ("attention.key_length", 4),
                       ("context_length", 16), ("vocab_size", 4), ("attention.sliding_window", 2),
                       ("linear_attention.state_size", 4)]:
        w.add_uint32("corelm_hybrid." + key, value)
    w.add_float32("corelm_hybrid.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_array("corelm_hybrid.layer_types", ["linear_attention", "sliding_attention"])
    w.add_bool("corelm_hybrid.bos_isolation", False)
    shapes = {"token_embd.weight": (4, 8), "output_norm.weight": (8,)}
    for layer in range(2):
        b = "blk.%d." % layer
        shapes.update({b + "attn_norm.weight": (8,), b + "attn_q.weight": (8, 8), b + "attn_k.weight": (4, 8),
                       b + "attn_v.weight": (4, 8), b + "attn_output.weight": (8, 8), b + "ffn_norm.weight": (8,),
                       b + "ffn_gate.weight": (16, 8), b + "ffn_up.weight": (16, 8), b + "ffn_down.weight": (8, 16)})
    shapes.update({"blk.0.attn_decay": (1, 4), "blk.0.attn_out_norm.weight": (4,)})
    for name, shape in shapes.items():
        w.add_tensor(name, hrng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

    # One tensor of each quantised type corelm reads, from block bytes: random code bits with finite
    # f16 scales at each type's scale offsets (gguf 0.10.0 has no k-quant quantiser).
    Q = gguf.GGMLQuantizationType
    scale_offsets = {Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q2_K: [80, 82], Q.Q3_K: [108],
                     Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
    w = gguf.GGUFWriter(os.path.join(out, "quants.gguf"), "llama")
    for qtype, offsets in scale_offsets.items():
        block, size = gguf.constants.GGML_QUANT_SIZES[qtype]
        n = 256 // block  # one row of 256 values
        data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
        for off in offsets:
            data[:, off:off + 2] = (rng.standard_normal(n) * 0.05).astype(np.float16).view(np.uint8).reshape(n, 2)
        w.add_tensor(qtype.name.lower(), data.reshape(1, n * size), raw_dtype=qtype)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


if __name__ == "__main__":
    write_safetensors_seeds(os.path.join(HERE, "seeds", "safetensors"))
    write_gguf_seeds(os.path.join(HERE, "seeds", "gguf"))
