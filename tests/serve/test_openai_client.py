#!/usr/bin/env python3
"""`corelm serve` driven by the official openai client (pinned in tests/requirements.txt).

  test_openai_client.py --corelm BIN --model DIR [--timeout S] [--only NAME,NAME]

Starts `BIN serve --model DIR --host 127.0.0.1 --port 0 --api-key K`, waits for /health, runs every
check below against it through openai.OpenAI (and raw httpx where the wire format itself is the
point), kills the server, prints one line per check and a summary; exits 0 only when all passed.
DIR is a model folder whose tokenizer_config.json carries a chat_template (the C++ driver
tests/serve/test_openai_client.cc writes one): the chat check renders it with Python's jinja2 (as
HF's apply_chat_template does) and compares the prompt token count the server reports with
`corelm tokenize --parse-special` and the server's /tokenize of that rendering.
Checks: models_list completion_plain completion_streaming chat_template chat_streaming
completion_logprobs chat_logprobs n_two stop_strings seed_determinism json_schema json_object errors.
Every request has a timeout and no retries; the whole run is bounded by --timeout.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import jinja2
import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from live_server import LiveServer, run_checks  # noqa: E402

API_KEY = "test-key-0123456789"
REQ_TIMEOUT = 20.0


class RunTimeout(BaseException):
    """The whole-run alarm: a BaseException so no per-check handler swallows it."""


class Ctx:
    def __init__(self, server, model_dir, binary):
        self.url = server.url
        self.model_dir, self.binary = model_dir, binary
        self.client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=REQ_TIMEOUT,
                                    max_retries=0)
        self.http = httpx.Client(base_url=server.url, timeout=REQ_TIMEOUT, trust_env=False,
                                 headers={"Authorization": f"Bearer {API_KEY}"})
        models = self.client.models.list().data
        assert len(models) >= 1, "GET /v1/models lists no model"
        self.model = models[0].id
        with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
            self.tokenizer_config = json.load(f)

    def close(self):
        self.http.close()
        self.client.close()

    def tokenize(self, text, parse_special=False):
        # parse_special: the text's special-token markers (<|im_start|>) become their ids, as the
        # server does for a rendered chat prompt.
        r = self.http.post("/tokenize", json={"content": text, "parse_special": parse_special})
        assert r.status_code == 200, f"/tokenize: HTTP {r.status_code} {r.text[:200]}"
        body = r.json()
        toks = body.get("tokens", body.get("ids"))
        assert isinstance(toks, list), f"/tokenize answered no token list: {body}"
        return [t["id"] if isinstance(t, dict) else t for t in toks]

    def sse(self, path, body):
        """Raw SSE: returns the list of data payloads (strings), in order."""
        out = []
        with self.http.stream("POST", path, json=body) as r:
            assert r.status_code == 200, f"{path} stream: HTTP {r.status_code} {r.read()[:200]}"
            ctype = r.headers.get("content-type", "")
            assert ctype.startswith("text/event-stream"), f"{path} stream: content-type {ctype!r}"
            for line in r.iter_lines():
                if line.startswith("data:"):
                    out.append(line[5:].strip())
        return out


PROMPT = "the cat sat on the mat and"
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def usage_ok(u, prompt_tokens=None):
    assert u is not None, "no usage"
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage total != prompt + completion: {u}"
    if prompt_tokens is not None:
        assert u.prompt_tokens == prompt_tokens, f"usage.prompt_tokens {u.prompt_tokens} != /tokenize {prompt_tokens}"


@check
def models_list(c):
    ms = c.client.models.list().data
    assert all(m.object == "model" and isinstance(m.id, str) and m.id for m in ms), ms
    r = httpx.get(c.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=REQ_TIMEOUT,
                  trust_env=False)
    assert r.json().get("object") == "list", r.text[:200]


@check
def completion_plain(c):
    r = c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=16, temperature=0)
    assert r.object == "text_completion", r.object
    assert r.id and len(r.choices) == 1, r
    ch = r.choices[0]
    assert isinstance(ch.text, str) and ch.index == 0
    assert ch.finish_reason in ("length", "stop"), ch.finish_reason
    usage_ok(r.usage, len(c.tokenize(PROMPT)))
    assert 1 <= r.usage.completion_tokens <= 16, r.usage
    if ch.finish_reason == "length":
        assert r.usage.completion_tokens == 16, r.usage
    # A list of prompts: one choice per prompt, indexed in order.
    r2 = c.client.completions.create(model=c.model, prompt=[PROMPT, "a dog ran"], max_tokens=4, temperature=0)
    assert [x.index for x in r2.choices] == [0, 1], r2.choices
    assert r2.choices[0].text == c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=4,
                                                              temperature=0).choices[0].text


@check
def completion_streaming(c):
    kw = dict(model=c.model, prompt=PROMPT, max_tokens=20, temperature=0, seed=5)
    full = c.client.completions.create(**kw)
    chunks = list(c.client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text_chunks = [ch for ch in chunks if ch.choices]
    assert "".join(ch.choices[0].text for ch in text_chunks) == full.choices[0].text, \
        (full.choices[0].text, [ch.choices[0].text for ch in text_chunks])
    ids = {ch.id for ch in chunks}
    assert len(ids) == 1, f"several ids across chunks: {ids}"
    finals = [ch.choices[0].finish_reason for ch in text_chunks if ch.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason], finals
    usage = [ch.usage for ch in chunks if ch.usage]
    assert len(usage) == 1 and chunks[-1].usage, "include_usage: one final usage chunk expected"
    assert usage[0].completion_tokens == full.usage.completion_tokens, (usage[0], full.usage)
    assert usage[0].prompt_tokens == full.usage.prompt_tokens
    nonempty = [ch for ch in text_chunks if ch.choices[0].text]
    assert len(nonempty) <= usage[0].completion_tokens, (len(nonempty), usage[0])
    # Exact: with logprobs every streamed token is listed once (a chunk may hold back the bytes
    # of an incomplete UTF-8 character, never a token).
    lp_chunks = [ch for ch in c.client.completions.create(stream=True, stream_options={"include_usage": True},
                                                          logprobs=1, **kw)]
    streamed_tokens = sum(len(ch.choices[0].logprobs.tokens) for ch in lp_chunks
                          if ch.choices and ch.choices[0].logprobs)
    assert streamed_tokens == full.usage.completion_tokens, (streamed_tokens, full.usage)
    assert lp_chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    # The wire: every data line is JSON except the final [DONE].
    raw = c.sse("/v1/completions", dict(kw, stream=True))
    assert raw and raw[-1] == "[DONE]", raw[-3:]
    evs = [json.loads(d) for d in raw[:-1]]
    assert all(e["object"] == "text_completion" for e in evs), evs[:2]
    assert len({e["id"] for e in evs}) == 1
    assert "".join(e["choices"][0]["text"] for e in evs if e.get("choices")) == full.choices[0].text


def render_chat(c, messages):
    """The template rendered as Hugging Face's apply_chat_template does (transformers'
    chat_template_utils: a sandboxed environment with trim_blocks, lstrip_blocks and loop controls,
    tojson without ASCII escaping, raise_exception and strftime_now)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    cfg = c.tokenizer_config
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    tmpl = env.from_string(cfg["chat_template"])
    return tmpl.render(messages=messages, add_generation_prompt=True, bos_token=cfg.get("bos_token") or "",
                       eos_token=cfg.get("eos_token") or "")


MESSAGES = [{"role": "system", "content": "You are a cat."}, {"role": "user", "content": "the dog ran far"},
            {"role": "assistant", "content": "away home"}, {"role": "user", "content": "the mat"}]


@check
def chat_template(c):
    r = c.client.chat.completions.create(model=c.model, messages=MESSAGES, max_tokens=12, temperature=0)
    assert r.object == "chat.completion", r.object
    ch = r.choices[0]
    assert ch.message.role == "assistant" and isinstance(ch.message.content, str), ch.message
    assert ch.finish_reason in ("stop", "length")
    rendered = render_chat(c, MESSAGES)
    # The count oracle: `corelm tokenize --parse-special` of jinja2's rendering (the markers of the
    # template are special tokens); the server's /tokenize with parse_special must agree.
    cli = subprocess.run([c.binary, "tokenize", "--tokenizer", c.model_dir, "--parse-special", "--threads", "1",
                          "--no-progress"], input=rendered.encode(), capture_output=True, timeout=REQ_TIMEOUT)
    assert cli.returncode == 0, cli.stderr.decode()[:300]
    ids = json.loads(cli.stdout)
    usage_ok(r.usage, len(ids))
    served = c.tokenize(rendered, parse_special=True)
    assert served == ids, (f"/tokenize with parse_special=true: {len(served)} ids, `corelm tokenize "
                           f"--parse-special`: {len(ids)}")
    assert len(c.tokenize(rendered)) >= len(ids)  # plain text: the markers are spelled out
    # The same answer as a completion of those ids: the template is the only difference.
    plain = c.client.completions.create(model=c.model, prompt=ids, max_tokens=12, temperature=0)
    assert plain.usage.prompt_tokens == r.usage.prompt_tokens, (plain.usage, r.usage)
    assert plain.choices[0].text == ch.message.content, (plain.choices[0].text, ch.message.content)


@check
def chat_streaming(c):
    kw = dict(model=c.model, messages=MESSAGES[:2], max_tokens=16, temperature=0)
    full = c.client.chat.completions.create(**kw)
    chunks = list(c.client.chat.completions.create(stream=True, **kw))
    assert len({ch.id for ch in chunks}) == 1
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    with_choice = [ch for ch in chunks if ch.choices]
    assert with_choice[0].choices[0].delta.role == "assistant", with_choice[0]
    text = "".join(ch.choices[0].delta.content or "" for ch in with_choice)
    assert text == full.choices[0].message.content, (text, full.choices[0].message.content)
    assert with_choice[-1].choices[0].finish_reason == full.choices[0].finish_reason
    raw = c.sse("/v1/chat/completions", dict(kw, stream=True))
    assert raw[-1] == "[DONE]", raw[-3:]


@check
def completion_logprobs(c):
    r = c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None, "logprobs=2 gave no logprobs"
    n = r.usage.completion_tokens
    assert len(lp.tokens) == n and len(lp.token_logprobs) == n and len(lp.top_logprobs) == n, (n, lp)
    assert "".join(lp.tokens) == r.choices[0].text, (lp.tokens, r.choices[0].text)
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0.0, l
        assert 1 <= len(top) <= 2, top  # keyed by text: two ids with one text collapse
        assert all(v <= 0.0 for v in top.values()), top
        assert l >= max(top.values()) - 1e-4, (tok, l, top)  # greedy: the chosen one is the top one
        if tok in top:
            assert abs(top[tok] - l) < 1e-4, (tok, l, top)
    if lp.text_offset is not None:
        assert len(lp.text_offset) == n and lp.text_offset == sorted(lp.text_offset)


@check
def chat_logprobs(c):
    r = c.client.chat.completions.create(model=c.model, messages=MESSAGES[:2], max_tokens=8, temperature=0,
                                         logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == 2, t.top_logprobs
        assert all(a.logprob <= 0.0 for a in t.top_logprobs)
        assert t.logprob >= max(a.logprob for a in t.top_logprobs) - 1e-4, t
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob, t.top_logprobs
        if t.bytes is not None:
            assert bytes(t.bytes).decode("utf-8", "replace") == t.token or len(t.bytes) > 0


@check
def n_two(c):
    r = c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=8, temperature=0, n=2)
    assert sorted(ch.index for ch in r.choices) == [0, 1], r.choices
    # Greedy: both choices are the single greedy continuation (they share the prompt's KV).
    assert r.choices[0].text == r.choices[1].text
    solo = c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.choices[0].text == solo.choices[0].text
    assert r.usage.prompt_tokens == solo.usage.prompt_tokens
    assert r.usage.completion_tokens == 2 * solo.usage.completion_tokens, (r.usage, solo.usage)
    # Sampled: two choices of one request draw from different streams at least once in a few tries.
    differ = False
    for seed in range(4):
        s = c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=seed, n=2)
        assert len(s.choices) == 2
        differ |= s.choices[0].text != s.choices[1].text
    assert differ, "n=2 at temperature 1 gave two equal texts for 4 seeds"
    rc = c.client.chat.completions.create(model=c.model, messages=MESSAGES[:2], max_tokens=4, temperature=0, n=2)
    assert sorted(ch.index for ch in rc.choices) == [0, 1]


@check
def stop_strings(c):
    base = c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    assert len(base) >= 6, f"greedy text too short to pick a stop from: {base!r}"
    k = len(base) // 2
    stop = base[k:k + 3]
    want = base[:base.find(stop)]
    r = c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop)
    assert r.choices[0].text == want, (r.choices[0].text, want, stop)
    assert stop not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
    r2 = c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=24, temperature=0,
                                     stop=["\u00e9\u00e9never", stop])
    assert r2.choices[0].text == want
    chunks = list(c.client.completions.create(model=c.model, prompt=PROMPT, max_tokens=24, temperature=0,
                                              stop=stop, stream=True))
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert streamed == want, (streamed, want)
    rc = c.client.chat.completions.create(model=c.model, messages=MESSAGES[:2], max_tokens=24, temperature=0)
    ctext = rc.choices[0].message.content
    if len(ctext) >= 4:
        cstop = ctext[len(ctext) // 2:len(ctext) // 2 + 2]
        rcs = c.client.chat.completions.create(model=c.model, messages=MESSAGES[:2], max_tokens=24, temperature=0,
                                               stop=[cstop])
        assert cstop not in rcs.choices[0].message.content
        assert rcs.choices[0].message.content == ctext[:ctext.find(cstop)]


@check
def seed_determinism(c):
    kw = dict(model=c.model, prompt=PROMPT, max_tokens=16, temperature=1.0)
    a = c.client.completions.create(seed=123, **kw).choices[0].text
    b = c.client.completions.create(seed=123, **kw).choices[0].text
    assert a == b, (a, b)
    others = [c.client.completions.create(seed=s, **kw).choices[0].text for s in (1, 2, 3, 4)]
    assert any(o != a for o in others), "four other seeds all gave the seed-123 text"
    sa = "".join(ch.choices[0].text for ch in c.client.completions.create(seed=123, stream=True, **kw) if ch.choices)
    assert sa == a, (sa, a)


def constrained(c, response_format, validate):
    finished = 0
    for seed in range(4):
        r = c.client.chat.completions.create(model=c.model, messages=MESSAGES[:2], max_tokens=160, temperature=1.0,
                                             seed=seed, response_format=response_format)
        ch = r.choices[0]
        if ch.finish_reason != "stop":
            continue
        finished += 1
        obj = json.loads(ch.message.content)
        validate(obj)
    assert finished >= 1, "no constrained answer finished within 160 tokens in 4 seeds"


@check
def json_schema(c):
    schema = {"type": "object",
              "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]},
                             "ok": {"type": "boolean"},
                             "n": {"type": "integer"}},
              "required": ["color", "ok", "n"]}

    def validate(o):
        assert isinstance(o, dict), o
        assert o["color"] in ("red", "green", "blue"), o
        assert isinstance(o["ok"], bool), o
        assert isinstance(o["n"], int) and not isinstance(o["n"], bool), o

    constrained(c, {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}, validate)


@check
def json_object(c):
    def validate(o):
        assert isinstance(o, dict), f"json_object answer is not an object: {o!r}"

    constrained(c, {"type": "json_object"}, validate)


def expect_error(exc_type, status, fn):
    try:
        fn()
    except exc_type as e:
        assert e.status_code == status, (e.status_code, status)
        body = e.body if isinstance(e.body, dict) else {}
        # openai puts the "error" object's contents in e.body.
        err = body.get("error", body)
        assert isinstance(err.get("message"), str) and err["message"], e.body
        assert "type" in err, e.body
        return err
    except openai.APIStatusError as e:
        raise AssertionError(f"expected {exc_type.__name__} ({status}), got {type(e).__name__} "
                             f"{e.status_code}: {e.body}")
    raise AssertionError(f"expected {exc_type.__name__} ({status}), the request succeeded")


@check
def errors(c):
    m = c.model
    expect_error(openai.BadRequestError, 400,
                 lambda: c.client.completions.create(model=m, prompt=PROMPT, max_tokens="ten"))
    expect_error(openai.BadRequestError, 400,
                 lambda: c.client.completions.create(model=m, prompt=PROMPT, temperature="hot", max_tokens=2))
    expect_error(openai.BadRequestError, 400,
                 lambda: c.client.chat.completions.create(model=m, messages="hello", max_tokens=2))
    expect_error(openai.BadRequestError, 400,
                 lambda: c.client.completions.create(model=m, prompt=PROMPT, max_tokens=2, n="two"))
    expect_error(openai.NotFoundError, 404,
                 lambda: c.client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2))
    bad = openai.OpenAI(base_url=c.url + "/v1", api_key="wrong-key", timeout=REQ_TIMEOUT, max_retries=0)
    expect_error(openai.AuthenticationError, 401,
                 lambda: bad.completions.create(model=m, prompt=PROMPT, max_tokens=2))
    bad.close()
    # Raw: the error object has OpenAI's four fields; /health stays public.
    r = httpx.post(c.url + "/v1/completions", json={"model": m, "prompt": 5, "max_tokens": 2}, timeout=REQ_TIMEOUT,
                   headers={"Authorization": f"Bearer {API_KEY}"}, trust_env=False)
    assert r.status_code == 400, r.status_code
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert httpx.get(c.url + "/health", timeout=REQ_TIMEOUT, trust_env=False).status_code == 200
    assert httpx.get(c.url + "/v1/models", timeout=REQ_TIMEOUT, trust_env=False).status_code == 401
    # Streaming requests are validated before the stream starts.
    expect_error(openai.BadRequestError, 400,
                 lambda: c.client.completions.create(model=m, prompt=PROMPT, max_tokens="x", stream=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corelm", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--timeout", type=float, default=90.0, help="the whole run")
    ap.add_argument("--only", default="", help="comma-separated check names")
    ap.add_argument("--server-arg", action="append", default=[])
    args = ap.parse_args()
    # A hang anywhere ends the run (the server is killed below).
    def on_alarm(*_):
        raise RunTimeout(f"the run went past --timeout {args.timeout} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.timeout))
    t0 = time.time()
    server = c = None
    failed, passed = [], []
    only = {x for x in args.only.split(",") if x}
    selected = [fn for fn in CHECKS if not only or fn.__name__ in only]
    try:
        server = LiveServer(args.corelm, ["--model", args.model, "--port", "0", "--slots", "4", "--threads", "1"] + args.server_arg,
                            api_key=API_KEY, keep_lines=30)
        print(f"server ready at {server.url} after {time.time() - t0:.2f} s", flush=True)
        c = Ctx(server, args.model, args.corelm)
        p, f = run_checks(selected, c, __file__)
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
            t_stop = time.time()
            server.stop()
            print(f"server stopped in {time.time() - t_stop:.2f} s", flush=True)
    print(f"SUMMARY {'OK' if not failed else 'FAILED'}: {len(passed)}/{len(selected)} checks passed in "
          f"{time.time() - t0:.1f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    if failed and server:
        print("server log tail:\n" + server.log())
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
