"""glibc's ``malloc_trim``: the one C function geniex calls outside llama.cpp.

A request body of up to ``--max-body`` bytes is read, decoded and parsed into Python
objects, and the memory they took is freed when the request ends, but glibc keeps
freed heap memory in the process for reuse: after a burst of large bodies the server
would stay at its peak size. :func:`malloc_trim` gives it back to the OS. Where the C
library has no such function (macOS, Windows, musl) it does nothing.
"""
import ctypes
import ctypes.util


def _load():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _load()


def malloc_trim():
    """Give freed heap memory back to the OS (``malloc_trim(0)``); nothing where the C
    library has no such function."""
    if _TRIM is not None:
        _TRIM(0)
