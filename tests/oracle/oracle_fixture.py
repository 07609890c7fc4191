"""Shared helpers of the oracle scripts: import torch or exit 77, and tensor <-> JSON."""
import json
import os
import sys

# Exit code that tells the C++ side "this python has no torch" (it then tries the next one or
# skips); any other non-zero code is a real failure.
NO_TORCH_EXIT = 77


def import_torch():
    try:
        import torch
    except ImportError:
        print("torch not found: run scripts/setup --test (Debian python3-torch)", file=sys.stderr)
        sys.exit(NO_TORCH_EXIT)
    torch.set_num_threads(1)
    return torch


def tensor_json(t):
    """{"dtype", "shape", "data"}: data flat in row-major order, floats exact (repr of f32)."""
    if t is None:
        return None
    t = t.detach().contiguous()
    dtype = {"torch.float32": "f32", "torch.int64": "i64", "torch.int32": "i32"}[str(t.dtype)]
    return {"dtype": dtype, "shape": list(t.shape), "data": t.reshape(-1).tolist()}


def write_json(path, obj):
    """Writes to a temporary name and renames, so tests running in parallel never read half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    os.replace(tmp, path)
