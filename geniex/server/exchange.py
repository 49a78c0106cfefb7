"""What every route does with a request and an answer in progress: read the body as
strict JSON, the keep-cache header, the cancel test, and send an answer as a stream of
server-sent events."""
from flask import Response, current_app, g, request

from geniex.server import body as body_json, sse
from geniex.server.answering import Caller
from geniex.server.validation import ApiError, as_api_error, validate

KEEP_CACHE_HEADER = "GenieX-KeepCache"


def answerer():
    """The app's :class:`~geniex.server.answering.Answerer`."""
    return current_app.extensions["geniex.answerer"]


def read_body():
    """The request body as strict JSON (no NaN/Infinity, no lone surrogates, bounded
    nesting); its size was bounded by MAX_CONTENT_LENGTH (413) when it was read."""
    raw = request.get_data()
    if len(raw) >= body_json.BIG_BODY:
        g.geniex_big_body = True        # app.py gives the memory back when the request ends
    return body_json.parse(raw)


def keep_cache():
    """``GenieX-KeepCache``: true (reuse the cached prompt), false (start clean), or None
    when absent (reuse where it cannot change the answer)."""
    value = request.headers.get(KEEP_CACHE_HEADER, "").strip().lower()
    return True if value in ("true", "1", "yes") else False if value in ("false", "0", "no") else None


def cancel():
    """The loop asks this before every step: stop when the client has gone away
    (waitress tells us) or the server is shutting down."""
    gone = request.environ.get("waitress.client_disconnected") or (lambda: False)
    stopping = answerer().cache.stopping
    return lambda: stopping.is_set() or gone()


def caller():
    """What the answerer needs to know about this request's client (a
    :class:`~geniex.server.answering.Caller`): its keep-cache header, its cancel test,
    the API key it was let in with (guard.py), and where its wait for the model goes
    (the ``GenieX-Queue-Wait`` header, app.py)."""
    return Caller(keep_cache=keep_cache(), cancel=cancel(), owner=g.get("geniex_api_key"),
                  on_wait=lambda seconds: setattr(g, "geniex_queue_wait", seconds))


def stream(events, answer, done=True, encode=None, error=None):
    """An SSE response of ``events`` that closes ``answer`` when it ends; ``done``
    ends it with ``data: [DONE]`` (OpenAI's streams; llama.cpp's native ones have
    none); ``encode`` turns an event into its bytes (default ``data: <json>``) and
    ``error(api_error)`` a failure mid-stream into the API's last event (default
    OpenAI's ``{"error": {...}}``)."""
    error = error or (lambda e: e.body())
    return Response(sse.EventStream(events, on_close=answer.close, on_error=lambda e: error(as_api_error(e)),
                                    done=done, encode=encode),
                    mimetype=sse.MIMETYPE, headers=sse.HEADERS)


def chat_of(body, schema, convert, field):
    """An agents' API request (Responses, Messages) answered on the chat path: ``body``
    checked against ``schema``, made a chat request by ``convert`` (checked as one),
    and started; an empty conversation is a 400 naming ``field``."""
    validate(body, schema)
    chat = convert(body)
    validate(chat, "chat_completions.request.json")
    answer = answerer().chat(chat, caller())
    if answer is None:
        raise ApiError(400, f"{field}: required: the conversation is empty", param=field, code="invalid_value")
    return answer


def include_usage(body):
    return bool((body.get("stream_options") or {}).get("include_usage"))
