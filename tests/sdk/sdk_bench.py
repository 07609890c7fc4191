#!/usr/bin/env python3
"""The SDK's cost over direct /v1/completions (a benchmark, not a test; JSON on stdout).

  PYTHONPATH=python python3 tests/sdk/sdk_bench.py --corelm build/release/corelm --model DIR \
      [--prompts 2000] [--max-tokens 8] [--server-cpu 0] [--queue-sync full|normal]

Starts `corelm serve --state-dir TMP` (pinned with taskset to --server-cpu), then times the same
greedy work three ways: the plain client loop a user would write first (/v1/completions, 64
prompts per request, one request at a time), Client.generate on the queue path (/v1/generate +
long-poll), and Client.generate on the Files/Batches path; checks that all three give the same
texts and prints prompts/s, the ratios and the client's own CPU time per prompt.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corelm  # noqa: E402
from test_sdk_live import API_KEY, Server, prompts_for  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corelm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--server-cpu", default="0")
    ap.add_argument("--queue-sync", default="full", choices=["full", "normal"])
    a = ap.parse_args()
    binary = a.corelm
    if shutil.which("taskset") and a.server_cpu != "":
        wrapper = tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False)
        wrapper.write("#!/bin/sh\nexec taskset -c %s %s \"$@\"\n" % (a.server_cpu, os.path.abspath(a.corelm)))
        wrapper.close()
        os.chmod(wrapper.name, 0o755)
        binary = wrapper.name
    state = tempfile.mkdtemp(prefix="corelm_sdk_bench_")
    model = os.path.basename(os.path.normpath(a.model))
    server = Server(binary, a.model, state, ["--queue-sync", a.queue_sync])
    try:
        prompts = prompts_for(a.prompts, 11)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def direct():
            out = []
            for s in range(0, len(prompts), 64):
                body = json.dumps({"model": model, "prompt": prompts[s:s + 64], "max_tokens": a.max_tokens,
                                   "temperature": 0}).encode()
                req = urllib.request.Request(server.url + "/v1/completions", data=body, method="POST",
                                             headers={"Content-Type": "application/json",
                                                      "Authorization": "Bearer " + API_KEY})
                with opener.open(req, timeout=600) as r:
                    out += [c["text"] for c in sorted(json.loads(r.read())["choices"], key=lambda c: c["index"])]
            return out

        # The batch path runs on a fresh state dir: the queue's dedup would otherwise answer it
        # from the queue path's stored results.
        runs, cpu = {}, {}
        t0, c0 = time.perf_counter(), time.process_time()
        ref = direct()
        runs["completions_loop"], cpu["completions_loop"] = time.perf_counter() - t0, time.process_time() - c0
        c = corelm.Client(server.url, api_key=API_KEY, timeout=600, poll_chunk=int(os.environ.get("POLL_CHUNK", "1024")))
        t0, c0 = time.perf_counter(), time.process_time()
        got_q = c.generate(prompts, model=model, max_tokens=a.max_tokens, temperature=0)
        runs["generate_queue"], cpu["generate_queue"] = time.perf_counter() - t0, time.process_time() - c0
        state2 = tempfile.mkdtemp(prefix="corelm_sdk_bench_b_")
        server.stop()
        shutil.rmtree(state, ignore_errors=True)
        server = Server(binary, a.model, state2, ["--queue-sync", a.queue_sync])
        state = state2
        cb = corelm.Client(server.url, api_key=API_KEY, timeout=600, batch_threshold=0)
        t0, c0 = time.perf_counter(), time.process_time()
        got_b = cb.generate(prompts, model=model, max_tokens=a.max_tokens, temperature=0)
        runs["generate_batches"], cpu["generate_batches"] = time.perf_counter() - t0, time.process_time() - c0
        same = got_q == ref and got_b == ref
        base = runs["completions_loop"]
        print(json.dumps({"bench": "sdk_generate", "prompts": a.prompts, "max_tokens": a.max_tokens,
                          "queue_sync": a.queue_sync, "texts_equal": same,
                          "seconds": {k: round(v, 3) for k, v in runs.items()},
                          "prompts_per_s": {k: round(a.prompts / v, 1) for k, v in runs.items()},
                          "time_vs_completions_loop": {k: round(v / base, 3) for k, v in runs.items()},
                          # the client process's own CPU per prompt (the SDK's cost, not the server's)
                          "client_cpu_us_per_prompt": {k: round(1e6 * v / a.prompts, 1) for k, v in cpu.items()},
                          "load": os.getloadavg()[0]}))
        return 0 if same else 1
    finally:
        server.stop()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
