#!/usr/bin/env python3
"""corelm.Client and corelm-client against a live `corelm serve --state-dir`.

  PYTHONPATH=python python3 tests/sdk/test_sdk_live.py --corelm BIN --model DIR --docs docs/SERVING.md
                                                       [--timeout S] [--only NAME,NAME]

Starts `BIN serve --model DIR --state-dir TMP --api-key secret --port 0` (the model's id is DIR's
name), waits for /health, runs the checks below, kills the server and prints one PASS/FAIL line
per check and a summary; exits 0 only when every check passed. The reference texts are greedy
/v1/completions answers of the same server, so the queue and batch paths must give exactly them.
Checks: health_models generate_order batch_path small_queue restart classify errors cli docs_examples.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

import corelm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from live_server import LiveServer  # noqa: E402

API_KEY = "secret"  # the key docs/SERVING.md's examples use


class RunTimeout(BaseException):
    pass


def Server(binary, model, state_dir, extra=(), port=0):
    """The live server of these checks: the model, a state dir and the docs' API key."""
    return LiveServer(binary, ["--model", model, "--state-dir", state_dir, "--port", str(port)] + list(extra),
                      api_key=API_KEY)



def queue_metrics(url):
    """(rows in the queue, rows this server stored a result for) from /metrics; (0, 0) when it
    cannot be read."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer " + API_KEY})
    rows = completed = polls = 0
    try:
        with opener.open(req, timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("corelm_queue_rows{"):
                    rows += float(line.split()[-1])
                elif line.startswith("corelm_queue_completed_total"):
                    completed = float(line.split()[-1])
                elif line.startswith('corelm_requests_total{endpoint="/v1/generate/get_results"'):
                    polls += float(line.split()[-1])
    except OSError:
        pass
    return rows, completed, polls


def greedy_reference(client, model, prompts, max_tokens):
    """The texts /v1/completions gives for the prompts at temperature 0 (64 prompts per request)."""
    out = []
    for start in range(0, len(prompts), 64):
        body = json.dumps({"model": model, "prompt": prompts[start:start + 64], "max_tokens": max_tokens,
                           "temperature": 0}).encode()
        req = urllib.request.Request(client.base_url + "/v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY})
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as r:
            resp = json.loads(r.read())
        out += [c["text"] for c in sorted(resp["choices"], key=lambda c: c["index"])]
    return out


WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "blue", "river", "stone"]


def prompts_for(n, salt):
    return [" ".join(WORDS[(i * 7 + j * 3 + salt) % len(WORDS)] for j in range(1 + i % 5)) + " %d" % i
            for i in range(n)]


class Checks:
    def __init__(self, server, model, docs, python_path, binary, model_dir):
        self.binary = binary
        self.model_dir = model_dir
        self.url = server.url
        self.model = model
        self.docs = docs
        self.python_path = python_path
        self.client = corelm.Client(self.url, api_key=API_KEY, timeout=30)

    def check_health_models(self):
        assert self.client.health() == {"status": "ok"}, self.client.health()
        ids = [m["id"] for m in self.client.list_models()]
        assert self.model in ids, ids

    def check_generate_order(self):
        prompts = prompts_for(200, 1)
        want = greedy_reference(self.client, self.model, prompts, 6)
        # Distinct prompts give many distinct texts, so a reordering cannot go unnoticed.
        assert len(set(want)) > 50, "the reference texts are too alike: %r" % sorted(set(want))[:5]
        got = self.client.generate(prompts, model=self.model, max_tokens=6, temperature=0)
        assert len(got) == 200
        bad = [i for i in range(200) if got[i] != want[i]]
        assert not bad, "prompt %d: %r != %r (%d differ)" % (bad[0], got[bad[0]], want[bad[0]], len(bad))
        # submit + get_results by hand: one id per prompt, results in the order asked.
        ids = self.client.submit(prompts[:3], model=self.model, max_tokens=6, temperature=0)
        assert len(ids) == 3 and len(set(ids)) == 3, ids
        deadline = time.time() + 30
        while True:
            res = self.client.get_results(ids, timeout=5)
            assert [r["request_id"] for r in res] == ids, res
            if all(r["status"] == "done" for r in res) or time.time() > deadline:
                break
        assert [r["response"]["choices"][0]["text"] for r in res] == want[:3], res

    def check_batch_path(self):
        prompts = prompts_for(60, 2)
        want = greedy_reference(self.client, self.model, prompts, 5)
        before = {b["id"] for b in self.client.list_batches()}
        c = corelm.Client(self.url, api_key=API_KEY, timeout=30, batch_threshold=50)
        got = c.generate(prompts, model=self.model, max_tokens=5, temperature=0)
        assert got == want, [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w][:3]
        new = [b for b in self.client.list_batches() if b["id"] not in before]
        assert len(new) == 1 and new[0]["status"] == "completed", new
        assert new[0]["request_counts"]["total"] == 60, new[0]
        # A chat batch through create_batch / wait_batch / file_content.
        lines = [{"custom_id": "chat-%d" % i, "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": self.model, "messages": [{"role": "user", "content": p}], "max_tokens": 3}}
                 for i, p in enumerate(prompts[:4])]
        b = self.client.wait_batch(self.client.create_batch(lines, endpoint="/v1/chat/completions")["id"], timeout=30)
        assert b["status"] == "completed" and b["request_counts"]["completed"] == 4, b
        rows = [json.loads(l) for l in self.client.file_content(b["output_file_id"]).splitlines() if l.strip()]
        assert sorted(r["custom_id"] for r in rows) == ["chat-%d" % i for i in range(4)], rows
        assert all(r["response"]["body"]["object"] == "chat.completion" for r in rows), rows[0]

    def check_small_queue(self):
        """A server whose queue holds 30 requests: generate's chunks of 256 get 429 and shrink."""
        prompts = prompts_for(120, 5)
        want = greedy_reference(self.client, self.model, prompts, 4)
        state = tempfile.mkdtemp(prefix="corelm_sdk_small_")
        small = Server(self.binary, self.model_dir, state, ["--max-queued", "30"])
        try:
            c = corelm.Client(small.url, api_key=API_KEY, timeout=30)
            assert c.generate(prompts, model=self.model, max_tokens=4, temperature=0) == want
            try:
                corelm.Client(small.url, api_key=API_KEY, max_retries=0).submit(prompts[:31], model=self.model)
                raise AssertionError("31 prompts fit a queue of 30")
            except corelm.CorelmError as e:
                assert (e.status, e.code) == (429, "queue_full"), e
        finally:
            small.stop()
            subprocess.run(["rm", "-rf", state])

    def check_restart(self):
        """kill -9 of the server while generate() runs, then a restart on the same port and state
        dir: generate() rides it out and returns every text, equal to an uninterrupted run."""
        prompts = prompts_for(1500, 6)
        want = greedy_reference(self.client, self.model, prompts, 24)
        state = tempfile.mkdtemp(prefix="corelm_sdk_restart_")
        srv = Server(self.binary, self.model_dir, state)
        port = int(srv.url.rsplit(":", 1)[1])
        out = {}
        c = corelm.Client(srv.url, api_key=API_KEY, timeout=30, reconnect_timeout=30, submit_chunk=50)

        def run():
            try:
                out["texts"] = c.generate(prompts, model=self.model, max_tokens=24, temperature=0)
            except Exception as e:  # reported below
                out["error"] = e

        t = threading.Thread(target=run, daemon=True)
        try:
            t.start()
            # Kill once every prompt is queued and some results are stored: mid-drain, not at a
            # fixed time (a quiet machine may finish it all in a fraction of a second), and not
            # during a submit, which the SDK never retries after a reset (it cannot tell whether
            # the server queued it).
            # Every row in the queue is not enough: the last submit's answer may still be on its
            # way. The SDK polls only between submits, so a get_results answered after the rows
            # were all seen means no submit was waiting for its answer any more.
            deadline = time.time() + 30
            polls_when_queued = None
            while time.time() < deadline and t.is_alive():
                rows, completed, polls = queue_metrics(srv.url)
                if polls_when_queued is None and rows >= len(prompts):
                    polls_when_queued = polls
                if polls_when_queued is not None and polls > polls_when_queued and completed >= 1:
                    break
                time.sleep(0.005)
            alive_at_kill = t.is_alive()
            srv.proc.kill()
            srv.proc.wait(10)
            time.sleep(0.3)
            srv = Server(self.binary, self.model_dir, state, port=port)
            t.join(60)
            assert not t.is_alive(), "generate() did not finish after the restart"
            assert "error" not in out, repr(out.get("error"))
            assert alive_at_kill, "generate() had finished before the kill (make the work longer)"
            got = out["texts"]
            bad = [i for i in range(len(prompts)) if got[i] != want[i]]
            assert not bad, "prompt %d: %r != %r (%d differ)" % (bad[0], got[bad[0]], want[bad[0]], len(bad))
        finally:
            srv.stop()
            subprocess.run(["rm", "-rf", state])

    def check_classify(self):
        labels = ["yes", "no"]
        texts = prompts_for(10, 3)
        got = self.client.classify(texts, labels, model=self.model)
        assert len(got) == 10 and set(got) <= set(labels), got

    def check_errors(self):
        for call in (lambda: self.client.generate(["a"], model="no-such-model"),
                     lambda: self.client.submit(["a"], model="no-such-model"),
                     lambda: self.client.list_models() and corelm.Client(self.url, api_key="wrong").list_models()):
            try:
                call()
            except corelm.CorelmError as e:
                assert e.status in (404, 401), e
                assert e.code in ("model_not_found", "invalid_api_key"), e
                continue
            raise AssertionError("no error raised")
        # A prompt too long for the context fails alone; both paths name its index.
        long = "the cat sat " * 400
        for c in (self.client, corelm.Client(self.url, api_key=API_KEY, batch_threshold=2)):
            try:
                c.generate(["a dog", long, "the mat"], model=self.model, max_tokens=2)
                raise AssertionError("no error for a prompt beyond the context")
            except corelm.CorelmError as e:
                assert (e.status, e.code, e.index) == (400, "context_length_exceeded", 1), e
        # A batch whose input has a bad line fails validation with OpenAI's errors.data.
        b = self.client.create_batch([{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}])
        b = self.client.wait_batch(b["id"], timeout=30)
        assert b["status"] == "failed", b
        assert b["errors"]["data"][0]["code"] == "invalid_url" and b["errors"]["data"][0]["line"] == 1, b
        try:
            self.client.get_batch("batch_does_not_exist")
            raise AssertionError("no error for an unknown batch")
        except corelm.CorelmError as e:
            assert e.status == 404, e
        # score: the numbers of /v1/score itself, in order, and a bad text named by its index.
        texts = prompts_for(70, 5)  # more than one request of 64
        got = self.client.score(texts, model=self.model)
        assert len(got) == len(texts), len(got)
        for i in (0, 63, 64, 69):
            body = json.dumps({"model": self.model, "input": texts[i]}).encode()
            req = urllib.request.Request(self.client.base_url + "/v1/score", data=body, method="POST",
                                         headers={"Content-Type": "application/json", "Authorization": "Bearer " + API_KEY})
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as r:
                direct = json.loads(r.read())["data"][0]
            assert got[i] == {k: direct[k] for k in ("logprob", "tokens", "mean_logprob", "perplexity")}, (i, got[i], direct)
            assert got[i]["logprob"] < 0 and got[i]["tokens"] >= 1, got[i]
        try:
            self.client.score(["the cat sat", ""], model=self.model)
            raise AssertionError("an empty text was scored")
        except corelm.CorelmError as e:
            assert (e.status, e.param, e.index) == (400, "input[1]", 1), (e.status, e.param, e.index)

    def cli(self, *args, expect=0):
        env = dict(os.environ, PYTHONPATH=self.python_path, CORELM_API_KEY=API_KEY)
        r = subprocess.run([sys.executable, "-m", "corelm.cli", "--base-url", self.url] + list(args),
                           capture_output=True, text=True, timeout=60, env=env)
        assert expect is None or r.returncode == expect, (args, r.returncode, r.stdout, r.stderr)
        self.last_err = r.stderr
        return r.stdout

    def check_cli(self):
        assert self.cli("health").strip() == "ok"
        assert self.cli("ls").split("\t")[0] == self.model
        prompts = prompts_for(3, 4)
        want = greedy_reference(self.client, self.model, prompts, 4)
        out = self.cli("generate", *prompts, "--model", self.model, "--max-tokens", "4", "--temperature", "0",
                       "--json")
        assert [json.loads(l)["text"] for l in out.splitlines()] == want, out
        assert self.cli("generate", "x", "--model", "no-such-model", expect=1) == ""
        assert "404" in self.last_err and "model_not_found" in self.last_err, self.last_err
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "in.jsonl")
            with open(path, "w") as f:
                for i, p in enumerate(prompts):
                    f.write(json.dumps({"custom_id": "c-%d" % i, "method": "POST", "url": "/v1/completions",
                                        "body": {"model": self.model, "prompt": p, "max_tokens": 4,
                                                 "temperature": 0}}) + "\n")
            bid = self.cli("batch", "submit", path).strip()
            assert bid, "no batch id printed"
            st = json.loads(self.cli("batch", "status", bid, "--json"))
            assert st["id"] == bid and st["endpoint"] == "/v1/completions", st
            assert bid in [b["id"] for b in json.loads(self.cli("--json", "batch", "list"))]
            self.client.wait_batch(bid, timeout=60)
            out_path = os.path.join(d, "out.jsonl")
            self.cli("batch", "download", bid, out_path)
            with open(out_path) as f:
                rows = {json.loads(l)["custom_id"]: json.loads(l) for l in f if l.strip()}
            assert sorted(rows) == ["c-0", "c-1", "c-2"], rows
            for i in range(3):
                body = rows["c-%d" % i]["response"]["body"]
                assert body["choices"][0]["text"] == want[i], (i, body)
            # cancelled at once: it may have finished already (OpenAI's cancel then answers the batch as is)
            bid2 = self.cli("batch", "submit", path).strip()
            out = self.cli("batch", "cancel", bid2, "--json", expect=None)
            if out:
                assert json.loads(out)["status"] in ("cancelling", "cancelled"), out
            else:
                assert "HTTP 4" in self.last_err, self.last_err

    def check_docs_examples(self):
        """Every ```python block of docs/SERVING.md's "Python SDK" section, run as written
        (127.0.0.1:8080 pointed at this server)."""
        with open(self.docs, encoding="utf-8") as f:
            text = f.read()
        m = re.search(r"^## Python SDK\n(.*?)(?=^## |\Z)", text, re.S | re.M)
        assert m, "docs/SERVING.md has no '## Python SDK' section"
        blocks = re.findall(r"^```python\n(.*?)^```", m.group(1), re.S | re.M)
        assert blocks, "no python examples in the Python SDK section"
        for i, code in enumerate(blocks):
            code = code.replace("http://127.0.0.1:8080", self.url).replace('"tiny"', json.dumps(self.model))
            env = dict(os.environ, PYTHONPATH=self.python_path)
            with tempfile.TemporaryDirectory() as d:
                r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                   env=env, cwd=d)
            assert r.returncode == 0, "example %d failed:\n%s\n%s" % (i, code, r.stderr[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corelm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--docs", required=True)
    ap.add_argument("--timeout", type=float, default=100)
    ap.add_argument("--only", default="")
    a = ap.parse_args()

    def alarm(*_):
        raise RunTimeout()

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(int(a.timeout))
    python_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
    names = ["health_models", "generate_order", "batch_path", "small_queue", "restart", "classify", "errors", "cli", "docs_examples"]
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    failed = []
    state = tempfile.mkdtemp(prefix="corelm_sdk_state_")
    server = None
    try:
        server = Server(a.corelm, a.model, state)
        checks = Checks(server, os.path.basename(os.path.normpath(a.model)), a.docs, os.path.abspath(python_path),
                        a.corelm, a.model)
        for n in names:
            t0 = time.time()
            try:
                getattr(checks, "check_" + n)()
                print("PASS %s (%.1f s)" % (n, time.time() - t0), flush=True)
            except RunTimeout:
                raise
            except Exception:
                failed.append(n)
                print("FAIL %s\n%s" % (n, traceback.format_exc()), flush=True)
    except RunTimeout:
        failed.append("timeout")
        print("FAIL the run passed %.0f s" % a.timeout, flush=True)
    finally:
        signal.alarm(0)
        if server:
            server.stop()
            if failed:
                print("server log (tail):\n" + server.log())
        subprocess.run(["rm", "-rf", state])
    print("SUMMARY " + ("OK" if not failed else "FAILED: " + " ".join(failed)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
