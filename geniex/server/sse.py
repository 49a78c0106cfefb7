"""Server-sent events, both ways: the server's streamed body, and the client-side
parser ``geniex run`` reads it with.

Each event is one ``data: <json>`` line and a blank line; the stream ends with
``data: [DONE]``, as OpenAI's does.
"""
import json
import logging

log = logging.getLogger("geniex.server")

DONE = "[DONE]"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MIMETYPE = "text/event-stream"


def encode(obj):
    """One event carrying ``obj`` as JSON (or the ``[DONE]`` marker)."""
    data = obj if obj == DONE else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def encode_named(pair):
    """One event with a name: ``(name, obj)`` -> ``event: name`` and ``data: <json>``
    (the Responses and Messages APIs name their events)."""
    name, obj = pair
    return f"event: {name}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


class EventStream:
    """A response body of events that calls ``on_close`` exactly once: when the events
    run out, when the client goes away (the server closes the body), or when the body
    is never iterated at all. ``on_error(exc)`` turns a failure mid-stream into a last
    event (an HTTP status can no longer be sent). ``done`` ends the body with
    ``data: [DONE]``; ``encode`` writes one event (default :func:`encode`)."""

    def __init__(self, events, on_close, on_error, done=True, encode=None):
        self._events = events
        self._on_close = on_close
        self._on_error = on_error
        self._done = done               # end with data: [DONE]
        self._encode = encode or globals()["encode"]
        self._closed = False

    def __iter__(self):
        try:
            for obj in self._events:
                yield self._encode(obj)
        except Exception as e:          # noqa: BLE001 - reported to the client below
            yield self._encode(self._on_error(e))
        finally:
            self.close()
        if self._done:
            yield encode(DONE)

    def close(self):
        if not self._closed:
            self._closed = True
            close_events = getattr(self._events, "close", None)
            if close_events is not None:
                close_events()
            self._on_close()


def iter_events(lines):
    """Client side: decoded JSON of each ``data:`` line until ``[DONE]``.

    ``lines`` are text lines of the body (``requests``' ``iter_lines``).
    """
    for line in lines:
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        if not line.startswith("data:"):
            continue                    # blank separators, comments, other fields
        data = line[5:].strip()
        if data == DONE:
            return
        yield json.loads(data)
