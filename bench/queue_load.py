#!/usr/bin/env python3
"""Load on the persistent queue of `corelm serve --state-dir D`: enqueue many short synthetic
prompts through POST /v1/generate, then let the server drain them, and print one JSON object.

  bench/queue_load.py --url http://127.0.0.1:PORT --pid PID --state-dir D [--total 1000000]
                      [--chunk 1000] [--max-tokens 4] [--drain-seconds 600] [--model NAME]

Prompts are "n=<i>:" (i = 0..total-1); chunk c asks for max_tokens 1 + c % --max-tokens, so the
work is a mix of 1..4 generated tokens. The server pulls from its queue while the enqueue runs (it
is not paused), so the enqueue rate is measured under a draining server, as in real use.
Figures:
  enqueue_req_s     prompts accepted per second (HTTP + one queue transaction per chunk)
  drain_req_s       rows finished per second after the enqueue ended (done + failed delta / time)
  drained           rows finished when the drain phase ended; when --drain-seconds ran out first,
                    drain_extrapolated_s = rows left / drain_req_s (said in the output)
  peak_rss_mb       VmHWM of --pid at the end (the server's peak resident memory)
  server_cpu_s      user + sys CPU seconds of --pid during the enqueue and the drain
  rss_mb_samples    VmRSS every ~10% of the enqueue and of the drain (bounded memory shows as flat)
  db_mb_after_enqueue / db_mb_after_drain   queue.sqlite + its -wal, in MB
The row counts come from the queue file itself (state_counts, read-only: SQLite readers never block
the server's writer in WAL mode). Only loopback URLs are accepted; every HTTP call has a timeout.
"""
import argparse
import json
import os
import sqlite3
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def vm(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def cpu_s(pid):
    """user + sys CPU seconds of the process so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def db_mb(state_dir):
    total = 0
    for name in ("queue.sqlite", "queue.sqlite-wal"):
        try:
            total += os.path.getsize(os.path.join(state_dir, name))
        except OSError:
            pass
    return total / 1e6


def counts(state_dir):
    uri = "file:" + urllib.parse.quote(os.path.join(state_dir, "queue.sqlite")) + "?mode=ro"
    con = sqlite3.connect(uri, uri=True, timeout=30)
    try:
        return dict(con.execute("SELECT state, n FROM state_counts").fetchall())
    finally:
        con.close()


def post(url, body, api_key, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if api_key:
        req.add_header("Authorization", "Bearer " + api_key)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--total", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--fixed-max-tokens", action="store_true",
                    help="every prompt asks for --max-tokens (the overhead comparison), not 1..--max-tokens")
    ap.add_argument("--count-tokens", action="store_true",
                    help="sum usage.completion_tokens over the results table at the end (for tok/s)")
    ap.add_argument("--drain-seconds", type=float, default=600)
    ap.add_argument("--model", default=None)
    ap.add_argument("--api-key", default=None)
    a = ap.parse_args()
    host = urllib.parse.urlparse(a.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"queue_load: only loopback URLs are accepted (got {a.url})")
    if a.total < 1 or a.chunk < 1 or a.max_tokens < 1:
        sys.exit("queue_load: --total, --chunk and --max-tokens must be >= 1")
    gen = a.url.rstrip("/") + "/v1/generate"

    out = {"total": a.total, "chunk": a.chunk,
           "max_tokens": a.max_tokens if a.fixed_max_tokens else f"1..{a.max_tokens}", "rss_mb_samples": []}
    c0 = counts(a.state_dir)
    cpu0 = cpu_s(a.pid)
    finished0 = c0.get("done", 0) + c0.get("failed", 0)
    t0 = time.monotonic()
    sent, retries_429, chunk_i = 0, 0, 0
    next_sample = a.total // 10
    while sent < a.total:
        n = min(a.chunk, a.total - sent)
        body = {"prompts": [f"n={i}:" for i in range(sent, sent + n)], "max_tokens": a.max_tokens if a.fixed_max_tokens else 1 + chunk_i % a.max_tokens,
                "temperature": 0}
        if a.model:
            body["model"] = a.model
        try:
            r = post(gen, body, a.api_key)
        except urllib.error.HTTPError as e:
            if e.code == 429:  # the queue is full: the bounded case working; wait for the drain
                retries_429 += 1
                time.sleep(0.5)
                continue
            sys.exit(f"queue_load: /v1/generate answered {e.code}: {e.read()[:300]!r}")
        ids = r.get("request_ids") or r.get("ids") or []
        if len(ids) != n:
            sys.exit(f"queue_load: /v1/generate returned {len(ids)} ids for {n} prompts: {str(r)[:300]}")
        sent += n
        chunk_i += 1
        if sent >= next_sample:
            out["rss_mb_samples"].append({"phase": "enqueue", "rows": sent, "rss_mb": vm(a.pid, "VmRSS"),
                                          "db_mb": round(db_mb(a.state_dir), 1)})
            next_sample += a.total // 10
    t_enq = time.monotonic() - t0
    c1 = counts(a.state_dir)
    out["enqueue_s"] = round(t_enq, 2)
    out["enqueue_req_s"] = round(a.total / t_enq, 1)
    out["retries_429"] = retries_429
    out["finished_during_enqueue"] = c1.get("done", 0) + c1.get("failed", 0) - finished0
    out["db_mb_after_enqueue"] = round(db_mb(a.state_dir), 1)

    t1 = time.monotonic()
    f1 = c1.get("done", 0) + c1.get("failed", 0)
    last_sample = t1
    while True:
        c = counts(a.state_dir)
        left = c.get("queued", 0) + c.get("running", 0)
        now = time.monotonic()
        if now - last_sample > max(5.0, a.drain_seconds / 10):
            out["rss_mb_samples"].append({"phase": "drain", "left": left, "rss_mb": vm(a.pid, "VmRSS")})
            last_sample = now
        if left == 0 or now - t1 > a.drain_seconds:
            break
        time.sleep(1.0)
    t_drain = time.monotonic() - t1
    finished = c.get("done", 0) + c.get("failed", 0) - f1
    out["drain_s"] = round(t_drain, 2)
    out["drained"] = finished
    out["drain_req_s"] = round(finished / t_drain, 1) if t_drain > 0 else None
    out["left_after_drain"] = left
    out["failed"] = c.get("failed", 0) - c0.get("failed", 0)
    if left > 0 and finished > 0:
        out["drain_extrapolated_s"] = round(left / (finished / t_drain), 1)
        out["note"] = (f"the drain was stopped after {t_drain:.0f} s with {left} rows left; "
                       "drain_extrapolated_s = rows left / drain_req_s")
    out["db_mb_after_drain"] = round(db_mb(a.state_dir), 1)
    out["end_to_end_s"] = round(t_enq + t_drain, 2)
    if a.count_tokens:
        uri = "file:" + urllib.parse.quote(os.path.join(a.state_dir, "queue.sqlite")) + "?mode=ro"
        con = sqlite3.connect(uri, uri=True, timeout=30)
        tok = con.execute("SELECT sum(json_extract(body, '$.usage.completion_tokens')) FROM results "
                          "WHERE status_code = 200").fetchone()[0] or 0
        con.close()
        out["completion_tokens"] = tok
        out["tokens_per_s"] = round(tok / (t_enq + t_drain), 1)
    cpu1 = cpu_s(a.pid)
    if cpu0 is not None and cpu1 is not None:
        out["server_cpu_s"] = round(cpu1 - cpu0, 2)  # during the enqueue and drain (not the model load)
    out["peak_rss_mb"] = vm(a.pid, "VmHWM")
    out["rss_mb_end"] = vm(a.pid, "VmRSS")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
