"""corelm-client: the SDK from the shell.

  corelm-client [--base-url URL] [--api-key K] [--json] COMMAND ...
    health                          the server's /health (exit 1 unless "ok")
    ls                              the models (/v1/models)
    generate PROMPT... [--model M] [--max-tokens N] [--temperature T] [--top-p P] [--seed S]
             [--stop S]... [--input FILE] [--batch-threshold N]
    batch submit FILE [--endpoint /v1/completions|/v1/chat/completions] [--wait]
    batch status ID | batch list | batch download ID OUT [--errors FILE] | batch cancel ID

--base-url defaults to $CORELM_BASE_URL or http://127.0.0.1:8080, --api-key to $CORELM_API_KEY.
--json prints the server's JSON objects. Exit codes: 0 ok, 1 a server or connection error (the
message on stderr), 2 a usage error.
"""

import argparse
import json
import os
import sys

from . import __version__
from .client import Client
from .errors import CorelmError


def _out(args, obj, text):
    if args.json:
        print(json.dumps(obj, ensure_ascii=False))
    else:
        print(text)


def _cmd_health(c, args):
    h = c.health()
    _out(args, h, h.get("status", json.dumps(h)))
    return 0 if h.get("status") == "ok" else 1


def _cmd_ls(c, args):
    models = c.list_models()
    _out(args, models, "\n".join("%s\t%s" % (m.get("id"), m.get("status", "")) for m in models))
    return 0


def _cmd_generate(c, args):
    prompts = list(args.prompts)
    if args.input:
        with (sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")) as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise SystemExit("corelm-client generate: give PROMPT arguments or --input FILE")
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "seed": args.seed, "stop": args.stop or None}
    c.batch_threshold = args.batch_threshold
    texts = c.generate(prompts, model=args.model, **sampling)
    if args.json:
        for p, t in zip(prompts, texts):
            print(json.dumps({"prompt": p, "text": t}, ensure_ascii=False))
    else:
        for t in texts:
            print(t if isinstance(t, str) else json.dumps(t, ensure_ascii=False))
    return 0


def _batch_line(b):
    rc = b.get("request_counts") or {}
    return "%s\t%s\ttotal=%s completed=%s failed=%s" % (b.get("id"), b.get("status"), rc.get("total"),
                                                         rc.get("completed"), rc.get("failed"))


def _cmd_batch(c, args):
    if args.batch_cmd == "submit":
        b = c.create_batch(args.file, endpoint=args.endpoint, completion_window=args.completion_window)
        if args.wait:
            b = c.wait_batch(b["id"])
        _out(args, b, _batch_line(b) if args.wait else b.get("id"))
        return 0 if not args.wait or b.get("status") == "completed" else 1
    if args.batch_cmd == "status":
        b = c.get_batch(args.id)
        _out(args, b, _batch_line(b))
        return 0
    if args.batch_cmd == "list":
        bs = c.list_batches()
        _out(args, bs, "\n".join(_batch_line(b) for b in bs))
        return 0
    if args.batch_cmd == "download":
        b = c.download(args.id, args.out, errors_path=args.errors)
        _out(args, b, "wrote %s (%s)" % (args.out, _batch_line(b)))
        return 0
    if args.batch_cmd == "cancel":
        b = c.cancel_batch(args.id)
        _out(args, b, _batch_line(b))
        return 0
    raise AssertionError(args.batch_cmd)


def build_parser():
    # --json is accepted before or after the command: each subparser repeats it with SUPPRESS so
    # that a later position does not reset an earlier one.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    p = argparse.ArgumentParser(prog="corelm-client", description="Client of `corelm serve` (corelm's Python SDK).",
                                epilog="--base-url defaults to $CORELM_BASE_URL, --api-key to $CORELM_API_KEY.")
    p.add_argument("--base-url", default=os.environ.get("CORELM_BASE_URL", "http://127.0.0.1:8080"),
                   help="server root (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("CORELM_API_KEY"), help="Bearer key (--api-key of the server)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per HTTP exchange (default: %(default)s)")
    p.add_argument("--json", action="store_true", default=False, help="print JSON")
    p.add_argument("--version", action="version", version="corelm-client " + __version__)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    sub.add_parser("health", parents=[common], help="the server's /health (exit 1 unless ok)",
                   description="GET /health; prints the status, exits 1 unless it is ok.")
    sub.add_parser("ls", parents=[common], help="list the models", description="GET /v1/models: id and status per line.")

    g = sub.add_parser("generate", parents=[common], help="generate texts for prompts",
                       description="Queues the prompts (POST /v1/generate), waits for every result and prints one "
                                   "text per prompt, in order (--json: one {prompt, text} object per line).")
    g.add_argument("prompts", nargs="*", metavar="PROMPT")
    g.add_argument("--input", metavar="FILE", help="also one prompt per line of FILE (- for stdin)")
    g.add_argument("--model", help="model id (may be omitted when the server serves one)")
    g.add_argument("--max-tokens", type=int)
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-p", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--batch-threshold", type=int, default=10000,
                   help="more prompts than this go through Files + Batches (default: %(default)s)")

    b = sub.add_parser("batch", parents=[common], help="OpenAI Batches: submit, status, list, download, cancel",
                       description="The OpenAI Files + Batches API of the server (needs `corelm serve --state-dir`).")
    bsub = b.add_subparsers(dest="batch_cmd", metavar="ACTION", required=True)
    s = bsub.add_parser("submit", parents=[common], help="upload a JSONL file and create a batch; prints its id",
                        description="Uploads FILE (lines {custom_id, method, url, body}) with purpose=batch and "
                                    "creates a batch; prints the batch id.")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    s.add_argument("--completion-window", default="24h")
    s.add_argument("--wait", action="store_true", help="wait until the batch ends (exit 1 unless completed)")
    st = bsub.add_parser("status", parents=[common], help="a batch's status and counts",
                         description="GET /v1/batches/ID: id, status, request counts.")
    st.add_argument("id", metavar="ID")
    bsub.add_parser("list", parents=[common], help="list batches", description="GET /v1/batches.")
    d = bsub.add_parser("download", parents=[common], help="write a batch's output file",
                        description="Writes the output file of batch ID to OUT (atomically).")
    d.add_argument("id", metavar="ID")
    d.add_argument("out", metavar="OUT")
    d.add_argument("--errors", metavar="FILE", help="also write the error file here")
    ca = bsub.add_parser("cancel", parents=[common], help="cancel a batch", description="POST /v1/batches/ID/cancel.")
    ca.add_argument("id", metavar="ID")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        client = Client(args.base_url, api_key=args.api_key, timeout=args.timeout)
        handler = {"health": _cmd_health, "ls": _cmd_ls, "generate": _cmd_generate, "batch": _cmd_batch}[args.cmd]
        return handler(client, args)
    except CorelmError as e:
        print("corelm-client: %s" % e, file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print("corelm-client: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
