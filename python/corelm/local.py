"""In-process inference through corelm's C ABI (include/corelm/c_api.h) with ctypes.

    from corelm.local import Model
    with Model("path/to/model") as m:
        ids = m.tokenize("the cat")
        print(m.generate(["the cat"], max_tokens=8, temperature=0)[0]["text"])

The library is found at $CORELM_LIB, next to this package, or in build/release of a source tree.
Every failure raises CorelmError carrying the library's message (corelm_last_error()).
"""

import ctypes
import json
import os
import pathlib
import threading

__all__ = ["CorelmError", "Model", "library_path", "version"]

_STATUS = {
    0: "OK",
    1: "INVALID_ARGUMENT",
    2: "IO_ERROR",
    3: "FORMAT_ERROR",
    4: "OUT_OF_MEMORY",
    5: "BUFFER_TOO_SMALL",
    6: "INTERNAL",
}
_BUFFER_TOO_SMALL = 5


class CorelmError(RuntimeError):
    """A failed corelm_* call: `status` is the status name, the message is corelm_last_error()."""

    def __init__(self, status, message):
        self.status = _STATUS.get(status, str(status))
        super().__init__("%s: %s" % (self.status, message))


def library_path():
    """Where libcorelm.so is looked for: $CORELM_LIB, beside the package, then build/release."""
    env = os.environ.get("CORELM_LIB")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / "libcorelm.so", here.parent / "libcorelm.so",
                      here.parent.parent / "build" / "release" / "libcorelm.so"):
        if candidate.exists():
            return str(candidate)
    raise CorelmError(2, "libcorelm.so not found: set CORELM_LIB, or build it "
                         "(cmake --build --preset release --target corelm_shared)")


_lib = None
_lib_lock = threading.Lock()


def _library():
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise CorelmError(2, "cannot load %s: %s" % (path, e)) from None
        c_char_pp = ctypes.POINTER(ctypes.c_char_p)
        sz = ctypes.c_size_t
        i32p = ctypes.POINTER(ctypes.c_int32)
        lib.corelm_version.restype = ctypes.c_char_p
        lib.corelm_version.argtypes = []
        lib.corelm_last_error.restype = ctypes.c_char_p
        lib.corelm_last_error.argtypes = []
        lib.corelm_model_load.restype = ctypes.c_int
        lib.corelm_model_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.corelm_model_free.restype = None
        lib.corelm_model_free.argtypes = [ctypes.c_void_p]
        lib.corelm_tokenize.restype = ctypes.c_int
        lib.corelm_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, sz, ctypes.c_int, i32p, sz,
                                        ctypes.POINTER(sz)]
        lib.corelm_detokenize.restype = ctypes.c_int
        lib.corelm_detokenize.argtypes = [ctypes.c_void_p, i32p, sz, ctypes.c_char_p, sz, ctypes.POINTER(sz)]
        # Returned strings are kept as void* so they can be handed back to corelm_string_free.
        out = ctypes.POINTER(ctypes.c_void_p)
        lib.corelm_generate.restype = ctypes.c_int
        lib.corelm_generate.argtypes = [ctypes.c_void_p, c_char_pp, sz, ctypes.c_char_p, out]
        lib.corelm_classify.restype = ctypes.c_int
        lib.corelm_classify.argtypes = [ctypes.c_void_p, c_char_pp, sz, c_char_pp, sz, out]
        lib.corelm_score.restype = ctypes.c_int
        lib.corelm_score.argtypes = [ctypes.c_void_p, c_char_pp, sz, out]
        lib.corelm_string_free.restype = None
        lib.corelm_string_free.argtypes = [ctypes.c_void_p]
        _lib = lib
        return lib


def version():
    return _library().corelm_version().decode()


def _check(lib, status):
    if status != 0:
        raise CorelmError(status, lib.corelm_last_error().decode("utf-8", "replace"))


def _strings(items, what):
    if isinstance(items, (str, bytes)):
        raise TypeError("%s must be a list of strings, not a single string" % what)
    encoded = []
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise TypeError("%s[%d] must be a str, got %s" % (what, i, type(s).__name__))
        if "\0" in s:
            raise ValueError("%s[%d] holds a NUL character" % (what, i))
        encoded.append(s.encode("utf-8"))
    arr = (ctypes.c_char_p * max(1, len(encoded)))(*encoded)
    return arr, len(encoded)


class Model:
    """A model loaded in this process. Calls on one Model are serialised by the library."""

    def __init__(self, path, tokenizer=None, strict=True, threads=None):
        self._lib = _library()
        options = {"strict": bool(strict)}
        if tokenizer is not None:
            options["tokenizer"] = str(tokenizer)
        if threads is not None:
            options["threads"] = int(threads)
        handle = ctypes.c_void_p()
        _check(self._lib, self._lib.corelm_model_load(os.fsencode(str(path)), json.dumps(options).encode(),
                                                       ctypes.byref(handle)))
        self._h = handle

    def _handle(self):
        if self._h is None or not self._h.value:
            raise CorelmError(1, "the model is closed")
        return self._h

    def close(self):
        if getattr(self, "_h", None) is not None and self._h.value:
            self._lib.corelm_model_free(self._h)
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def tokenize(self, text, add_special=False):
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        n = ctypes.c_size_t()
        h = self._handle()
        _check(self._lib, self._lib.corelm_tokenize(h, data, len(data), int(add_special), None, 0, ctypes.byref(n)))
        ids = (ctypes.c_int32 * max(1, n.value))()
        _check(self._lib, self._lib.corelm_tokenize(h, data, len(data), int(add_special), ids, n.value,
                                                    ctypes.byref(n)))
        return list(ids[: n.value])

    def detokenize_bytes(self, ids):
        ids = list(ids)
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        n = ctypes.c_size_t()
        h = self._handle()
        _check(self._lib, self._lib.corelm_detokenize(h, arr, len(ids), None, 0, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(max(1, n.value))
        _check(self._lib, self._lib.corelm_detokenize(h, arr, len(ids), buf, n.value, ctypes.byref(n)))
        return buf.raw[: n.value]

    def detokenize(self, ids):
        """The text of `ids` (invalid UTF-8, e.g. half a character, is replaced)."""
        return self.detokenize_bytes(ids).decode("utf-8", "replace")

    def _json_call(self, fn, *args):
        out = ctypes.c_void_p()
        _check(self._lib, fn(self._handle(), *args, ctypes.byref(out)))
        try:
            return json.loads(ctypes.string_at(out.value).decode("utf-8"))
        finally:
            self._lib.corelm_string_free(out)

    def generate(self, prompts, **params):
        """One dict per prompt: text, tokens, prompt_tokens, finish_reason. `params` are the C ABI's
        (max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, no_repeat_ngram_size,
        seed, stop, stop_at_eos, add_special, greedy)."""
        arr, n = _strings(prompts, "prompts")
        return self._json_call(self._lib.corelm_generate, arr, n, json.dumps(params).encode())

    def classify(self, texts, labels=()):
        """One dict per text: label, probs {label: p}, margin, logprob (or error)."""
        t, nt = _strings(texts, "texts")
        lab, nl = _strings(labels, "labels")
        return self._json_call(self._lib.corelm_classify, t, nt, lab, nl)

    def score(self, texts):
        """One dict per text: logprob (summed), tokens (scored), mean_logprob (or error)."""
        t, nt = _strings(texts, "texts")
        return self._json_call(self._lib.corelm_score, t, nt)
