#!/usr/bin/env python3
"""Bounded loopback load generator for an LLM HTTP server (`corelm serve` or llama.cpp's llama-server).

C concurrent streaming clients share a fixed queue of R requests (a seeded, varied prompt set, each
request max_tokens M at temperature 0, ignore_eos asked for), then it stops by itself and prints one
JSON object: requests ok/errors, generated tokens, wall time, aggregate generated tok/s, TTFT and
inter-token latency p50/p99, and the server's peak RSS (VmHWM of --pid).

  bench/serve_load.py --url http://127.0.0.1:8080 --api openai [--pid PID] [--clients 64]
                      [--requests 256] [--max-tokens 64] [--seed 1] [--model NAME] [--api-key K]

--api openai: POST /v1/completions with stream=true and stream_options.include_usage (corelm serve;
  the token count is the final usage chunk's completion_tokens).
--api llama: POST /completion with stream=true, n_predict and ignore_eos (llama-server of the
  llama.cpp that llama-cpp-python 0.3.2 vendors: its /v1/completions answers in the native shape,
  so the native endpoint is used and the count is the last event's tokens_predicted).
Figures: ttft = request sent -> first chunk with text (includes the connect, so a server whose
listen backlog overflows pays the 1 s SYN retransmit here); itl = gaps between consecutive text
chunks, all requests pooled (a server that flushes several tokens at once shows ~0 gaps and long
ones); tpot = per request, (last chunk - first chunk) / (tokens - 1). generated_tok_s = tokens of
the successful requests / wall time of the measured run (warm-up requests excluded).
ignore_eos is sent to both (corelm serve ignores fields it does not know): requests_at_max_tokens
says whether every request generated to length, so both servers did the same work.
Only loopback URLs are accepted. Every request has a connect/read timeout and an overall deadline.
"""
import argparse
import asyncio
import json
import random
import sys
import time
import urllib.parse

import httpx

WORDS = ("little girl boy dog cat bird tree park ball house garden river sun moon star friend mom dad "
         "happy sad big small red blue green toy cake book car boat box hat shoe flower rain snow day "
         "night play run jump sing look find help share smile laugh went saw had wanted liked").split()
OPENERS = ["Once upon a time,", "One day,", "There was a", "Lily and Tom", "The sun was shining and",
           "In a small town,", "Tim had a", "Every morning,", "Mia liked to", "A long time ago,"]


def make_prompts(count, seed):
    """Varied prompts, 4..40 words after an opener, reproducible from the seed."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        n = rng.randint(4, 40)
        prompts.append(rng.choice(OPENERS) + " " + " ".join(rng.choice(WORDS) for _ in range(n)))
    return prompts


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    # nearest-rank: the smallest value with at least q% of the samples at or below it
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def read_status_kb(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


async def poll_rss(pid, state, stop):
    # VmHWM is the kernel's own peak; VmRSS is polled too in case VmHWM is unavailable.
    while not stop.is_set():
        rss = read_status_kb(pid, "VmRSS")
        if rss is not None:
            state["peak_rss_kb_polled"] = max(state.get("peak_rss_kb_polled", 0), rss)
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except asyncio.TimeoutError:
            pass


def request_body(args, prompt):
    if args.api == "llama":
        return "/completion", {"prompt": prompt, "n_predict": args.max_tokens, "temperature": 0.0,
                               "ignore_eos": True, "stream": True, "cache_prompt": True}
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    return "/v1/completions", body


async def one_request(client, args, prompt, progress=None):
    """Returns (ok, error, ttft_s, [inter-chunk gaps], tokens, chunks). `progress` (a dict) is kept
    up to date with the stage and the chunk count, so a transport error can say where it struck."""
    progress = {} if progress is None else progress
    progress.update(stage="before the response headers", chunks=0)
    path, body = request_body(args, prompt)
    t0 = time.perf_counter()
    last = None
    ttft = None
    gaps = []
    tokens = None
    chunks = 0
    done = False
    async with client.stream("POST", path, json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode("utf-8", "replace")[:200]
            return False, f"HTTP {resp.status_code}: {text}", None, [], 0, 0
        progress["stage"] = "in the stream"
        async for line in resp.aiter_lines():
            if line.startswith("error:"):
                return False, line[:200], None, [], 0, 0
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                return False, json.dumps(ev["error"])[:200], None, [], 0, 0
            if args.api == "llama":
                has_text = bool(ev.get("content"))
                if ev.get("stop"):
                    tokens = ev.get("tokens_predicted")
                    done = True
            else:
                has_text = any(c.get("text") for c in ev.get("choices") or [])
                if ev.get("usage"):
                    tokens = ev["usage"].get("completion_tokens")
            if has_text:
                now = time.perf_counter()
                chunks += 1
                progress["chunks"] = chunks
                if ttft is None:
                    ttft = now - t0
                else:
                    gaps.append(now - last)
                last = now
            if done:
                break
    if not done:
        return False, "stream ended without its final event", None, [], 0, 0
    if tokens is None:
        return False, "no token count in the stream (usage / tokens_predicted)", None, [], 0, 0
    return True, None, ttft, gaps, int(tokens), chunks


async def run(args):
    prompts = make_prompts(args.requests, args.seed)
    queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = httpx.Timeout(connect=args.connect_timeout, read=args.read_timeout, write=10.0, pool=None)
    # One connection per request: cpp-httplib servers close a kept-alive connection after a few
    # requests, and a request racing that close fails with a ReadError that says nothing about
    # the server's serving. A loopback connect costs microseconds.
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=0)
    results = []
    state = {}
    stop = asyncio.Event()
    poller = asyncio.create_task(poll_rss(args.pid, state, stop)) if args.pid else None

    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=timeout, limits=limits,
                                 trust_env=False) as client:
        async def worker():
            while True:
                try:
                    prompt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                progress = {}
                try:
                    results.append(await asyncio.wait_for(one_request(client, args, prompt, progress),
                                                          args.request_timeout))
                except asyncio.TimeoutError:
                    results.append((False, f"timed out after {args.request_timeout} s", None, [], 0, 0))
                except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
                    where = progress.get("stage", "?")
                    if where == "in the stream":
                        where += f" after {progress.get('chunks', 0)} chunks"
                    results.append((False, f"{type(e).__name__} {where}: {e!r}"[:200], None, [], 0, 0))

        if args.api == "openai" and not args.model:
            r = await client.get("/v1/models")
            r.raise_for_status()
            args.model = r.json()["data"][0]["id"]
        # Warm-up requests (not counted): first-request costs (allocation, page faults) stay out.
        for p in make_prompts(args.warmup, args.seed + 1000):
            try:
                await asyncio.wait_for(one_request(client, args, p), args.request_timeout)
            except (asyncio.TimeoutError, httpx.HTTPError, json.JSONDecodeError, OSError):
                pass
        rss_before = read_status_kb(args.pid, "VmRSS") if args.pid else None
        t0 = time.perf_counter()
        workers = [asyncio.create_task(worker()) for _ in range(args.clients)]
        try:
            await asyncio.wait_for(asyncio.gather(*workers), args.deadline)
        except asyncio.TimeoutError:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        wall = time.perf_counter() - t0

    stop.set()
    if poller:
        await poller
    ok = [r for r in results if r[0]]
    errors = [r[1] for r in results if not r[0]]
    unfinished = args.requests - len(results)
    ttfts = [r[2] for r in ok if r[2] is not None]
    gaps = [g for r in ok for g in r[3]]
    tokens = sum(r[4] for r in ok)
    # Per-request decode time per token, for servers that put several tokens in one chunk.
    # sum(gaps) is last-chunk minus first-chunk time, spread over the tokens after the first.
    tpot = [sum(r[3]) / (r[4] - 1) for r in ok if r[3] and r[4] > 1]
    ms = lambda v: None if v is None else round(v * 1000.0, 2)
    out = {
        "api": args.api, "url": args.url, "model": args.model, "clients": args.clients, "requests": args.requests,
        "max_tokens": args.max_tokens, "seed": args.seed, "warmup": args.warmup,
        "requests_ok": len(ok), "requests_error": len(errors) + unfinished,
        "errors_sample": sorted(set(errors))[:5] + ([f"{unfinished} not finished by the deadline"]
                                                    if unfinished else []),
        "generated_tokens": tokens, "streamed_chunks": sum(r[5] for r in ok),
        "requests_at_max_tokens": sum(1 for r in ok if r[4] == args.max_tokens),
        "wall_s": round(wall, 3),
        "generated_tok_s": round(tokens / wall, 1) if wall > 0 else None,
        "ttft_ms_p50": ms(percentile(ttfts, 50)), "ttft_ms_p99": ms(percentile(ttfts, 99)),
        "itl_ms_p50": ms(percentile(gaps, 50)), "itl_ms_p99": ms(percentile(gaps, 99)),
        "tpot_ms_p50": ms(percentile(tpot, 50)), "tpot_ms_p99": ms(percentile(tpot, 99)),
    }
    if args.pid:
        out["server_pid"] = args.pid
        out["rss_mb_after_warmup"] = None if rss_before is None else round(rss_before / 1024, 1)
        hwm = read_status_kb(args.pid, "VmHWM")
        out["peak_rss_mb"] = round(max(hwm or 0, state.get("peak_rss_kb_polled", 0)) / 1024, 1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="server base URL (loopback only)")
    ap.add_argument("--api", choices=["openai", "llama"], default="openai")
    ap.add_argument("--model", default=None, help="the request's model field (openai api; default: the first "
                    "id GET /v1/models lists)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--pid", type=int, default=None, help="server pid for the peak-RSS figure")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=4, help="sequential requests before the measured run")
    ap.add_argument("--connect-timeout", type=float, default=10.0)
    ap.add_argument("--read-timeout", type=float, default=120.0, help="longest silence within a stream")
    ap.add_argument("--request-timeout", type=float, default=300.0, help="one request, end to end")
    ap.add_argument("--deadline", type=float, default=900.0, help="the whole run")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    host = urllib.parse.urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"serve_load: --url must be loopback (got host {host!r})")
    if min(args.clients, args.requests, args.max_tokens) < 1:
        sys.exit("serve_load: --clients, --requests and --max-tokens must be >= 1")
    out = asyncio.run(run(args))
    text = json.dumps(out)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if out["requests_error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
