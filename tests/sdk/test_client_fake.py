#!/usr/bin/env python3
"""corelm.Client and corelm-client against a stdlib http.server stand-in (client-side behaviour only).

  PYTHONPATH=python python3 tests/sdk/test_client_fake.py [-v]

The stand-in speaks the wire shapes of docs/SERVING.md (/v1/generate, get_results, Files, Batches,
completions with `choices`, OpenAI error bodies) and can be told to answer 429 / 503 with a
Retry-After, to keep requests queued for a few polls, or to fail one prompt. It checks the
request shapes the client sends (auth header, multipart purpose=batch, long-poll timeout) and the
client's retries, ordering, chunking and error mapping. What the real server does is
tests/sdk/test_sdk_live.py's job.
"""
import contextlib
import io
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import corelm
from corelm import cli

KEY = "sdk-test-key"


class Fake:
    """The stand-in's state, shared by its handler threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = []          # (method, path, headers, body bytes)
        self.fail_next = []         # [(status, retry_after)] answered before the next requests
        self.queued_polls = 0       # get_results answers "queued" this many times for each id
        self.results = {}           # id -> {"prompt", "params", "polls"}
        self.next_id = 0
        self.files = {}
        self.batches = {}
        self.batch_polls = 2        # GET /v1/batches/{id} answers in_progress this many times
        self.max_prompts = None     # /v1/generate rejects more prompts than this (400)
        self.health = (200, "ok")
        self.max_queued = None      # /v1/generate answers 429 beyond this many unfinished requests
        self.events = []            # ("submit", n accepted) / ("done", 1), in order

    def completion(self, prompt, params):
        text = params.get("_echo_prefix", "") + "<" + prompt + ">"
        n = int(params.get("n", 1))
        return {"id": "cmpl-x", "object": "text_completion", "model": params.get("model", "tiny"),
                "choices": [{"index": k, "text": text + ("#%d" % k if n > 1 else ""), "finish_reason": "length"}
                            for k in range(n)],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def make_handler(fake):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, status, obj=None, raw=None, ctype="application/json", headers=()):
            data = raw if raw is not None else json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status, message, code, type_="invalid_request_error", param=None, headers=()):
            self._send(status, {"error": {"message": message, "type": type_, "param": param, "code": code}},
                       headers=headers)

        def _handle(self, method):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            with fake.lock:
                fake.requests.append((method, self.path, dict(self.headers), body))
                forced = fake.fail_next.pop(0) if fake.fail_next else None
            if self.path != "/health" and self.headers.get("Authorization") != "Bearer " + KEY:
                return self._error(401, "missing or wrong API key", "invalid_api_key", "authentication_error")
            if forced:
                status, retry_after = forced
                hdr = [("Retry-After", retry_after)] if retry_after is not None else []
                return self._error(status, "busy", "queue_full" if status == 429 else "draining",
                                   "rate_limit_error" if status == 429 else "server_error", headers=hdr)
            j = json.loads(body) if body and self.headers.get("Content-Type") == "application/json" else None
            p = self.path
            if method == "GET" and p == "/health":
                return self._send(fake.health[0], {"status": fake.health[1]})
            if method == "GET" and p == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model", "created": 0,
                                                                    "owned_by": "corelm", "status": "loaded"}]})
            if j is not None and j.get("model") not in (None, "tiny"):
                return self._error(404, "model '%s' not found" % j["model"], "model_not_found", param="model")
            if method == "POST" and p == "/v1/generate":
                prompts = j["prompts"]
                if fake.max_prompts is not None and len(prompts) > fake.max_prompts:
                    return self._error(400, "too many prompts", None, param="prompts")
                ids = []
                with fake.lock:
                    pending = sum(1 for r in fake.results.values() if not r.get("done"))
                    full = fake.max_queued is not None and pending + len(prompts) > fake.max_queued
                if full:
                    return self._error(429, "queue full", "queue_full", "rate_limit_error",
                                       headers=[("Retry-After", "0")])
                with fake.lock:
                    for pr in prompts:
                        rid = "req-%d" % fake.next_id
                        fake.next_id += 1
                        fake.results[rid] = {"prompt": pr, "params": {k: v for k, v in j.items() if k != "prompts"},
                                             "polls": 0}
                        ids.append(rid)
                    fake.events.append(("submit", len(ids)))
                return self._send(200, {"object": "list", "request_ids": ids})
            if method == "POST" and p == "/v1/generate/get_results":
                out = []
                with fake.lock:
                    for rid in j["request_ids"]:
                        r = fake.results.get(rid)
                        if r is None:
                            out.append({"request_id": rid, "status": "failed", "response": None,
                                        "error": {"message": "unknown request id", "code": "not_found"}})
                            continue
                        r["polls"] += 1
                        if r["polls"] <= fake.queued_polls:
                            out.append({"request_id": rid, "status": "queued", "response": None, "error": None})
                        elif r["prompt"] == "FAIL":
                            out.append({"request_id": rid, "status": "failed", "response": None,
                                        "error": {"message": "generation failed", "code": "server_error"}})
                        else:
                            if not r.get("done"):
                                fake.events.append(("done", 1))
                            r["done"] = True
                            out.append({"request_id": rid, "status": "done",
                                        "response": fake.completion(r["prompt"], r["params"]), "error": None})
                return self._send(200, {"object": "list", "results": out})
            if method == "POST" and p == "/v1/completions":
                prompts = j["prompt"] if isinstance(j["prompt"], list) else [j["prompt"]]
                choices = j.get("choices")
                ch = [{"index": i, "text": choices[len(pr) % len(choices)] if choices else "x",
                       "finish_reason": "stop"} for i, pr in enumerate(prompts)]
                return self._send(200, {"object": "text_completion", "choices": ch})
            if method == "POST" and p == "/v1/chat/completions":
                last = j["messages"][-1]["content"]
                return self._send(200, {"object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "re:" + last}, "finish_reason": "stop"}]})
            if method == "POST" and p == "/v1/files":
                m = re.match(r"multipart/form-data; boundary=(.+)$", self.headers.get("Content-Type", ""))
                if not m:
                    return self._error(400, "not multipart", None)
                parts = {}
                for part in body.split(b"--" + m.group(1).encode())[1:-1]:
                    head, _, content = part.partition(b"\r\n\r\n")
                    name = re.search(rb'name="([^"]+)"', head).group(1).decode()
                    parts[name] = content[:-2]  # the CRLF before the next boundary
                if parts.get("purpose") != b"batch" or "file" not in parts:
                    return self._error(400, "purpose must be batch", None, param="purpose")
                with fake.lock:
                    fid = "file-%d" % len(fake.files)
                    fake.files[fid] = parts["file"]
                return self._send(200, {"id": fid, "object": "file", "bytes": len(parts["file"]),
                                        "purpose": "batch", "filename": "input.jsonl"})
            m = re.match(r"^/v1/files/([^/]+)/content$", p)
            if method == "GET" and m:
                if m.group(1) not in fake.files:
                    return self._error(404, "no such file", "not_found")
                return self._send(200, raw=fake.files[m.group(1)], ctype="application/octet-stream")
            if method == "POST" and p == "/v1/batches":
                lines = [json.loads(l) for l in fake.files[j["input_file_id"]].decode().splitlines() if l.strip()]
                with fake.lock:
                    bid = "batch_%d" % len(fake.batches)
                    fake.batches[bid] = {"id": bid, "object": "batch", "endpoint": j["endpoint"],
                                         "input_file_id": j["input_file_id"], "status": "validating",
                                         "metadata": j.get("metadata"), "polls": 0, "lines": lines,
                                         "request_counts": {"total": len(lines), "completed": 0, "failed": 0}}
                return self._send(200, self._batch_view(bid))
            m = re.match(r"^/v1/batches/([^/]+)(/cancel)?$", p)
            if m and m.group(1) in fake.batches:
                bid = m.group(1)
                with fake.lock:
                    b = fake.batches[bid]
                    if m.group(2):
                        b["status"] = "cancelled"
                    elif b["status"] not in ("completed", "cancelled"):
                        b["polls"] += 1
                        b["status"] = "in_progress"
                        if b["polls"] > fake.batch_polls:
                            self._finish(bid)
                return self._send(200, self._batch_view(bid))
            return self._error(404, "no route %s %s" % (method, p), "not_found")

        def _finish(self, bid):
            b = fake.batches[bid]
            out, err = [], []
            for line in reversed(b["lines"]):  # out of order on purpose: the client orders by custom_id
                body = line["body"]
                if body.get("prompt") == "FAIL":
                    err.append({"id": "x", "custom_id": line["custom_id"],
                                "response": {"status_code": 500, "request_id": "r",
                                             "body": {"error": {"message": "boom", "code": "server_error"}}},
                                "error": None})
                else:
                    out.append({"id": "x", "custom_id": line["custom_id"], "error": None,
                                "response": {"status_code": 200, "request_id": "r",
                                             "body": fake.completion(body["prompt"], body)}})
            fid = "file-out-%s" % bid
            fake.files[fid] = "".join(json.dumps(o) + "\n" for o in out).encode()
            b["output_file_id"] = fid
            if err:
                fake.files[fid + "-err"] = "".join(json.dumps(o) + "\n" for o in err).encode()
                b["error_file_id"] = fid + "-err"
            b["status"] = "completed"
            b["request_counts"] = {"total": len(b["lines"]), "completed": len(out), "failed": len(err)}

        def _batch_view(self, bid):
            return {k: v for k, v in fake.batches[bid].items() if k not in ("polls", "lines")}

        def do_GET(self):
            self._handle("GET")

        def do_POST(self):
            self._handle("POST")

        def do_DELETE(self):
            self._handle("DELETE")

    return H


class FakeServerTest(unittest.TestCase):
    def setUp(self):
        self.fake = Fake()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.fake))
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.client = corelm.Client(self.url, api_key=KEY, timeout=10, max_retry_wait=0.05)

    def tearDown(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self, method=None):
        return [p for m, p, _, _ in self.fake.requests if method is None or m == method]

    # -- basics --------------------------------------------------------------------------------
    def test_health_and_models_send_the_key(self):
        self.assertEqual(self.client.health(), {"status": "ok"})
        self.assertEqual([m["id"] for m in self.client.list_models()], ["tiny"])
        self.assertEqual(self.fake.requests[-1][2].get("Authorization"), "Bearer " + KEY)

    def test_base_url_with_v1_suffix(self):
        c = corelm.Client(self.url + "/v1/", api_key=KEY)
        self.assertEqual(c.base_url, self.url)
        self.assertEqual(len(c.list_models()), 1)

    def test_bad_base_url(self):
        with self.assertRaises(ValueError):
            corelm.Client("127.0.0.1:8080")

    def test_wrong_key_is_401(self):
        with self.assertRaises(corelm.CorelmError) as cm:
            corelm.Client(self.url, api_key="nope").list_models()
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "invalid_api_key"))

    def test_connection_refused_names_base_url(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        url = "http://127.0.0.1:%d" % port
        with self.assertRaises(corelm.CorelmConnectionError) as cm:
            corelm.Client(url).health()
        self.assertIn(url, str(cm.exception))
        self.assertIn("connection refused", str(cm.exception))
        self.assertIsNone(cm.exception.status)

    def test_generate_waits_for_a_gone_server_bounded(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        c = corelm.Client("http://127.0.0.1:%d" % port, reconnect_timeout=0.4)
        t0 = time.monotonic()
        with self.assertRaises(corelm.CorelmConnectionError) as cm:
            c.generate(["a"])
        self.assertTrue(cm.exception.refused)
        self.assertGreaterEqual(time.monotonic() - t0, 0.4)
        self.assertLess(time.monotonic() - t0, 5)
        t0 = time.monotonic()
        with self.assertRaises(corelm.CorelmConnectionError):
            c.list_models()  # a single call does not wait
        self.assertLess(time.monotonic() - t0, 0.3)

    # -- generate ------------------------------------------------------------------------------
    def test_generate_in_order_with_params_chunks_and_window(self):
        c = corelm.Client(self.url, api_key=KEY, submit_chunk=7, max_in_flight=20, poll_chunk=5)
        self.fake.queued_polls = 1
        prompts = ["p%d" % i for i in range(53)]
        texts = c.generate(prompts, max_tokens=5, temperature=0.5, seed=3, stop=["\n"])
        self.assertEqual(texts, ["<p%d>" % i for i in range(53)])
        subs = [json.loads(b) for m, p, _, b in self.fake.requests if p == "/v1/generate"]
        self.assertTrue(all(len(s["prompts"]) <= 7 for s in subs))
        self.assertEqual(sum(len(s["prompts"]) for s in subs), 53)
        self.assertEqual({k: subs[0][k] for k in ("max_tokens", "temperature", "seed", "stop")},
                         {"max_tokens": 5, "temperature": 0.5, "seed": 3, "stop": ["\n"]})
        self.assertNotIn("model", subs[0])  # None parameters are not sent
        polls = [json.loads(b) for m, p, _, b in self.fake.requests if p == "/v1/generate/get_results"]
        self.assertTrue(all(len(q["request_ids"]) <= 5 and q["timeout"] == c.poll_timeout for q in polls))
        # the window: never more than 20 prompts submitted and not yet reported done
        self.assertLessEqual(max(self._window_estimate()), 20)

    def _window_estimate(self):
        """Unfinished requests after each accepted submit: ids accepted minus ids reported done."""
        unfinished, peaks = 0, []
        for kind, n in self.fake.events:
            unfinished += n if kind == "submit" else -n
            if kind == "submit":
                peaks.append(unfinished)
        return peaks

    def test_generate_adapts_to_a_small_server_queue(self):
        # The server holds 10 unfinished requests; chunks of 256 must shrink, not fail.
        self.fake.max_queued = 10
        c = corelm.Client(self.url, api_key=KEY, max_retries=3)
        self.assertEqual(c.generate(["p%d" % i for i in range(53)]), ["<p%d>" % i for i in range(53)])
        self.assertLessEqual(max(self._window_estimate()), 10)
        # Full with someone else's work: bounded waits, then the 429.
        self.fake.max_queued = 0
        with self.assertRaises(corelm.CorelmError) as cm:
            c.generate(["x"])
        self.assertEqual(cm.exception.status, 429)

    def test_generate_single_string_and_n(self):
        self.assertEqual(self.client.generate("hi"), ["<hi>"])
        self.assertEqual(self.client.generate(["a"], n=2), [["<a>#0", "<a>#1"]])
        self.assertEqual(self.client.generate([]), [])

    def test_generate_rejects_non_strings(self):
        with self.assertRaises(TypeError):
            self.client.generate(["ok", 3])

    def test_generate_failed_prompt_names_its_index(self):
        with self.assertRaises(corelm.CorelmError) as cm:
            self.client.generate(["a", "b", "FAIL", "c"])
        self.assertEqual(cm.exception.index, 2)
        self.assertIn("prompt 2", str(cm.exception))
        self.assertEqual(cm.exception.code, "server_error")

    def test_unknown_model_is_404(self):
        with self.assertRaises(corelm.CorelmError) as cm:
            self.client.generate(["a"], model="nope")
        e = cm.exception
        self.assertEqual((e.status, e.code, e.param), (404, "model_not_found", "model"))
        self.assertIn("nope", e.message)

    def test_submit_and_get_results(self):
        ids = self.client.submit(["x", "y"], max_tokens=3)
        self.assertEqual(len(ids), 2)
        res = self.client.get_results(ids, timeout=1)
        self.assertEqual([r["request_id"] for r in res], ids)
        self.assertEqual([r["response"]["choices"][0]["text"] for r in res], ["<x>", "<y>"])

    # -- retries ---------------------------------------------------------------------------------
    def test_429_and_503_are_retried_after_retry_after(self):
        self.fake.fail_next = [(429, "0"), (503, "0"), (429, None)]
        self.assertEqual(self.client.generate(["a"]), ["<a>"])
        self.assertEqual(self.paths().count("/v1/generate"), 4)

    def test_retry_after_is_honoured(self):
        c = corelm.Client(self.url, api_key=KEY, max_retry_wait=5)
        self.fake.fail_next = [(429, "1")]
        t0 = time.monotonic()
        c.list_models()
        self.assertGreaterEqual(time.monotonic() - t0, 0.9)

    def test_retries_are_bounded(self):
        c = corelm.Client(self.url, api_key=KEY, max_retries=2, max_retry_wait=0.01)
        self.fake.fail_next = [(429, "0")] * 5
        with self.assertRaises(corelm.CorelmError) as cm:
            c.list_models()
        self.assertEqual((cm.exception.status, cm.exception.code), (429, "queue_full"))
        self.assertEqual(self.paths().count("/v1/models"), 3)

    def test_other_errors_are_not_retried(self):
        self.fake.max_prompts = 1
        with self.assertRaises(corelm.CorelmError) as cm:
            self.client.submit(["a", "b"])
        self.assertEqual((cm.exception.status, cm.exception.param), (400, "prompts"))
        self.assertEqual(self.paths().count("/v1/generate"), 1)

    def test_health_503_body_is_returned(self):
        self.fake.health = (503, "loading")
        self.assertEqual(self.client.health(), {"status": "loading"})
        self.assertEqual(self.paths().count("/health"), 1)  # reported, not retried

    # -- batches ---------------------------------------------------------------------------------
    def test_generate_above_threshold_uses_batches_in_order(self):
        c = corelm.Client(self.url, api_key=KEY, batch_threshold=50, batch_size=40)
        prompts = ["q%d" % i for i in range(90)]
        self.assertEqual(c.generate(prompts, max_tokens=4), ["<q%d>" % i for i in range(90)])
        self.assertNotIn("/v1/generate", self.paths())
        self.assertEqual(self.paths("POST").count("/v1/files"), 3)  # 40 + 40 + 10 lines
        self.assertEqual(self.paths("POST").count("/v1/batches"), 3)
        line = json.loads(next(iter(self.fake.files.values())).decode().splitlines()[0])
        self.assertEqual(line, {"custom_id": "prompt-0", "method": "POST", "url": "/v1/completions",
                                "body": {"max_tokens": 4, "prompt": "q0"}})

    def test_batch_path_failed_line_names_its_index(self):
        c = corelm.Client(self.url, api_key=KEY, batch_threshold=3)
        with self.assertRaises(corelm.CorelmError) as cm:
            c.generate(["a", "b", "c", "FAIL", "d"])
        self.assertEqual(cm.exception.index, 3)
        self.assertEqual(cm.exception.status, 500)

    def test_batch_api_create_status_download_cancel(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "in.jsonl")
            with open(path, "w") as f:
                for i in range(3):
                    f.write(json.dumps({"custom_id": "c%d" % i, "method": "POST", "url": "/v1/completions",
                                        "body": {"prompt": "z%d" % i}}) + "\n")
            b = self.client.create_batch(path, metadata={"k": "v"})
            self.assertEqual((b["status"], b["endpoint"], b["metadata"]), ("validating", "/v1/completions", {"k": "v"}))
            with self.assertRaises(corelm.CorelmError):
                self.client.download(b["id"], os.path.join(d, "out.jsonl"))  # no output yet
            done = self.client.wait_batch(b["id"], timeout=10, poll_interval=0.01)
            self.assertEqual(done["status"], "completed")
            self.client.download(b["id"], os.path.join(d, "out.jsonl"))
            with open(os.path.join(d, "out.jsonl")) as f:
                ids = sorted(json.loads(l)["custom_id"] for l in f)
            self.assertEqual(ids, ["c0", "c1", "c2"])
            self.assertEqual([n for n in os.listdir(d) if n.startswith(".corelm-download-")], [])
            b2 = self.client.create_batch([{"custom_id": "x", "method": "POST", "url": "/v1/completions",
                                            "body": {"prompt": "x"}}])
            self.assertEqual(self.client.cancel_batch(b2["id"])["status"], "cancelled")
        with self.assertRaises(ValueError):
            self.client.create_batch([])

    def test_wait_batch_timeout(self):
        self.fake.batch_polls = 10 ** 6
        b = self.client.create_batch([{"custom_id": "x", "method": "POST", "url": "/v1/completions",
                                       "body": {"prompt": "x"}}])
        with self.assertRaises(corelm.CorelmError) as cm:
            self.client.wait_batch(b["id"], timeout=0.3, poll_interval=0.05)
        self.assertEqual(cm.exception.code, "timeout")

    # -- classify, chat, not implemented ------------------------------------------------------
    def test_classify_request_shape(self):
        labels = ["pos", "neg"]
        texts = ["t%d" % i for i in range(70)]
        got = self.client.classify(texts, labels)
        self.assertEqual(len(got), 70)
        self.assertTrue(set(got) <= set(labels))
        bodies = [json.loads(b) for m, p, _, b in self.fake.requests if p == "/v1/completions"]
        self.assertEqual([len(b["prompt"]) for b in bodies], [64, 6])
        self.assertEqual(bodies[0]["prompt"][0], "t0\nLabel:")
        self.assertEqual((bodies[0]["choices"], bodies[0]["temperature"], bodies[0]["max_tokens"]),
                         ([" pos", " neg"], 0, 5))
        # the fake picks choices[len(prompt) % 2]
        self.assertEqual(got[0], labels[len("t0\nLabel:") % 2])
        with self.assertRaises(ValueError):
            self.client.classify(["a"], ["only"])

    def test_chat(self):
        self.assertEqual(self.client.chat("hello"), "re:hello")
        self.assertEqual(self.client.chat([{"role": "user", "content": "x"}], max_tokens=3), "re:x")

    def test_not_implemented_name_the_endpoint(self):
        for call, endpoint in ((lambda: self.client.train("d.jsonl", model_name="m", train_args={}),
                                "/v1/fine_tuning/jobs"),
                               (lambda: self.client.get_training_job("ftjob-1"), "/v1/fine_tuning/jobs")):
            with self.assertRaises(corelm.CorelmNotImplemented) as cm:
                call()
            self.assertIn(endpoint, str(cm.exception))
            self.assertIsInstance(cm.exception, NotImplementedError)
        self.assertEqual(self.fake.requests, [])

    # -- corelm-client ---------------------------------------------------------------------------
    def run_cli(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(["--base-url", self.url, "--api-key", KEY] + list(argv))
            except SystemExit as e:
                rc = e.code
        return rc, out.getvalue(), err.getvalue()

    def test_cli(self):
        self.assertEqual(self.run_cli("health"), (0, "ok\n", ""))
        rc, out, _ = self.run_cli("ls")
        self.assertEqual((rc, out), (0, "tiny\tloaded\n"))
        rc, out, _ = self.run_cli("generate", "a", "b", "--max-tokens", "3")
        self.assertEqual((rc, out), (0, "<a>\n<b>\n"))
        rc, out, _ = self.run_cli("generate", "a", "--json")
        self.assertEqual(json.loads(out), {"prompt": "a", "text": "<a>"})
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write("x\n\ny\nz\n")
            f.flush()
            rc, out, _ = self.run_cli("generate", "w", "--input", f.name, "--batch-threshold", "2")
            self.assertEqual((rc, out), (0, "<w>\n<x>\n<y>\n<z>\n"))
            self.assertIn("/v1/batches", self.paths("POST"))
        rc, out, _ = self.run_cli("--json", "ls")
        self.assertEqual(json.loads(out)[0]["id"], "tiny")
        rc, _, err = self.run_cli("generate", "a", "--model", "nope")
        self.assertEqual(rc, 1)
        self.assertIn("404", err)
        self.assertIn("model_not_found", err)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "in.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                                    "body": {"prompt": "a"}}) + "\n")
            rc, out, _ = self.run_cli("batch", "submit", path)
            bid = out.strip()
            self.assertEqual(rc, 0)
            self.assertTrue(bid.startswith("batch_"))
            rc, out, _ = self.run_cli("batch", "status", bid, "--json")
            self.assertEqual(json.loads(out)["id"], bid)
            self.fake.batch_polls = 0
            rc, out, _ = self.run_cli("batch", "status", bid)
            self.assertIn("completed", out)
            out_path = os.path.join(d, "out.jsonl")
            rc, out, _ = self.run_cli("batch", "download", bid, out_path)
            self.assertEqual(rc, 0)
            with open(out_path) as f:
                self.assertEqual(json.loads(f.readline())["custom_id"], "a")
            rc, out, _ = self.run_cli("batch", "submit", path, "--wait", "--json")
            self.assertEqual((rc, json.loads(out)["status"]), (0, "completed"))
            rc, out, _ = self.run_cli("batch", "cancel", bid)
            self.assertIn("cancelled", out)
        rc, _, _ = self.run_cli("batch")
        self.assertEqual(rc, 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
