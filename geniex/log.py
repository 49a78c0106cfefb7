"""Logging setup shared by every command (``--log`` / ``GENIEX_LOG``)."""
import logging
import os
import sys

LEVELS = {
    "none": logging.CRITICAL + 10,
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": 5,
}
logging.addLevelName(5, "TRACE")


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a record is written (as logging's
    own last-resort handler), not the stream of the moment it was made: a caller that
    swaps stderr (pytest's capture, an embedding app) and closes the old one does not
    leave geniex writing to a closed file."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def setup(level_name=None, verbose=False):
    """Configure the ``geniex`` logger tree on stderr.

    Our own warnings are shown by default; llama.cpp's log (logger ``geniex.llama.cpp``)
    stays silent unless a level is asked for explicitly, because it is very chatty.
    """
    name = (level_name or os.environ.get("GENIEX_LOG") or "").lower()
    if name and name not in LEVELS:
        from geniex.errors import UsageError
        raise UsageError(f"unknown log level {name!r}; choose one of: {', '.join(sorted(set(LEVELS) - {'warning'}))}")
    root = logging.getLogger("geniex")
    if not root.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.propagate = False
    root.setLevel(LEVELS[name] if name else (logging.INFO if verbose else logging.WARNING))
    native = logging.getLogger("geniex.llama.cpp")
    native.setLevel(LEVELS[name] if name else LEVELS["none"])
