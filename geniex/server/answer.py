"""An answer in progress: the events of a task run on a leased model, and the errors a
request causes mapped to HTTP statuses while one can still be sent."""
import logging

from geniex import profile
from geniex.engine import tasks
from geniex.errors import Cancelled, ContextLengthExceeded, UsageError
from geniex.server.validation import ApiError

log = logging.getLogger("geniex.server")


class Answer:
    """An answer in progress under a :class:`~geniex.server.cache.Lease`: the events of
    ``task`` run (:mod:`geniex.engine.tasks`).

    Made by :func:`start`, which takes the first event, so a prompt that does not fit
    fails while an HTTP status can still say so. :meth:`events` yields the answer's
    Piece and Progress events (:meth:`pieces` its text) as they come; :meth:`close`
    (always called) hands the model to the next request and counts the answer in the
    metrics.
    """

    def __init__(self, lease, task, events, model, warnings, metrics=None):
        self.lease = lease
        self.task = task
        self.model = model
        self.warnings = warnings
        self.stats = None                       # the answer's Stats, once it is done
        self.tokens = []                        # the answer's tokens so far
        self.reasoning = []                     # reasoning text pieces so far (chat answers)
        self.calls = []                         # tool calls so far (OpenAI tool_calls items)
        self.logit_bias = ()                    # as sampled: ((token, bias), ...)
        # [TokenText] so far, when the request asked for them
        self.logprobs = [] if task.options.logprobs is not None else None
        self._metrics = metrics
        self._events = events
        try:
            self._first = next(events, None)
        except BaseException:
            lease.release()
            raise

    def events(self):
        """Piece and Progress events until the answer ends (``stats`` is then set)."""
        event = self._first
        while event is not None:
            if isinstance(event, tasks.Done):
                self.stats = event.stats
                self.logit_bias = event.logit_bias
                if self._metrics is not None and event.prompt_cache is not None:
                    self._metrics.prompt_cache = event.prompt_cache
            elif isinstance(event, tasks.Progress):
                yield event
            elif event.text or event.tokens or getattr(event, "reasoning", "") or getattr(event, "calls", None):
                self.tokens.extend(event.tokens)
                if self.logprobs is not None and event.logprobs:
                    self.logprobs.extend(event.logprobs)
                if getattr(event, "reasoning", ""):
                    self.reasoning.append(event.reasoning)
                self.calls.extend(getattr(event, "calls", None) or ())
                yield event
            event = next(self._events, None)

    def pieces(self):
        """Printable text pieces until the answer ends (``stats`` is then set)."""
        for event in self.events():
            if isinstance(event, tasks.Piece) and event.text:
                yield event.text

    def text(self):
        """Consume the whole answer; returns its text."""
        return "".join(self.pieces())

    def close(self):
        """Hand the model to the next request (once), logging the answer's profile; an
        answer left before its end is stopped first."""
        close_events = getattr(self._events, "close", None)
        if close_events is not None and not self.lease.released:
            close_events()
        if self.stats is not None and not self.lease.released:
            log.info("%s: %s (stop: %s)", self.model, profile.line(self.stats), self.stats.stop_reason)
            if self._metrics is not None:
                self._metrics.record(self.stats)
        self.lease.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def start(lease, task, cancel, timeout, model, warnings, metrics, field):
    """Run ``task`` under ``lease`` (``timeout`` seconds at most, None for no limit) as
    an :class:`Answer`, its first event taken, with the errors a request causes mapped
    to their statuses (``field``: the request field a prompt error names); the lease is
    released on failure."""
    try:
        try:
            events = lease.run(task, cancel, timeout)
        except BaseException:
            lease.release()
            raise
        return Answer(lease, task, events, model, warnings, metrics)    # releases on its own failure
    except Cancelled as e:
        log.info("%s: request cancelled (the client went away or the server is stopping) while its "
                 "prompt was processed; stopped after %d of %d prompt tokens", model, e.done, e.total)
        raise ApiError(503, f"the request was cancelled while its prompt was processed ({e})",
                       code="request_cancelled") from None
    except (ContextLengthExceeded, UsageError) as e:
        raise request_error(e, field) from None


def request_error(e, field):
    """An engine error a request caused -> its ApiError (llama.cpp's shape for a prompt
    that does not fit: ``exceed_context_size_error`` with both counts)."""
    if isinstance(e, ContextLengthExceeded):
        # The engine's message names the CLI flag; a request sets the field instead.
        return ApiError(400, str(e).replace("--nctx", "nctx"), param=field, code="context_length_exceeded",
                        type_="exceed_context_size_error",
                        extra={"n_prompt_tokens": e.n_prompt_tokens, "n_ctx": e.n_ctx})
    return ApiError(400, str(e), param=e.param or field, code="invalid_value")
