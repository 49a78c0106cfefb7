"""``POST /v1/messages`` (Anthropic's Messages API, what coding agents speak) and
``POST /v1/messages/count_tokens``, on the chat path: ``system`` and ``messages``
become chat messages, the answer one ``text`` content block (streamed as the API's
named events: message_start, content_block_start/delta/stop, message_delta,
message_stop).

Tool use is not parsed out of answers here: ``tools`` or ``tool_use`` /
``tool_result`` blocks are a 400 naming them, rather than an answer that drops them.
"""
from flask import Blueprint, jsonify

from geniex.engine import tasks
from geniex.server import llama_fields, shapes, sse
from geniex.server.answering import chat_messages
from geniex.server.exchange import answerer, cancel, chat_of, read_body, stream
from geniex.server.validation import ApiError, validate

bp = Blueprint("messages", __name__)

# The loop's stop reasons -> Anthropic's stop_reason.
STOP = {"eos": "end_turn", "user": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens",
        "context_length": "max_tokens", "time_limit": "max_tokens"}


def _text(content, where):
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content or []):
        kind = block.get("type")
        if kind != "text":
            raise ApiError(400, f"{where}[{i}].type: {kind!r} blocks are not supported by this server (text only; "
                           "it does not parse tool use out of answers)", param=f"{where}[{i}].type",
                           code="unsupported_value")
        texts.append(block.get("text", ""))
    return "\n".join(texts)


def chat_body(body):
    """The chat request a Messages request stands for."""
    if body.get("tools"):
        raise ApiError(400, "tools: this server does not parse tool use out of answers on /v1/messages",
                       param="tools", code="unsupported_value")
    llama_fields.refuse_logprobs(body, "/v1/messages")
    messages = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"], "system")})
    for i, m in enumerate(body["messages"]):
        messages.append({"role": m["role"], "content": _text(m.get("content"), f"messages[{i}].content")})
    out = {k: v for k, v in body.items() if k not in ("system", "messages", "max_tokens", "stop_sequences",
                                                       "stream", "metadata", "thinking", "tool_choice",
                                                       "service_tier", "output_format")}
    fmt = body.get("output_format")
    if fmt is not None:
        # Anthropic's structured outputs: {"type": "json_schema", "schema": {...}}.
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "output_format: expected {\"type\": \"json_schema\", \"schema\": {...}}",
                           param="output_format", code="invalid_value")
        out["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}
    # The answer's text as the model wrote it: thinking blocks are not split out here.
    out.update(messages=messages, max_completion_tokens=body["max_tokens"], stop=body.get("stop_sequences"),
               stream=bool(body.get("stream")), reasoning_format="none")
    return out


def _message(answer, text, stats, stop_sequence=None):
    usage = {"input_tokens": stats.prompt_tokens - stats.prompt_reused if stats else 0,
             "cache_read_input_tokens": stats.prompt_reused if stats else 0,
             "output_tokens": stats.decode_tokens if stats else 0}
    out = {"id": answer.msg_id, "type": "message", "role": "assistant", "model": answer.model,
           "content": [{"type": "text", "text": text}] if text is not None else [],
           "stop_reason": STOP.get(stats.stop_reason, "end_turn") if stats else None,
           "stop_sequence": stop_sequence, "usage": usage}
    if stats is not None:
        out["timings"] = shapes.profile.timings(stats)
    if answer.warnings:
        out["warnings"] = list(answer.warnings)
    return out


def _stop_sequence(body, stats):
    # Which stop sequence ended the answer is not recorded; with one given it is that one.
    stops = body.get("stop_sequences") or []
    return stops[0] if stats.stop_reason == "stop_sequence" and len(stops) == 1 else None


@bp.post("/v1/messages")
def messages():
    """An Anthropic Messages answer (streamed as named events with ``stream``)."""
    body = read_body()
    answer = chat_of(body, "messages.request.json", chat_body, "messages")
    answer.msg_id = shapes.new_id("msg", "_")
    if body.get("stream"):
        return stream(_events(body, answer), answer, done=False, encode=sse.encode_named)
    with answer:
        text = answer.text()
    return jsonify(_message(answer, text, answer.stats, _stop_sequence(body, answer.stats)))


def _events(body, answer):
    start = _message(answer, None, None)
    start["usage"]["input_tokens"] = 0
    yield "message_start", {"type": "message_start", "message": start}
    yield "content_block_start", {"type": "content_block_start", "index": 0,
                                  "content_block": {"type": "text", "text": ""}}
    yield "ping", {"type": "ping"}
    for ev in answer.events():
        if isinstance(ev, tasks.Piece) and ev.text:
            yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": ev.text}}
    stats = answer.stats
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield "message_delta", {"type": "message_delta",
                            "delta": {"stop_reason": STOP.get(stats.stop_reason, "end_turn"),
                                      "stop_sequence": _stop_sequence(body, stats)},
                            "usage": {"input_tokens": stats.prompt_tokens - stats.prompt_reused,
                                      "cache_read_input_tokens": stats.prompt_reused,
                                      "output_tokens": stats.decode_tokens},
                            "timings": shapes.profile.timings(stats)}
    yield "message_stop", {"type": "message_stop"}


@bp.post("/v1/messages/count_tokens")
def count_tokens():
    """``{"input_tokens": n}``: the prompt the chat template makes of the request."""
    body = read_body()
    validate(body, "messages_count.request.json")
    chat = chat_body({**body, "max_tokens": 1})
    a = answerer()
    target, _ = a.target(chat)
    msgs, _ = chat_messages(chat["messages"], target, False)
    data, _, _ = a.result(chat, tasks.TemplateTask(msgs, template_kwargs=body.get("chat_template_kwargs")), cancel())
    tokens, _, _ = a.result(chat, tasks.TokenizeTask(data["prompt"], add_special=True), cancel())
    return jsonify({"input_tokens": len(tokens["tokens"])})
