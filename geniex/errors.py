"""Exceptions that carry a message meant for the user.

The CLI prints ``str(error)`` as one line on stderr and exits non-zero; the server
maps them to OpenAI-style error bodies. Anything else escaping is a bug.
"""


def shown(text, limit=80):
    """Text from a file or a server (a name, a key), safe inside a one-line message:
    control characters (terminal escape sequences, newlines) and other unprintables
    escaped, long text cut."""
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))
    return out if len(out) <= limit else out[:limit - 1] + "…"


class GenieXError(Exception):
    """A failure the user can act on; the message says what to do next.

    ``param`` names the request field at fault where a server request caused it (the
    server's error body carries it as OpenAI's ``param``)."""

    exit_code = 1
    param = None

    def __init__(self, *args, param=None):
        super().__init__(*args)
        if param is not None:
            self.param = param


class UsageError(GenieXError):
    """Bad flag or argument value (exit code 2, like argparse)."""

    exit_code = 2


class LibraryError(GenieXError):
    """The llama.cpp shared library is missing, incompatible, or lacks a capability."""


class ModelLoadError(GenieXError):
    """A model file could not be opened or is not a usable GGUF."""


class ModelNotFound(GenieXError):
    """A model name resolves to nothing in the store (and nothing on disk)."""


class ContextLengthExceeded(GenieXError):
    """The prompt does not fit in the context window (``n_prompt_tokens`` of them, in a
    context of ``n_ctx``, where known: llama.cpp's server reports both)."""

    def __init__(self, message, n_prompt_tokens=None, n_ctx=None):
        super().__init__(message)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class Unsupported(GenieXError):
    """The loaded model cannot do what was asked (no FIM tokens for infill, no pooling
    for embeddings, no classifier head for reranking): the server's 501."""


class SpecSetupError(GenieXError):
    """Speculative decoding could not be set up; callers fall back to plain decoding."""


class Cancelled(GenieXError):
    """The caller cancelled an answer while its prompt was still being decoded (a client
    that went away, a server that is stopping). ``done`` of ``total`` prompt tokens were
    decoded when the work stopped."""

    def __init__(self, done, total):
        super().__init__(f"cancelled after {done} of {total} prompt tokens")
        self.done = done
        self.total = total


class ModelCrashed(GenieXError):
    """The process running a model ended under a request (the server's 502
    ``model_crashed``): llama.cpp aborted or was killed. ``model`` names it."""

    def __init__(self, message, model=None):
        super().__init__(message)
        self.model = model


class RequestTimeout(GenieXError):
    """A request ran past its time budget before it produced anything (the server's 504
    ``request_timeout``; one that produced some text ends with ``finish_reason: length``)."""


class LoadTimeout(GenieXError):
    """A model load did not end within its bound (``geniex serve --load-timeout``): its
    worker process was killed (the server's 504 ``load_timeout``)."""


class LoadCancelled(GenieXError):
    """A request was cancelled (its client went away, the server is stopping) while its
    model loaded (the server's 503 ``request_cancelled``)."""


class ServerStopping(GenieXError):
    """The server stopped an answer that did not end in time after a stop signal (its
    503 ``shutting_down``)."""
