"""OpenAI's ``POST /v1/chat/completions`` and ``POST /v1/completions`` (also at
``/chat/completions``, as llama.cpp's server answers it without ``/v1``)."""
from flask import Blueprint, jsonify

from geniex.engine import stops, tasks
from geniex.server import shapes
from geniex.server.exchange import answerer, caller, include_usage, read_body, stream
from geniex.server.validation import validate, validate_spec

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
@bp.post("/chat/completions")
def chat_completions():
    """A chat answer (streamed with ``stream``); empty ``messages`` = warm-up -> ``null``."""
    body = read_body()
    validate(body, "chat_completions.request.json")
    answer = answerer().chat(body, caller())
    if answer is None:
        return jsonify(None)
    return _reply(body, answer, shapes.Envelope("chat", answer.model), _chat_events, _whole_chat)


def _whole_chat(env, text, answer):
    return shapes.chat_completion(env, text, answer.stats, answer.warnings, answer.logprobs,
                                  "".join(answer.reasoning), answer.calls)


def _whole_completion(env, text, answer):
    return shapes.completion(env, text, answer.stats, answer.warnings, answer.logprobs)


def _reply(body, answer, env, events, whole):
    """The answer as a stream of ``events(env, answer, usage)`` chunks with ``stream``,
    else as one ``whole(env, text, answer)`` object."""
    if body.get("stream"):
        return stream(events(env, answer, include_usage(body)), answer)
    with answer:
        text = answer.text()
    return jsonify(whole(env, text, answer))


def _chat_events(env, answer, usage):
    # The first delta carries the role and a null content, as OpenAI's and llama.cpp's do.
    first = shapes.chat_chunk(env, {"role": "assistant", "content": None}, include_usage=usage,
                              warnings=answer.warnings)
    sent_first = False
    n_calls = 0
    for event in answer.events():
        extra = shapes.extras(event)
        if isinstance(event, tasks.Progress):
            if not sent_first:
                first.update(extra)
                yield first
                sent_first = True
            else:
                yield {**shapes.chat_chunk(env, {}, include_usage=usage), **extra}
            continue
        if not sent_first:
            yield first
            sent_first = True
        if event.reasoning:
            yield {**shapes.chat_chunk(env, {"reasoning_content": event.reasoning}, include_usage=usage), **extra}
            extra = {}
        # Steps whose text is held back (a possible call's opening, part of a character)
        # send nothing, unless they carry llama.cpp's per-token timings.
        if event.text or (extra and not event.reasoning and not event.calls):
            logprobs = event.logprobs if answer.logprobs is not None else None
            yield {**shapes.chat_chunk(env, {"content": event.text}, include_usage=usage, logprobs=logprobs), **extra}
        for call in event.calls:
            for delta in shapes.call_deltas(n_calls, call):
                yield shapes.chat_chunk(env, delta, include_usage=usage)
            n_calls += 1
    if not sent_first:
        yield first
    stats = answer.stats
    yield shapes.chat_chunk(env, {}, stops.finish_reason(stats.stop_reason, n_calls > 0), usage, stats)
    if usage:
        yield shapes.usage_chunk(env, "chat.completion.chunk", stats)


@bp.post("/v1/completions")
def completions():
    """Continue a raw prompt (text or token ids; no template); ``max_tokens`` (or
    ``n_predict``) defaults to 16; drafts when the request names a ``spec_type``."""
    body = read_body()
    validate(body, "completions.request.json")
    validate_spec(body)
    answer = answerer().complete(body, caller())
    return _reply(body, answer, shapes.Envelope("text", answer.model), _completion_events, _whole_completion)


def _completion_events(env, answer, usage):
    legacy = shapes.LegacyLogprobs()
    for event in answer.events():
        piece = isinstance(event, tasks.Piece)
        logprobs = legacy.add(event.logprobs or []) if piece and answer.logprobs is not None else None
        yield {**shapes.text_chunk(env, event.text if piece else "", include_usage=usage, logprobs=logprobs),
               **shapes.extras(event)}
    stats = answer.stats
    yield shapes.text_chunk(env, "", stops.finish_reason(stats.stop_reason), usage, stats)
    if usage:
        yield shapes.usage_chunk(env, "text_completion", stats)
