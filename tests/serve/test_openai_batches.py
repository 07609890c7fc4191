#!/usr/bin/env python3
"""The OpenAI Files + Batches API of `corelm serve --state-dir`, driven by the official openai client.

  test_openai_batches.py --corelm BIN --model DIR [--timeout S] [--requests N]

Starts `BIN serve --model DIR --state-dir <tmp> --host 127.0.0.1 --port 0 --api-key K`, then:
files.create -> batches.create -> polls batches.retrieve -> files.content, and checks that every
custom_id is in the output exactly once with the body the same request gets from a direct
POST /v1/completions (greedy, so equal); the same for a chat batch; then the errors a client
sees (unknown batch, bad purpose, an invalid line failing the batch, cancel of a finished batch);
the docs example; and a 2,000-request batch whose own server is kill -9ed five times mid-run.
Prints PASS/FAIL per check and a SUMMARY line; exits 0 only when all passed. Bounded by --timeout.
"""
import argparse
import io
import json
import os
import signal
import sys
import tempfile
import time

import httpx
import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from live_server import LiveServer, run_checks  # noqa: E402

API_KEY = "batch-key-0123456789"
REQ_TIMEOUT = 20.0
FINAL = ("completed", "failed", "expired", "cancelled")


class RunTimeout(BaseException):
    """The whole-run alarm: a BaseException so no per-check handler swallows it."""


class Ctx:
    def __init__(self, server, n, binary, model_path, server_args):
        self.n = n
        self.server = server
        self.binary, self.model_path, self.server_args = binary, model_path, list(server_args)
        self.client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=REQ_TIMEOUT, max_retries=0)
        self.http = httpx.Client(base_url=server.url, timeout=REQ_TIMEOUT, trust_env=False,
                                 headers={"Authorization": f"Bearer {API_KEY}"})
        self.model = self.client.models.list().data[0].id

    def close(self):
        self.http.close()
        self.client.close()

    def upload(self, lines):
        text = "".join(json.dumps(l) + "\n" for l in lines).encode()
        f = self.client.files.create(file=("requests.jsonl", io.BytesIO(text)), purpose="batch")
        assert f.object == "file" and f.purpose == "batch" and f.bytes == len(text), f
        assert f.id.startswith("file-"), f.id
        return f

    def run_batch(self, lines, endpoint, budget=60.0):
        f = self.upload(lines)
        b = self.client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h",
                                       metadata={"test": "openai_batches"})
        assert b.object == "batch" and b.status == "validating" and b.input_file_id == f.id, b
        assert b.metadata == {"test": "openai_batches"}, b.metadata
        deadline = time.time() + budget
        while b.status not in FINAL:
            assert time.time() < deadline, f"batch {b.id} still {b.status} after {budget} s: {b.request_counts}"
            time.sleep(0.1)
            b = self.client.batches.retrieve(b.id)
        return b

    def direct(self, endpoint, body):
        r = self.http.post(endpoint, json=body)
        assert r.status_code == 200, f"{endpoint}: HTTP {r.status_code} {r.text[:200]}"
        return r.json()


def lines_of(text):
    assert text == "" or text.endswith("\n"), "the file does not end with a newline"
    return [json.loads(l) for l in text.splitlines()]


def check_output(c, b, lines, endpoint, text_of):
    assert b.status == "completed", f"status {b.status}, errors {b.errors}"
    n = len(lines)
    rc = b.request_counts
    assert (rc.total, rc.completed, rc.failed) == (n, n, 0), rc
    assert b.output_file_id and b.error_file_id is None, (b.output_file_id, b.error_file_id)
    assert b.in_progress_at and b.finalizing_at and b.completed_at and b.expires_at, b
    meta = c.client.files.retrieve(b.output_file_id)
    assert meta.purpose == "batch_output", meta
    text = c.client.files.content(b.output_file_id).text
    assert meta.bytes == len(text.encode()), (meta.bytes, len(text.encode()))
    out = lines_of(text)
    seen = {}
    for o in out:
        assert o["custom_id"] not in seen, f"custom_id {o['custom_id']} twice"
        seen[o["custom_id"]] = o
        assert o["error"] is None and o["response"]["status_code"] == 200, o
        assert o["id"].startswith("batch_req_") and o["response"]["request_id"], o
    assert sorted(seen) == sorted(l["custom_id"] for l in lines), "custom_ids differ from the input"
    for l in lines:
        got = seen[l["custom_id"]]["response"]["body"]
        want = c.direct(endpoint, l["body"])
        assert text_of(got) == text_of(want), f"{l['custom_id']}: {text_of(got)!r} != direct {text_of(want)!r}"
        assert got["usage"] == want["usage"], (got["usage"], want["usage"])


def check_completions_batch(c):
    lines = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": c.model, "prompt": f"the cat sat on the mat {i}", "max_tokens": 6,
                       "temperature": 0}} for i in range(c.n)]
    b = c.run_batch(lines, "/v1/completions")
    check_output(c, b, lines, "/v1/completions", lambda body: body["choices"][0]["text"])
    assert any(x.id == b.id for x in c.client.batches.list(limit=10).data), "batches.list misses the batch"


def check_chat_batch(c):
    lines = [{"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": c.model, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 5,
                       "temperature": 0}} for i in range(4)]
    b = c.run_batch(lines, "/v1/chat/completions")
    check_output(c, b, lines, "/v1/chat/completions", lambda body: body["choices"][0]["message"]["content"])


def check_errors(c):
    try:
        c.client.batches.retrieve("batch_nope")
        raise AssertionError("an unknown batch was found")
    except openai.NotFoundError:
        pass
    try:
        c.client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
        raise AssertionError("purpose fine-tune was accepted")
    except openai.BadRequestError:
        pass
    good = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
            "body": {"model": c.model, "prompt": "x", "max_tokens": 2}}
    bad = dict(good, custom_id="b", body={"model": "no-such-model", "prompt": "x"})
    b = c.run_batch([good, bad], "/v1/completions")
    assert b.status == "failed", b.status
    e = b.errors.data[0]
    assert (e.code, e.line, e.param) == ("model_not_found", 2, "body.model"), e
    assert b.request_counts.total == 0, b.request_counts
    done = c.run_batch([good], "/v1/completions")
    assert done.status == "completed", done.status
    try:
        c.client.batches.cancel(done.id)
        raise AssertionError("a completed batch was cancelled")
    except openai.BadRequestError as ex:
        assert "Cannot cancel" in str(ex), ex


def check_kill_nine(c):
    """A 2,000-request batch created with the openai client on its own server and state dir; that
    server is kill -9ed five times (at least four before it ends) while the batch runs and restarted on the same state dir each
    time; the finished output holds every custom_id exactly once, each text equal to the main
    server's direct greedy answer."""
    n, kills = 2000, 5
    lines = [{"custom_id": f"k-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": c.model, "prompt": f"the dog ran far {i}", "max_tokens": 8, "temperature": 0}}
             for i in range(n)]
    want = {}
    for start in range(0, n, 64):
        chunk = lines[start:start + 64]
        r = c.direct("/v1/completions", {"model": c.model, "prompt": [l["body"]["prompt"] for l in chunk],
                                         "max_tokens": 8, "temperature": 0})
        for ch in r["choices"]:
            want[chunk[ch["index"]]["custom_id"]] = ch["text"]
    # Every kill costs the rows running then one attempt: allow many.
    args = ["--model", c.model_path, "--state-dir", None, "--port", "0", "--slots", "2", "--threads", "1",
            "--max-attempts", "100"] + c.server_args
    with tempfile.TemporaryDirectory(prefix="corelm_batches_kill_") as state:
        args[3] = state
        srv = LiveServer(c.binary, args, api_key=API_KEY, keep_lines=30)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, timeout=REQ_TIMEOUT, max_retries=0)
        try:
            text = "".join(json.dumps(l) + "\n" for l in lines).encode()
            f = client.files.create(file=("kill.jsonl", io.BytesIO(text)), purpose="batch")
            b = client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
            killed_mid_run = 0
            for k in range(kills):
                # Kill after some progress since the last start (or at once if the batch is slow to start).
                base = client.batches.retrieve(b.id).request_counts.completed
                deadline = time.time() + 20
                while time.time() < deadline:
                    cur = client.batches.retrieve(b.id)
                    if cur.status in FINAL or cur.request_counts.completed >= base + n // (5 * kills):
                        break
                    time.sleep(0.01)
                if cur.status in FINAL:
                    break
                srv.kill()
                killed_mid_run += 1
                srv = LiveServer(c.binary, args, api_key=API_KEY, keep_lines=30)
                client.close()
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, timeout=REQ_TIMEOUT, max_retries=0)
            assert killed_mid_run >= 4, f"only {killed_mid_run} kills landed before the batch finished"
            deadline = time.time() + 60
            while (b := client.batches.retrieve(b.id)).status not in FINAL:
                assert time.time() < deadline, f"batch still {b.status}: {b.request_counts}"
                time.sleep(0.05)
            assert b.status == "completed", (b.status, b.errors)
            rc = b.request_counts
            assert (rc.total, rc.completed, rc.failed) == (n, n, 0), rc
            out = lines_of(client.files.content(b.output_file_id).text)
            seen = {}
            for o in out:
                assert o["custom_id"] not in seen, f"custom_id {o['custom_id']} twice"
                seen[o["custom_id"]] = o["response"]["body"]["choices"][0]["text"]
            assert len(seen) == n, f"{len(seen)} of {n} custom_ids in the output"
            bad = [k for k in want if seen.get(k) != want[k]]
            assert not bad, f"{len(bad)} texts differ from the direct answers, e.g. {bad[0]}: {seen.get(bad[0])!r} != {want[bad[0]]!r}"
            print(f"  kill_nine: {killed_mid_run} kill -9 during the batch, {n} results exactly once", flush=True)
        finally:
            client.close()
            srv.kill()


def check_docs_example(c):
    """docs/SERVING.md, "Files and Batches API": the requests.jsonl lines of its sh example and its
    openai-client Python example, run as written (only the URL, the key and the model id differ)."""
    import re
    import subprocess
    docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "SERVING.md")
    with open(docs, encoding="utf-8") as f:
        section = re.search(r"^## Files and Batches API\n(.*?)(?=^## |\Z)", f.read(), re.S | re.M).group(1)
    sh = re.search(r"^```sh\n(.*?)^```", section, re.S | re.M).group(1)
    py = re.search(r"^```python\n(.*?)^```", section, re.S | re.M).group(1)
    lines = [ln for ln in sh.splitlines() if ln.startswith('{"custom_id"')]
    assert len(lines) >= 2, "the sh example holds no requests.jsonl lines"
    with tempfile.TemporaryDirectory(prefix="corelm_batches_docs_") as cwd:
        with open(os.path.join(cwd, "requests.jsonl"), "w", encoding="utf-8") as f:
            for ln in lines:
                f.write(ln.replace('"model":"tiny"', '"model":"%s"' % c.model) + "\n")
        code = py.replace("http://localhost:8080/v1", c.server.url + "/v1").replace('api_key="-"', 'api_key="%s"' % API_KEY)
        r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, NO_PROXY="127.0.0.1,localhost"))
        assert r.returncode == 0, "the docs example failed:\n" + r.stderr[-2000:]
    out = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
    want = sorted(json.loads(ln)["custom_id"] for ln in lines)
    assert sorted(o["custom_id"] for o in out) == want, r.stdout[:1000]
    for o in out:
        assert o["response"]["status_code"] == 200 and o["error"] is None, o
        assert o["response"]["body"]["choices"][0]["text"] is not None, o


CHECKS = [check_completions_batch, check_chat_batch, check_errors, check_docs_example, check_kill_nine]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corelm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--timeout", type=float, default=90.0, help="the whole run")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--server-arg", action="append", default=[])
    args = ap.parse_args()

    def on_alarm(*_):
        raise RunTimeout(f"the run went past --timeout {args.timeout} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.timeout))
    t0 = time.time()
    server = c = None
    failed, passed = [], []
    with tempfile.TemporaryDirectory(prefix="corelm_batches_state_") as state:
        try:
            server = LiveServer(args.corelm, ["--model", args.model, "--state-dir", state, "--port", "0", "--slots", "4", "--threads", "1"]
                                + args.server_arg, api_key=API_KEY, keep_lines=30)
            print(f"server ready at {server.url} after {time.time() - t0:.2f} s", flush=True)
            c = Ctx(server, args.requests, args.corelm, args.model, args.server_arg)
            p, f = run_checks(CHECKS, c, __file__)
            passed += p
            failed += f
            if server.proc.poll() is not None:
                failed.append("server-alive")
                print(f"FAIL server exited during the run (rc {server.proc.returncode}):\n{server.log()}")
        except (Exception, RunTimeout) as e:  # noqa: BLE001
            failed.append("setup" if not passed and not failed else "timeout")
            print(f"FAIL setup: {type(e).__name__}: {e}", flush=True)
        finally:
            signal.alarm(0)
            if c:
                c.close()
            if server:
                server.stop()
    print(f"SUMMARY {'OK' if not failed else 'FAILED'}: {len(passed)}/{len(CHECKS)} checks passed in "
          f"{time.time() - t0:.1f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    if failed and server:
        print("server log tail:\n" + server.log())
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
