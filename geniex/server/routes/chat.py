"""``POST /v1/chat/completions`` and ``POST /v1/completions``."""
from flask import Blueprint, Response, current_app, jsonify, request

from geniex.server import body as body_json, shapes, sse
from geniex.server.validation import as_api_error, validate

bp = Blueprint("chat", __name__)

KEEP_CACHE_HEADER = "GenieX-KeepCache"


def _body():
    # Strict JSON (no NaN/Infinity, no lone surrogates, bounded nesting); the size was
    # bounded by MAX_CONTENT_LENGTH (413) when the body was read.
    return body_json.parse(request.get_data())


def _keep_cache():
    """``GenieX-KeepCache: true`` keeps the KV cache from the previous request."""
    return request.headers.get(KEEP_CACHE_HEADER, "").strip().lower() in ("true", "1", "yes")


def _cancel():
    """The loop asks this before every step: stop when the client has gone away
    (waitress tells us) or the server is shutting down."""
    gone = request.environ.get("waitress.client_disconnected") or (lambda: False)
    stopping = current_app.extensions["geniex.answerer"].cache.stopping
    return lambda: stopping.is_set() or gone()


def _stream(events, answer):
    return Response(sse.EventStream(events, on_close=answer.close, on_error=lambda e: as_api_error(e).body()),
                    mimetype=sse.MIMETYPE, headers=sse.HEADERS)


def _include_usage(body):
    return bool((body.get("stream_options") or {}).get("include_usage"))


@bp.post("/v1/chat/completions")
def chat_completions():
    """A chat answer (streamed with ``stream``); empty ``messages`` = warm-up -> ``null``."""
    body = _body()
    validate(body, "chat_completions.request.json")
    answer = current_app.extensions["geniex.answerer"].chat(body, _keep_cache(), _cancel())
    if answer is None:
        return jsonify(None)
    env = shapes.Envelope("chat", answer.model)
    if body.get("stream"):
        return _stream(_chat_events(env, answer, _include_usage(body)), answer)
    with answer:
        text = answer.text()
    return jsonify(shapes.chat_completion(env, text, answer.stats, answer.warnings))


def _chat_events(env, answer, include_usage):
    yield shapes.chat_chunk(env, {"role": "assistant", "content": ""}, include_usage=include_usage,
                            warnings=answer.warnings)
    for piece in answer.pieces():
        yield shapes.chat_chunk(env, {"content": piece}, include_usage=include_usage)
    stats = answer.stats
    yield shapes.chat_chunk(env, {}, shapes.finish_reason(stats.stop_reason), include_usage, stats)
    if include_usage:
        yield shapes.usage_chunk(env, "chat.completion.chunk", stats)


@bp.post("/v1/completions")
def completions():
    """Continue a raw prompt (no template, no drafting); ``max_tokens`` defaults to 16."""
    body = _body()
    validate(body, "completions.request.json")
    answer = current_app.extensions["geniex.answerer"].complete(body, _keep_cache(), _cancel())
    env = shapes.Envelope("text", answer.model)
    if body.get("stream"):
        return _stream(_completion_events(env, answer, _include_usage(body)), answer)
    with answer:
        text = answer.text()
    return jsonify(shapes.completion(env, text, answer.stats))


def _completion_events(env, answer, include_usage):
    for piece in answer.pieces():
        yield shapes.text_chunk(env, piece, include_usage=include_usage)
    stats = answer.stats
    yield shapes.text_chunk(env, "", shapes.finish_reason(stats.stop_reason), include_usage, stats)
    if include_usage:
        yield shapes.usage_chunk(env, "text_completion", stats)
