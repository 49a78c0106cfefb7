"""``POST /v1/responses``: OpenAI's Responses API (what coding agents speak), on the chat
path: ``instructions`` and ``input`` become chat messages, the answer comes back as one
``message`` output item with ``output_text`` (streamed as the API's named events).

Tool calls are not parsed out of answers here: a request carrying function-call items
is a 400 naming them, rather than an answer that drops them.
"""
import time

from flask import Blueprint, jsonify

from geniex.engine import tasks
from geniex.server import llama_fields, shapes, sse
from geniex.server.exchange import chat_of, read_body, stream
from geniex.server.validation import ApiError

bp = Blueprint("responses", __name__)

TEXT_PARTS = ("input_text", "output_text", "text")


def chat_body(body):
    """The chat request a Responses request stands for."""
    messages = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    else:
        for i, item in enumerate(raw or []):
            kind = item.get("type", "message")
            if kind != "message":
                raise ApiError(400, f"input[{i}].type: {kind!r} items are not supported by this server (it does "
                               "not parse tool calls out of answers); send message items", param=f"input[{i}].type",
                               code="unsupported_value")
            content = item.get("content")
            if isinstance(content, list):
                content = [{"type": "text", "text": p.get("text", "")} if p.get("type") in TEXT_PARTS else p
                           for p in content]
            messages.append({"role": item.get("role", "user"), "content": content})
    out = {k: v for k, v in body.items() if k not in ("input", "instructions", "max_output_tokens", "stream",
                                                       "text", "store", "reasoning", "truncation", "metadata",
                                                       "previous_response_id", "include", "user")}
    if body.get("previous_response_id"):
        raise ApiError(400, "previous_response_id: this server keeps no responses; send the whole conversation "
                       "in input", param="previous_response_id", code="unsupported_value")
    if "message.output_text.logprobs" in (body.get("include") or []):
        raise ApiError(400, "include: message.output_text.logprobs: token log-probabilities are not reported on "
                       "/v1/responses; ask /v1/chat/completions (logprobs, top_logprobs)", param="include",
                       code="unsupported_value")
    llama_fields.refuse_logprobs(body, "/v1/responses")
    if body.get("tools"):
        raise ApiError(400, "tools: this server does not parse tool calls out of answers on /v1/responses",
                       param="tools", code="unsupported_value")
    out["messages"] = messages
    fmt = text_format(body)
    if fmt is not None:
        out["response_format"] = fmt
    out["reasoning_format"] = "none"    # the answer's text as the model wrote it
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    out["stream"] = bool(body.get("stream"))
    return out


def text_format(body):
    """``text.format`` as the chat request's ``response_format`` (None: free text); the
    Responses API puts a json_schema format's name, schema and strict beside its type."""
    text = body.get("text")
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "text.format.schema: a json_schema format needs a schema object",
                           param="text.format.schema", code="invalid_value")
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise ApiError(400, f"text.format.type: expected text, json_object or json_schema, got {kind!r}",
                   param="text.format.type", code="invalid_value")


def _echo_format(body):
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    return fmt if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema") else {"type": "text"}


def _usage(stats):
    return {"input_tokens": stats.prompt_tokens, "input_tokens_details": {"cached_tokens": stats.prompt_reused},
            "output_tokens": stats.decode_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": stats.prompt_tokens + stats.decode_tokens}


class _Response:
    """One response object as it grows (ids, creation time, its message item)."""

    def __init__(self, body, model):
        self.id = shapes.new_id("resp", "_")
        self.msg_id = shapes.new_id("msg", "_")
        self.created = int(time.time())
        self.body = body
        self.model = model

    def message(self, text, status):
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}] if status else []}

    def object(self, status, output=(), stats=None, warnings=()):
        incomplete = stats is not None and shapes.finish_reason(stats.stop_reason) == "length"
        obj = {"id": self.id, "object": "response", "created_at": self.created,
               "status": "incomplete" if incomplete else status, "model": self.model, "output": list(output),
               "error": None, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
               "instructions": self.body.get("instructions"), "max_output_tokens": self.body.get("max_output_tokens"),
               "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
               "temperature": self.body.get("temperature"), "top_p": self.body.get("top_p"),
               "text": {"format": _echo_format(self.body)}, "metadata": {},
               "usage": _usage(stats) if stats is not None else None}
        if stats is not None:
            obj["timings"] = shapes.profile.timings(stats)
        if warnings:
            obj["warnings"] = list(warnings)
        return obj


@bp.post("/v1/responses")
@bp.post("/responses")
def responses():
    """A Responses API answer (streamed as named events with ``stream``)."""
    body = read_body()
    answer = chat_of(body, "responses.request.json", chat_body, "input")
    resp = _Response(body, answer.model)
    if body.get("stream"):
        return stream(_events(resp, answer), answer, done=False, encode=sse.encode_named)
    with answer:
        text = answer.text()
    return jsonify(resp.object("completed", [resp.message(text, "completed")], answer.stats, answer.warnings))


def _events(resp, answer):
    seq = iter(range(1 << 30))

    def event(kind, **fields):
        return kind, {"type": kind, "sequence_number": next(seq), **fields}

    yield event("response.created", response=resp.object("in_progress"))
    yield event("response.in_progress", response=resp.object("in_progress"))
    yield event("response.output_item.added", output_index=0, item=resp.message("", ""))
    part = {"type": "output_text", "text": "", "annotations": []}
    yield event("response.content_part.added", item_id=resp.msg_id, output_index=0, content_index=0, part=part)
    text = []
    for ev in answer.events():
        if isinstance(ev, tasks.Piece) and ev.text:
            text.append(ev.text)
            yield event("response.output_text.delta", item_id=resp.msg_id, output_index=0, content_index=0,
                        delta=ev.text, logprobs=[], **shapes.extras(ev))
    whole = "".join(text)
    yield event("response.output_text.done", item_id=resp.msg_id, output_index=0, content_index=0, text=whole,
                logprobs=[])
    yield event("response.content_part.done", item_id=resp.msg_id, output_index=0, content_index=0,
                part={**part, "text": whole})
    item = resp.message(whole, "completed")
    yield event("response.output_item.done", output_index=0, item=item)
    final = resp.object("completed", [item], answer.stats, answer.warnings)
    yield event("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)
