"""The worker's wire: length-prefixed pickled frames, and errors as data.

Commands go to the worker over its stdin, replies come back over a duplicate of its
stdout (its own stdout then goes to stderr, so a stray print from the library cannot
corrupt a frame). Each reply frame is a *list* of messages: the worker's sender thread
writes whatever its answers produced since its last write in one frame, so a fast answer
goes over in batches and a slow one piece by piece, without waiting on a timer.

Commands: ``("load", target, options, level, native)``, ``("run", run_id, task,
timeout)``, ``("cancel", run_id)``, ``("status", request_id)``, ``("exit",)``.
Replies: ``("loaded", info)`` or ``("error", payload)`` to a load; ``("event", run_id,
event)``, then ``("end", run_id)`` or ``("error", run_id, payload)`` for a run;
``("status", request_id, data)``; ``("log", level, logger, text)`` at any time.
"""
import importlib
import pickle
import signal
import struct

from geniex.errors import GenieXError

CLOSE_WAIT = 10.0           # seconds a closing worker may take to free its model before it is killed
_HEADER = struct.Struct("<I")
MAX_FRAME = 1 << 30         # a frame larger than this is a broken worker, not an answer
# -- framing -----------------------------------------------------------------------------
def write(stream, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read(stream):
    """One frame, or None at the end of the stream (the other side is gone)."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME:
        raise EOFError(f"a frame of {size} bytes")
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def error_payload(exc):
    """An exception as data: a GenieXError keeps its class and fields (the server maps it
    to its status); anything else is a bug, kept as its text."""
    if isinstance(exc, GenieXError):
        kind = type(exc)
        return ("known", kind.__module__, kind.__qualname__, exc.args, dict(vars(exc)))
    return ("bug", f"{type(exc).__name__}: {exc}")


def rebuild(payload, model):
    if payload[0] == "known":
        _, module, qualname, args, fields = payload
        try:
            kind = getattr(importlib.import_module(module), qualname)
        except (ImportError, AttributeError):
            kind = None
        if isinstance(kind, type) and issubclass(kind, GenieXError):
            exc = kind.__new__(kind)
            exc.args = tuple(args)
            vars(exc).update(fields)
            return exc
        return GenieXError(*args)
    return RuntimeError(f"{model}: the worker failed: {payload[1]}")


def exit_text(returncode):
    """How a worker ended, in words: ``SIGABRT``, ``exit status 3``, ``0xC0000409``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    if returncode > 0xFFFF:                     # a Windows exception code
        return f"0x{returncode:08X}"
    return f"exit status {returncode}"


