"""GGUF cross-check with the reference `gguf` package (pinned in tests/requirements.txt).

  gguf_oracle.py write OUT.gguf   writes a file with the package (every scalar kv type, string and
                                  numeric arrays, F32/F16/BF16/Q8_0/Q4_0 tensors) and prints JSON
                                  of what it wrote (values as the package dequantises them)
  gguf_oracle.py read IN.gguf     reads a file (written by corelm) and prints JSON of its metadata
                                  and tensors (row-major shapes, values dequantised to float32)
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


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    print(json.dumps(write(path) if mode == "write" else read(path)))
