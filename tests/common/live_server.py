"""A live `corelm serve` child process for the Python tests that drive the real server
(tests/serve/test_openai_client.py, tests/serve/test_openai_batches.py, tests/sdk/test_sdk_live.py).

LiveServer(binary, args, api_key) runs `BINARY serve --host 127.0.0.1 ARGS... [--api-key KEY]`
(ARGS name the model, the port — usually `--port 0` — and anything else), reads the
"listening on http://HOST:PORT" line for `url`, and waits until GET /health answers 200
{"status": "ok"}. The child dies with this process (PR_SET_PDEATHSIG), so a killed test never
leaves a server behind. Standard library only.
"""
import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request


def die_with_parent():
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _health(url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    try:
        with opener.open(url + "/health", timeout=2) as r:
            return r.status == 200 and json.loads(r.read()).get("status") == "ok"
    except (urllib.error.URLError, OSError, ValueError):
        return False


class LiveServer:
    def __init__(self, binary, args, api_key=None, start_timeout=30, keep_lines=40):
        self.lines = []
        self.keep_lines = keep_lines
        cmd = [binary, "serve", "--host", "127.0.0.1"] + list(args)
        if api_key:
            cmd += ["--api-key", api_key]
        # Same process group as the test (a runner that kills the group kills the server too).
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=die_with_parent)
        self.url = None
        found = threading.Event()

        def reader():
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                m = re.search(r"listening on (http://[0-9.]+:[0-9]+)", line)
                if m and not self.url:
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=reader, daemon=True).start()
        if not found.wait(start_timeout) or not self.url:
            self.kill()
            raise RuntimeError("server printed no 'listening on http://HOST:PORT' line:\n" + self.log())
        deadline = time.time() + start_timeout
        while time.time() < deadline:
            if _health(self.url):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("/health never answered 200 {\"status\":\"ok\"}:\n" + self.log())

    def log(self):
        return "\n".join(self.lines[-self.keep_lines:])

    def stop(self):
        """SIGTERM (the server drains), SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self):
        """SIGKILL, as a crash would."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def run_checks(checks, ctx, script):
    """Runs each check(ctx), printing PASS/FAIL NAME (with the failing line of `script`, the
    calling test's __file__); a failure is reported and the run goes on. Returns (passed, failed)
    as lists of names."""
    import traceback
    passed, failed = [], []
    for fn in checks:
        t = time.time()
        try:
            fn(ctx)
            passed.append(fn.__name__)
            print(f"PASS {fn.__name__} ({time.time() - t:.2f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
            failed.append(fn.__name__)
            tb = traceback.extract_tb(e.__traceback__)
            where = next((f"line {f.lineno}" for f in reversed(tb) if f.filename == script), "")
            print(f"FAIL {fn.__name__} ({where}): {type(e).__name__}: {str(e)[:600]}", flush=True)
    return passed, failed
