"""corelm's Python SDK (pure Python).

corelm.local.Model runs a model in process through the C ABI (libcorelm.so, ctypes); it is
imported on demand so that importing corelm never needs the library.
"""

__version__ = "0.1.0"
__all__ = ["local"]
