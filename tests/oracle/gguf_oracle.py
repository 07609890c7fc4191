"""GGUF cross-check with the reference `gguf` package (pinned in tests/requirements.txt).

  gguf_oracle.py write OUT.gguf   writes a file with the package (every scalar kv type, string and
                                  numeric arrays, F32/F16/BF16/Q8_0/Q4_0 tensors) and prints JSON
                                  of what it wrote (values as the package dequantises them)
  gguf_oracle.py read IN.gguf     reads a file (written by corelm) and prints JSON of its metadata
                                  and tensors (row-major shapes, values dequantised to float32)
  gguf_oracle.py blocks OUT.gguf  writes one tensor per ggml block type (Q4_0..Q8_0, Q2_K..Q6_K) of
                                  random block bytes with finite f16 scales plus edge-case blocks
                                  (zero, negative, tiny and large scales; all-zero and all-one
                                  code bits), then dumps them as `dequant` does
  gguf_oracle.py dequant IN.gguf DIR [NAME...]
                                  dequantises the named tensors (all when none are named) with the
                                  package and writes each as raw little-endian float32 to DIR/<k>.f32;
                                  prints JSON {name: {type, shape, file}} (binary: real model files
                                  hold millions of values, too many for JSON)
"""
import json
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as V
    from gguf.quants import dequantize, quantize
except ImportError as e:  # the C++ test skips on this exit code
    print(f"gguf package not importable: {e}", file=sys.stderr)
    sys.exit(77)


def field_value(f):
    t = f.types[0]
    if t == V.ARRAY:
        et = f.types[1]
        if et == V.STRING:
            return et.name, [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return et.name, [f.parts[i].tolist()[0] for i in f.data]
    if t == V.STRING:
        return None, bytes(f.parts[f.data[0]]).decode("utf-8")
    return None, f.parts[f.data[0]].tolist()[0]


def read(path):
    r = gguf.GGUFReader(path)
    meta = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        elem, value = field_value(f)
        meta[name] = {"type": f.types[0].name, "elem": elem, "value": value}
    tensors = {}
    for t in r.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        tensors[t.name] = {
            "type": t.tensor_type.name,
            "shape": [int(d) for d in reversed(t.shape.tolist())],
            "values": values.reshape(-1).tolist(),
        }
    return {"metadata": meta, "tensors": tensors}


def write(path):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 1 << 62)
    w.add_int64("t.i64", -(1 << 62))
    w.add_float32("t.f32", 0.25)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "caf\u00e9")
    w.add_token_list(["<unk>", "<s>", "</s>", "\u2581hi"])
    w.add_token_merges(["h i", "\u2581 hi"])
    w.add_token_scores([-1.5, 2.0, 0.0, 3.25])
    w.add_context_length(128)
    x = (np.sin(np.arange(2 * 64, dtype=np.float32)) * 3).reshape(2, 64).astype(np.float32)
    w.add_tensor("f32", np.arange(15, dtype=np.float32).reshape(3, 5))
    w.add_tensor("f16", x.astype(np.float16))
    w.add_tensor("bf16", quantize(x, Q.BF16), raw_dtype=Q.BF16)
    w.add_tensor("q8", quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("q4", quantize(x, Q.Q4_0), raw_dtype=Q.Q4_0)
    w.add_tensor("orig", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return read(path)


# Byte offsets of each block type's f16 scale fields (the rest of a block is code bits, any
# value valid): random bytes there could be NaN/inf, which no quantiser writes.
SCALE_OFFSETS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}


def random_blocks(qtype, n_random, rng):
    from gguf.constants import GGML_QUANT_SIZES
    block, size = GGML_QUANT_SIZES[qtype]
    blocks = [rng.integers(0, 256, size=(n_random, size), dtype=np.uint8)]
    for off in SCALE_OFFSETS[qtype]:
        scales = (rng.standard_normal(n_random) * 0.05).astype(np.float16)
        blocks[0][:, off:off + 2] = scales.view(np.uint8).reshape(n_random, 2)
    # Edge cases: codes all 0 / all 1 bits with scales zero, +/-, subnormal, large.
    for fill in (0x00, 0xFF, 0x55, 0xAA):
        for scale in (0.0, 1.0, -1.0, 6e-8, -3.5e-5, 1000.0, -65504.0):
            b = np.full((1, size), fill, dtype=np.uint8)
            for off in SCALE_OFFSETS[qtype]:
                b[0, off:off + 2] = np.array([scale], dtype=np.float16).view(np.uint8)
            blocks.append(b)
    return np.concatenate(blocks, axis=0), block


def blocks(path, dump_dir):
    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(path, arch="llama")
    for qtype in SCALE_OFFSETS:
        data, block = random_blocks(qtype, 36, rng)  # 36 random + 28 edge = 64 blocks
        n = data.shape[0]
        rows = 4  # 4 rows of 16 blocks: rows and columns both exercised
        w.add_tensor(qtype.name.lower(), data.reshape(rows, (n // rows) * data.shape[1]), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dequant(path, dump_dir, [])


def dequant(path, dump_dir, names):
    import os
    r = gguf.GGUFReader(path)
    out = {}
    for k, t in enumerate(r.tensors):
        if names and t.name not in names:
            continue
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        f = os.path.join(dump_dir, f"{k}.f32")
        values.reshape(-1).astype("<f4").tofile(f)
        out[t.name] = {"type": t.tensor_type.name, "shape": [int(d) for d in reversed(t.shape.tolist())], "file": f}
    return out


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "blocks":
        print(json.dumps(blocks(path, sys.argv[3])))
    elif mode == "dequant":
        print(json.dumps(dequant(path, sys.argv[3], sys.argv[4:])))
    else:
        print(json.dumps(write(path) if mode == "write" else read(path)))
