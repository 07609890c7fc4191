"""corelm.Client: the HTTP SDK for `corelm serve` (stdlib only: urllib.request and json).

    import corelm
    c = corelm.Client("http://127.0.0.1:8080", api_key=None)
    texts = c.generate(["Once upon a time", "The cat"], max_tokens=16, temperature=0)

generate() goes through the queue-native /v1/generate endpoints (submit, then long-poll
get_results) with a bounded window of prompts in flight, so a loop over a million prompts never
floods the server; above `batch_threshold` prompts it uses the OpenAI Files + Batches API
instead. 429 and 503 answers are retried after their Retry-After (bounded); every other error is
a CorelmError carrying the server's status, code and message. See docs/SERVING.md, "Python SDK".
"""

import email.utils
import http.client
import io
import json
import os
import re
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

from .errors import CorelmConnectionError, CorelmError, CorelmNotImplemented

__all__ = ["Client", "BATCH_TERMINAL_STATES"]

BATCH_TERMINAL_STATES = ("completed", "failed", "cancelled", "expired")
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
_CUSTOM_ID_PREFIX = "prompt-"


def _as_prompts(prompts, name="prompts"):
    if isinstance(prompts, str):
        return [prompts]
    try:
        out = list(prompts)
    except TypeError:
        raise TypeError("%s must be a string or a list of strings, not %s" % (name, type(prompts).__name__))
    for i, p in enumerate(out):
        if not isinstance(p, str):
            raise TypeError("%s[%d] must be a string, not %s" % (name, i, type(p).__name__))
    return out


def _drop_none(d):
    return {k: v for k, v in d.items() if v is not None}


def _texts_of(response):
    """The generated text of a completion object: one string, or a list when n > 1."""
    choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
    texts = [c.get("text", c.get("message", {}).get("content")) for c in choices]
    return texts[0] if len(texts) == 1 else texts


def _retry_after(headers, attempt, max_wait):
    value = headers.get("Retry-After") if headers is not None else None
    wait = None
    if value:
        value = value.strip()
        try:
            wait = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                wait = when.timestamp() - time.time()
            except (TypeError, ValueError):
                wait = None
    if wait is None or wait < 0:
        wait = 0.5 * (2 ** attempt)
    return min(wait, max_wait)


class Client:
    """A client of one `corelm serve` (or any server with the same OpenAI-shaped endpoints).

    base_url: the server's root (``http://HOST:PORT``; a trailing ``/v1`` is accepted and dropped).
    api_key: sent as ``Authorization: Bearer KEY`` (the server's ``--api-key``).
    timeout: seconds for one HTTP exchange (a long-poll adds its own wait on top).
    max_retries: how many times a 429 / 503 answer is retried (waiting its Retry-After, at most
      `max_retry_wait` seconds each) before it is raised.
    batch_threshold: generate() with more prompts than this uses Files + Batches.
    max_in_flight: prompts generate() keeps submitted and unfinished at once.
    submit_chunk: prompts per POST /v1/generate; poll_chunk: request ids per get_results call.
    poll_timeout: the long-poll wait generate() asks of get_results (the server caps it at 60 s).
    batch_size: lines per batch when generate() splits a big list into several batches.
    reconnect_timeout: how long generate() and wait_batch() keep trying a server that is gone
      (restarting after a crash: the queue keeps their requests) before they raise. Polls retry
      any connection error; a submit only a refused connection (the request never arrived, so
      it cannot have been queued twice). Single calls never wait for a server.
    """

    def __init__(self, base_url="http://127.0.0.1:8080", api_key=None, timeout=60.0, max_retries=5,
                 max_retry_wait=30.0, batch_threshold=10000, max_in_flight=4096, submit_chunk=256,
                 poll_chunk=1024, poll_timeout=20.0, batch_size=50000, reconnect_timeout=120.0):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://, got %r" % (base_url,))
        base = base_url.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        self.base_url = base
        self.api_key = api_key
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.max_retry_wait = float(max_retry_wait)
        self.batch_threshold = int(batch_threshold)
        self.max_in_flight = max(1, int(max_in_flight))
        self.submit_chunk = max(1, int(submit_chunk))
        self.poll_chunk = max(1, int(poll_chunk))
        self.poll_timeout = float(poll_timeout)
        self.batch_size = max(1, int(batch_size))
        self.reconnect_timeout = float(reconnect_timeout)
        host = urllib.parse.urlsplit(base).hostname or ""
        # A loopback server is never reached through an http_proxy from the environment.
        handlers = [urllib.request.ProxyHandler({})] if host in _LOOPBACK else []
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self):
        return "corelm.Client(%r)" % self.base_url

    # -- transport ---------------------------------------------------------------------------
    def _request(self, method, path, body=None, data=None, content_type=None, timeout=None,
                 retry=True, stream_to=None, reconnect=None):
        """One exchange; JSON in and out unless `data` (raw bytes) or `stream_to` (a file) is given.

        reconnect: None, or "refused" / "any": which connection errors are retried (0.1 s apart,
        growing to 1 s) for up to reconnect_timeout seconds."""
        gone_since = None
        while True:
            try:
                return self._exchange(method, path, body, data, content_type, timeout, retry, stream_to)
            except CorelmConnectionError as e:
                if reconnect is None or (reconnect == "refused" and not e.refused):
                    raise
                now = time.monotonic()
                gone_since = gone_since if gone_since is not None else now
                if now - gone_since >= self.reconnect_timeout:
                    raise
                time.sleep(min(1.0, 0.1 * 2 ** min(4, int(now - gone_since))))

    def _exchange(self, method, path, body, data, content_type, timeout, retry, stream_to):
        url = self.base_url + path
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        attempt = 0
        while True:
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with self._opener.open(req, timeout=timeout or self.timeout) as resp:
                    if stream_to is not None:
                        while True:
                            chunk = resp.read(1 << 20)
                            if not chunk:
                                return None
                            stream_to.write(chunk)
                    raw = resp.read()
                    if resp.headers.get_content_type() != "application/json":
                        return raw
                    try:
                        return json.loads(raw.decode("utf-8")) if raw else None
                    except (ValueError, UnicodeDecodeError):
                        raise CorelmError(resp.status, "bad_response", "%s %s answered invalid JSON: %r"
                                          % (method, path, raw[:200])) from None
            except urllib.error.HTTPError as e:
                raw = e.read()
                if retry and e.code in (429, 503) and attempt < self.max_retries:
                    time.sleep(_retry_after(e.headers, attempt, self.max_retry_wait))
                    attempt += 1
                    continue
                err = self._http_error(e.code, raw, method, path)
                if e.code in (429, 503):
                    err.retry_after = _retry_after(e.headers, attempt, self.max_retry_wait)
                raise err from None
            except urllib.error.URLError as e:
                err = CorelmConnectionError(self.base_url, self._reason(e.reason))
                err.refused = isinstance(e.reason, ConnectionRefusedError)
                raise err from None
            except (socket.timeout, TimeoutError):
                raise CorelmConnectionError(self.base_url, "no answer to %s %s within %.0f s"
                                            % (method, path, timeout or self.timeout)) from None
            except (ConnectionError, http.client.HTTPException) as e:
                raise CorelmConnectionError(self.base_url, "%s %s: %s" % (method, path, e)) from None

    @staticmethod
    def _reason(reason):
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return "timed out"
        return str(reason)

    @staticmethod
    def _http_error(status, raw, method, path):
        body = None
        try:
            body = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            pass
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            e = CorelmError(status, err.get("code"), err.get("message") or "(no message)",
                            type=err.get("type"), param=err.get("param"))
        else:
            text = raw.decode("utf-8", "replace").strip()[:500]
            e = CorelmError(status, None, "%s %s: %s" % (method, path, text or "(empty body)"))
        e.body = body
        return e

    # -- server ------------------------------------------------------------------------------
    def health(self):
        """GET /health: ``{"status": "ok"}``, or the 503 body (``loading``, ``draining``) as is."""
        try:
            return self._request("GET", "/health", retry=False)
        except CorelmError as e:
            if e.status == 503 and isinstance(getattr(e, "body", None), dict) and "status" in e.body:
                return e.body
            raise

    def list_models(self):
        """GET /v1/models: a list of ``{"id", "object", "created", "owned_by", "status"}``."""
        return self._request("GET", "/v1/models").get("data", [])

    # -- queue-native generation -------------------------------------------------------------
    def submit(self, prompts, model=None, _retry=True, _reconnect=None, **sampling):
        """POST /v1/generate: queues the prompts, returns their request ids in prompt order.

        `sampling` is any completions parameter (max_tokens, temperature, top_p, seed, stop, ...).
        """
        prompts = _as_prompts(prompts)
        body = _drop_none(dict(sampling, model=model))
        body["prompts"] = prompts
        ids = self._request("POST", "/v1/generate", body, retry=_retry, reconnect=_reconnect).get("request_ids")
        if not isinstance(ids, list) or len(ids) != len(prompts):
            raise CorelmError(None, "bad_response", "POST /v1/generate answered %r request ids for %d prompts"
                              % (None if ids is None else len(ids), len(prompts)))
        return ids

    def get_results(self, request_ids, timeout=None, _reconnect=None):
        """POST /v1/generate/get_results: one ``{"request_id", "status", "response", "error"}``
        per id, in the order asked. `timeout` (seconds, the server caps it at 60): how long the
        server may wait for unfinished requests before answering (a long-poll)."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        body = {"request_ids": list(request_ids)}
        if timeout is not None:
            body["timeout"] = timeout
        wait = self.timeout + (float(timeout) if timeout else 0.0)
        return self._request("POST", "/v1/generate/get_results", body, timeout=wait,
                             reconnect=_reconnect).get("results", [])

    def generate(self, prompts, model=None, max_tokens=None, temperature=None, **sampling):
        """Texts for the prompts, in prompt order (a string each; a list of n strings when n > 1).

        At most `max_in_flight` prompts are queued at once; above `batch_threshold` prompts the
        work goes through Files + Batches instead. A prompt whose request failed raises
        CorelmError with `index` set to its position.
        """
        prompts = _as_prompts(prompts)
        params = _drop_none(dict(sampling, max_tokens=max_tokens, temperature=temperature))
        if len(prompts) > self.batch_threshold:
            return self._generate_batches(prompts, model, params)
        texts = [None] * len(prompts)
        inflight = {}  # request id -> prompt index, oldest first
        next_i = 0
        idle_wait = 0.05
        # A 429 (the server's --max-queued reached) shrinks the chunk and the window to what the
        # server holds: with work of ours in flight, polling it drains the queue; with none,
        # it is another client's work, waited out up to max_retries times.
        chunk, window, full_waits = self.submit_chunk, self.max_in_flight, 0
        while next_i < len(prompts) or inflight:
            while next_i < len(prompts) and len(inflight) < window:
                k = min(chunk, window - len(inflight), len(prompts) - next_i)
                try:
                    ids = self.submit(prompts[next_i:next_i + k], model, _retry=False, _reconnect="refused", **params)
                except CorelmError as e:
                    if e.status not in (429, 503):
                        raise
                    chunk = max(1, k // 2)
                    if inflight:
                        window = max(1, len(inflight))
                        break
                    if full_waits >= self.max_retries:
                        raise
                    full_waits += 1
                    time.sleep(e.retry_after if e.retry_after is not None else 0.5 * 2 ** full_waits)
                    continue
                full_waits = 0
                window = min(self.max_in_flight, window + k)
                for j, rid in enumerate(ids):
                    inflight[rid] = next_i + j
                next_i += k
            if not inflight:
                continue
            asked = list(inflight)[:self.poll_chunk]
            started = time.monotonic()
            progressed = False
            for r in self.get_results(asked, timeout=self.poll_timeout, _reconnect="any"):
                rid = r.get("request_id")
                if rid not in inflight:
                    continue
                idx = inflight[rid]
                status = r.get("status")
                if r.get("error") or status in ("failed", "cancelled"):
                    err = r.get("error") or {}
                    raise CorelmError(err.get("status_code"), err.get("code") or status,
                                      "prompt %d (request %s) %s: %s" % (idx, rid, status or "failed",
                                                                        err.get("message") or "no message"),
                                      index=idx)
                if status == "done" or (status is None and r.get("response") is not None):
                    texts[idx] = _texts_of(r["response"])
                    del inflight[rid]
                    progressed = True
            # A server that answers at once without waiting must not be polled in a busy loop.
            if not progressed and time.monotonic() - started < idle_wait:
                time.sleep(idle_wait)
                idle_wait = min(idle_wait * 2, 1.0)
            elif progressed:
                idle_wait = 0.05
        return texts

    # -- Files + Batches path of generate() ----------------------------------------------------
    def _generate_batches(self, prompts, model, params):
        batch_ids = []
        for start in range(0, len(prompts), self.batch_size):
            lines = []
            for i in range(start, min(start + self.batch_size, len(prompts))):
                body = dict(params, prompt=prompts[i])
                if model is not None:
                    body["model"] = model
                lines.append({"custom_id": "%s%d" % (_CUSTOM_ID_PREFIX, i), "method": "POST",
                              "url": "/v1/completions", "body": body})
            batch = self.create_batch(lines, endpoint="/v1/completions",
                                      metadata={"source": "corelm.Client.generate"})
            batch_ids.append(batch["id"])
        texts = [None] * len(prompts)
        for bid in batch_ids:
            batch = self.wait_batch(bid)
            if batch.get("status") != "completed":
                raise CorelmError(None, "batch_" + str(batch.get("status")),
                                  "batch %s ended %s: %s" % (bid, batch.get("status"),
                                                             json.dumps(batch.get("errors"))))
            if batch.get("error_file_id"):
                for line in self.file_content(batch["error_file_id"], _reconnect="any").splitlines():
                    if line.strip():
                        self._raise_line_error(json.loads(line), bid)
            if batch.get("output_file_id"):
                for line in self.file_content(batch["output_file_id"], _reconnect="any").splitlines():
                    if not line.strip():
                        continue
                    row = json.loads(line)
                    idx = self._index_of(row, bid)
                    resp = row.get("response") or {}
                    if row.get("error") or resp.get("status_code") != 200:
                        self._raise_line_error(row, bid)
                    texts[idx] = _texts_of(resp.get("body") or {})
        missing = [i for i, t in enumerate(texts) if t is None]
        if missing:
            raise CorelmError(None, "missing_output", "the batch output has no line for prompt %d (%d prompts missing)"
                              % (missing[0], len(missing)), index=missing[0])
        return texts

    @staticmethod
    def _index_of(row, batch_id):
        cid = str(row.get("custom_id"))
        if not cid.startswith(_CUSTOM_ID_PREFIX) or not cid[len(_CUSTOM_ID_PREFIX):].isdigit():
            raise CorelmError(None, "bad_response", "batch %s output holds custom_id %r that generate() did not send"
                              % (batch_id, cid))
        return int(cid[len(_CUSTOM_ID_PREFIX):])

    def _raise_line_error(self, row, batch_id):
        idx = self._index_of(row, batch_id)
        err = row.get("error") or {}
        resp = row.get("response") or {}
        body_err = (resp.get("body") or {}).get("error") if isinstance(resp.get("body"), dict) else None
        body_err = body_err if isinstance(body_err, dict) else {}
        raise CorelmError(resp.get("status_code"), body_err.get("code") or err.get("code"),
                          "prompt %d (batch %s, %s): %s" % (idx, batch_id, row.get("custom_id"),
                                                           body_err.get("message") or err.get("message") or "failed"),
                          index=idx, type=body_err.get("type"), param=body_err.get("param"))

    # -- other endpoints -----------------------------------------------------------------------
    def classify(self, texts, labels, model=None):
        """One label per text, by constrained greedy decoding: each text becomes the prompt
        ``"{text}\\nLabel:"`` (as `corelm run classify`) and /v1/completions with the corelm
        `choices` extension at temperature 0 returns the label (after a space) the model's greedy
        path reaches. This is not a comparison of the labels' full likelihoods (`corelm run
        classify` scores those); a label the greedy path leaves early can never win."""
        texts = _as_prompts(texts, "texts")
        labels = _as_prompts(labels, "labels")
        if len(labels) < 2 or len(set(labels)) != len(labels) or any(not l for l in labels):
            raise ValueError("classify needs at least two distinct, non-empty labels, got %r" % (labels,))
        choices = [" " + l for l in labels]
        # A byte-level token holds at least one byte: the longest choice's bytes (+ EOS) bound it.
        max_tokens = max(len(c.encode("utf-8")) for c in choices) + 1
        out = []
        for start in range(0, len(texts), 64):  # the server's prompts-per-request limit
            chunk = texts[start:start + 64]
            body = _drop_none({"model": model, "prompt": [t + "\nLabel:" for t in chunk], "choices": choices,
                               "temperature": 0, "max_tokens": max_tokens})
            resp = self._request("POST", "/v1/completions", body)
            got = [c.get("text") for c in sorted(resp.get("choices", []), key=lambda c: c.get("index", 0))]
            for k, text in enumerate(got):
                if text not in choices:
                    raise CorelmError(None, "bad_response", "text %d: the server answered %r, not one of the labels"
                                      % (start + k, text), index=start + k)
                out.append(labels[choices.index(text)])
        return out

    def score(self, texts, model=None, add_special=False):
        """Per-text log-likelihoods through POST /v1/score (64 texts per request): one dict per
        text, ``{"logprob", "tokens", "mean_logprob", "perplexity"}`` -- the summed log-probability
        of tokens 2..T, as `corelm run score` and ``corelm.local.Model.score`` compute it. A text
        the server cannot score (under two tokens, longer than the context) raises CorelmError
        with `index` set to its position."""
        texts = _as_prompts(texts, "texts")
        out = []
        for start in range(0, len(texts), 64):
            chunk = texts[start:start + 64]
            body = _drop_none({"model": model, "input": chunk, "add_special": True if add_special else None})
            try:
                resp = self._request("POST", "/v1/score", body)
            except CorelmError as e:
                m = re.match(r"input\[(\d+)\]$", e.param or "")
                if m or e.param == "input":
                    e.index = start + (int(m.group(1)) if m else 0)
                raise
            data = sorted(resp.get("data", []), key=lambda d: d.get("index", 0))
            if len(data) != len(chunk):
                raise CorelmError(None, "bad_response", "/v1/score answered %d scores for %d texts" % (len(data), len(chunk)))
            out += [{k: d.get(k) for k in ("logprob", "tokens", "mean_logprob", "perplexity")} for d in data]
        return out

    def chat(self, messages, model=None, **params):
        """POST /v1/chat/completions; returns the assistant's text (a list when n > 1).
        `messages` is a list of ``{"role", "content"}`` or one string (a single user turn)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        body = _drop_none(dict(params, model=model))
        body["messages"] = list(messages)
        return _texts_of(self._request("POST", "/v1/chat/completions", body))

    # -- Files ---------------------------------------------------------------------------------
    def upload_file(self, file, purpose="batch", filename=None):
        """POST /v1/files (multipart): `file` is a path or bytes; returns the file object."""
        if isinstance(file, (bytes, bytearray)):
            content = bytes(file)
            filename = filename or "input.jsonl"
        else:
            with open(file, "rb") as f:
                content = f.read()
            filename = filename or os.path.basename(os.fspath(file))
        boundary = "corelm-" + uuid.uuid4().hex
        safe_name = filename.replace('"', "_").replace("\r", "_").replace("\n", "_")
        buf = io.BytesIO()
        buf.write(("--%s\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n%s\r\n" % (boundary, purpose))
                  .encode("utf-8"))
        buf.write(("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\n"
                   "Content-Type: application/jsonl\r\n\r\n" % (boundary, safe_name)).encode("utf-8"))
        buf.write(content)
        buf.write(("\r\n--%s--\r\n" % boundary).encode("utf-8"))
        return self._request("POST", "/v1/files", data=buf.getvalue(),
                             content_type="multipart/form-data; boundary=" + boundary)

    def get_file(self, file_id):
        return self._request("GET", "/v1/files/" + urllib.parse.quote(file_id, safe=""))

    def file_content(self, file_id, _reconnect=None):
        """GET /v1/files/{id}/content as text."""
        raw = self._request("GET", "/v1/files/%s/content" % urllib.parse.quote(file_id, safe=""), reconnect=_reconnect)
        if isinstance(raw, (dict, list)):  # a server that labels JSONL as JSON
            return json.dumps(raw)
        return raw.decode("utf-8") if raw is not None else ""

    def delete_file(self, file_id):
        return self._request("DELETE", "/v1/files/" + urllib.parse.quote(file_id, safe=""))

    # -- Batches -------------------------------------------------------------------------------
    def create_batch(self, requests, endpoint="/v1/completions", completion_window="24h", metadata=None):
        """Uploads the input and creates a batch; returns the batch object.

        `requests`: a path to a JSONL file of ``{custom_id, method, url, body}`` lines, or a list of
        such dicts (or of JSON strings)."""
        if isinstance(requests, (str, os.PathLike)):
            file_obj = self.upload_file(requests, purpose="batch")
        else:
            lines = [r if isinstance(r, str) else json.dumps(r) for r in requests]
            if not lines:
                raise ValueError("create_batch: no requests")
            file_obj = self.upload_file(("\n".join(lines) + "\n").encode("utf-8"), purpose="batch")
        body = {"input_file_id": file_obj["id"], "endpoint": endpoint, "completion_window": completion_window}
        if metadata:
            body["metadata"] = metadata
        return self._request("POST", "/v1/batches", body)

    def get_batch(self, batch_id):
        return self._request("GET", "/v1/batches/" + urllib.parse.quote(batch_id, safe=""))

    def list_batches(self, limit=None, after=None):
        q = urllib.parse.urlencode(_drop_none({"limit": limit, "after": after}))
        return self._request("GET", "/v1/batches" + ("?" + q if q else "")).get("data", [])

    def cancel_batch(self, batch_id):
        return self._request("POST", "/v1/batches/%s/cancel" % urllib.parse.quote(batch_id, safe=""))

    def wait_batch(self, batch_id, timeout=None, poll_interval=0.2, max_interval=5.0):
        """Polls GET /v1/batches/{id} until it is completed, failed, cancelled or expired.

        The wait between polls grows with the time waited (a tenth of it, from `poll_interval`
        up to `max_interval`), so the end of a batch is noticed within ~10% of its run time."""
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        while True:
            interval = min(max_interval, max(poll_interval, 0.1 * (time.monotonic() - start)))
            batch = self._request("GET", "/v1/batches/" + urllib.parse.quote(batch_id, safe=""), reconnect="any")
            if batch.get("status") in BATCH_TERMINAL_STATES:
                return batch
            if deadline is not None and time.monotonic() + interval > deadline:
                raise CorelmError(None, "timeout", "batch %s still %s after %.0f s (request_counts %s)"
                                  % (batch_id, batch.get("status"), timeout, json.dumps(batch.get("request_counts"))))
            time.sleep(interval)

    def download(self, batch_id, path, errors_path=None):
        """Writes the batch's output file to `path` (atomically: a temporary file renamed into
        place) and, if given, its error file to `errors_path`. Returns the batch object."""
        batch = self.get_batch(batch_id)
        wanted = [("output_file_id", path)] + ([("error_file_id", errors_path)] if errors_path else [])
        if not batch.get("output_file_id") and not (errors_path and batch.get("error_file_id")):
            if batch.get("status") not in BATCH_TERMINAL_STATES:
                why = "no output file yet"
            elif batch.get("error_file_id"):
                why = "no output file, only an error file (%s; pass errors_path / --errors)" % batch["error_file_id"]
            else:
                why = "no output file (errors: %s)" % json.dumps(batch.get("errors"))
            raise CorelmError(None, "no_output", "batch %s (%s) has %s" % (batch_id, batch.get("status"), why))
        for field, dest in wanted:
            if not batch.get(field):
                continue
            dest = os.fspath(dest)
            fd, tmp = tempfile.mkstemp(prefix=".corelm-download-", dir=os.path.dirname(os.path.abspath(dest)))
            try:
                with os.fdopen(fd, "wb") as f:
                    self._request("GET", "/v1/files/%s/content" % urllib.parse.quote(batch[field], safe=""),
                                  stream_to=f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, dest)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        return batch

    # -- fine-tuning (server side not there yet) -------------------------------------------------
    def train(self, data, model_name=None, train_args=None):
        """Fine-tunes `model_name` on `data`: needs POST /v1/fine_tuning/jobs (not served yet)."""
        raise CorelmNotImplemented("POST /v1/fine_tuning/jobs", "Client.train()")

    def get_training_job(self, job_id=None):
        """A fine-tuning job's state: needs GET /v1/fine_tuning/jobs/{id} (with POST
        /v1/fine_tuning/jobs, not served yet)."""
        raise CorelmNotImplemented("POST /v1/fine_tuning/jobs", "Client.get_training_job()")
