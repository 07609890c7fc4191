"""corelm.local.Model (ctypes over libcorelm.so) against the C API's own results.

Run by test_capi (CApiTest.PythonLocalModelMatchesTheCApi) as
    CORELM_LIB=build/release/libcorelm.so PYTHONPATH=python python3 test_local_model.py MODEL EXPECTED.json
where EXPECTED.json is the C API's generate() output for the prompts below. Prints one line per
check and SUMMARY OK when all pass (exit 1 otherwise).
"""

import json
import math
import sys

from corelm.local import CorelmError, Model

failures = []


def check(name, ok, detail=""):
    print("%s %s%s" % ("PASS" if ok else "FAIL", name, (": " + detail) if not ok and detail else ""))
    if not ok:
        failures.append(name)


def raises(fn, status, needle):
    try:
        fn()
    except CorelmError as e:
        return e.status == status and needle in str(e), str(e)
    return False, "no error raised"


model_dir, expected_path = sys.argv[1], sys.argv[2]
with open(expected_path) as f:
    expected = json.load(f)

# The example of docs/SERVING.md ("C ABI and in-process Python").
with Model(model_dir) as m:
    ids = m.tokenize("the cat sat")
    check("tokenize round trip", m.detokenize(ids) == "the cat sat", repr(m.detokenize(ids)))
    out = m.generate(["the cat", "a dog"], max_tokens=8, greedy=True, stop_at_eos=False)
    check("generate equals the C API", out == expected, json.dumps(out) + " vs " + json.dumps(expected))
    probs = m.classify(["the cat sat on a mat"], labels=["yes", "no"])[0]["probs"]
    check("classify sums to 1", abs(sum(probs.values()) - 1) < 1e-9, json.dumps(probs))
    s = m.score(["the cat sat on a mat"])[0]
    check("score", s["tokens"] == len(m.tokenize("the cat sat on a mat")) - 1 and math.isfinite(s["logprob"]),
          json.dumps(s))
    ok, msg = raises(lambda: m.generate(["x"], temprature=1), "INVALID_ARGUMENT", "temprature")
    check("unknown parameter raises", ok, msg)
    ok, msg = raises(lambda: m.detokenize([10 ** 6]), "INVALID_ARGUMENT", "ids[0]")
    check("bad id raises", ok, msg)
    ok, msg = raises(lambda: m.classify(["x"], labels=[]), "INVALID_ARGUMENT", "labels")
    check("no labels raises", ok, msg)
ok, msg = raises(lambda: m.tokenize("x"), "INVALID_ARGUMENT", "closed")
check("closed model raises", ok, msg)
ok, msg = raises(lambda: Model(model_dir + "/does-not-exist"), "IO_ERROR", "does-not-exist")
check("bad path raises", ok, msg)

print("SUMMARY " + ("OK" if not failures else "FAILED: " + ", ".join(failures)))
sys.exit(1 if failures else 0)
