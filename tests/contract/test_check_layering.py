#!/usr/bin/env python3
"""The layering check can fail: on a copy of the tree with planted upward includes it must report
each one and exit 1 (run by CTest as contract.include_graph_catches)."""
import os
import shutil
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(os.path.join(here, "../.."))
checker = os.path.join(here, "check_layering.py")

with tempfile.TemporaryDirectory() as tmp:
    for part in ("CMakeLists.txt", "src", "apps", "include"):
        src = os.path.join(root, part)
        (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(tmp, part))
    clean = subprocess.run([sys.executable, checker, tmp], capture_output=True, text=True)
    assert clean.returncode == 0, "the unmodified copy must pass:\n" + clean.stdout
    plants = {
        "src/model/config.cc": '#include "corelm/serve.h"\n',        # model -> serve (above it)
        "src/infer/sampler.cc": '#include "kernels/cpu/gemm.h"\n',   # infer -> kernels/
        "src/core/tensor.cc": '#include "corelm/model.h"\n',         # core -> model
    }
    for rel, line in plants.items():
        with open(os.path.join(tmp, rel), "a", encoding="utf-8") as f:
            f.write(line)
    open(os.path.join(tmp, "include/corelm/unowned_header.h"), "w").close()
    bad = subprocess.run([sys.executable, checker, tmp], capture_output=True, text=True)
    assert bad.returncode == 1, "planted violations must fail the check:\n" + bad.stdout
    for rel in list(plants) + ["include/corelm/unowned_header.h"]:
        assert rel in bad.stdout, f"{rel} not reported:\n{bad.stdout}"
    assert "4 violation(s)" in bad.stdout, bad.stdout
print("check_layering catches planted violations")
