"""corelm's Python SDK (pure Python, stdlib only).

corelm.Client talks to `corelm serve` over HTTP (generate, submit/get_results, classify, chat,
Files + Batches; see docs/SERVING.md, "Python SDK"); `corelm-client` is its console script.
corelm.local.Model runs a model in process through the C ABI (libcorelm.so, ctypes); it is
imported on demand so that importing corelm never needs the library.
"""

__version__ = "0.1.0"

from .client import Client  # noqa: E402
from .errors import CorelmConnectionError, CorelmError, CorelmNotImplemented  # noqa: E402

__all__ = ["Client", "CorelmError", "CorelmConnectionError", "CorelmNotImplemented", "local", "__version__"]
