"""``POST /v1/messages`` (Anthropic's Messages API, what coding agents speak) and
``POST /v1/messages/count_tokens``, on the chat path: ``system`` and ``messages``
become chat messages (``tool_use`` blocks the assistant's tool calls, ``tool_result``
blocks tool turns), client ``tools`` the chat request's tools; the answer is a ``text``
content block and one ``tool_use`` block per call the model made (streamed as the
API's named events: message_start, content_block_start/delta/stop, message_delta,
message_stop). Server tools (web search, code execution, ...) are a 400 naming them:
they run on Anthropic's side.

Extended thinking (``thinking: {"type": "enabled", "budget_tokens": N}``) turns the
template's thinking switch on, holds the thoughts to N tokens (the reasoning budget of
:mod:`geniex.engine.think_budget`) and returns them as a ``thinking`` block before the
text; thinking blocks an agent sends back in assistant turns are dropped, as the chat
templates drop earlier turns' reasoning.
"""
import json

from flask import Blueprint, jsonify

from geniex.engine import stops
from geniex.server import conversation, llama_fields, shapes, sse
from geniex.server.conversation import Usage
from geniex.server.exchange import answerer, caller, chat_of, read_body, stream
from geniex.server.validation import ApiError, validate

bp = Blueprint("messages", __name__)


def _text(content, where):
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content or []):
        kind = block.get("type")
        if kind != "text":
            raise ApiError(400, f"{where}[{i}].type: {kind!r} blocks are not supported here (text only)",
                           param=f"{where}[{i}].type", code="unsupported_value")
        texts.append(block.get("text", ""))
    return "\n".join(texts)


def _turns(m, where):
    """One Messages turn as chat messages: a user turn's ``tool_result`` blocks become
    tool turns (before its text: they answer the previous turn's calls), an assistant
    turn's ``tool_use`` blocks its ``tool_calls``."""
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    texts, calls, results = [], [], []
    for i, block in enumerate(content or []):
        kind, at = block.get("type"), f"{where}[{i}]"
        if kind == "text":
            texts.append(block.get("text", ""))
        elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
            continue                   # earlier reasoning: the templates leave it out of the prompt
        elif kind == "tool_use" and m["role"] == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                    or not isinstance(block.get("input"), dict):
                raise ApiError(400, f"{at}: a tool_use block needs a string id and name and an input object",
                               param=at, code="invalid_value")
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
        elif kind == "tool_result" and m["role"] == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise ApiError(400, f"{at}.tool_use_id: a tool_result block needs the tool_use id it answers",
                               param=f"{at}.tool_use_id", code="invalid_value")
            text = _text(block.get("content") or "", f"{at}.content")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": "Error: " + text if block.get("is_error") else text})
        else:
            raise ApiError(400, f"{at}.type: {kind!r} blocks are not supported in a {m['role']} turn here (text, "
                           "tool_use from the assistant, tool_result from the user)", param=f"{at}.type",
                           code="unsupported_value")
    turn = [{"role": m["role"], "content": "\n".join(texts), **({"tool_calls": calls} if calls else {})}]
    return results + (turn if texts or calls or not results else [])


def _tools(tools):
    """Client tools (``{"name", "description", "input_schema"}``) as chat tools; a
    server tool (one with a ``type`` other than ``custom``) is a 400 naming it."""
    return conversation.function_tools(
        tools, (None, "custom"), {"name": "name", "description": "description", "parameters": "input_schema"},
        "is a server tool that runs on Anthropic's side; this server offers client tools only")


def _thinking(thinking):
    """``thinking``: None when absent, False for ``{"type": "disabled"}`` (the template's
    thinking switch off), else the reasoning budget in tokens: ``budget_tokens`` of
    ``{"type": "enabled"}``, -1 (no limit) for ``{"type": "adaptive"}``."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return -1
    budget = thinking.get("budget_tokens") if kind == "enabled" else None
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise ApiError(400, "thinking: expected {\"type\": \"enabled\", \"budget_tokens\": N} (N >= 0), "
                       "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}", param="thinking",
                       code="invalid_value")
    return budget


# Anthropic's tool_choice types -> chat's.
CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def _tool_choice(choice):
    """``(tool_choice, parallel_tool_calls)`` as chat takes them."""
    if choice is None:
        return None, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        chat = conversation.named_tool(choice.get("name"))
    elif kind in CHOICE:
        chat = CHOICE[kind]
    else:
        raise ApiError(400, "tool_choice.type: expected auto, any, tool or none", param="tool_choice.type",
                       code="invalid_value")
    return chat, (False if choice.get("disable_parallel_tool_use") else None)


def chat_body(body):
    """The chat request a Messages request stands for."""
    llama_fields.refuse_logprobs(body, "/v1/messages")
    messages = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"], "system")})
    for i, m in enumerate(body["messages"]):
        messages.extend(_turns(m, f"messages[{i}].content"))
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
    out["tools"] = _tools(body.get("tools"))
    out["tool_choice"], out["parallel_tool_calls"] = _tool_choice(body.get("tool_choice"))
    thinking = _thinking(body.get("thinking"))
    if thinking is False:
        out["enable_think"] = False
    elif thinking is not None:
        if out["tool_choice"] not in (None, "auto", "none") or fmt is not None:
            # As Anthropic's API: thinking and a forced tool use or structured output exclude each other.
            raise ApiError(400, "thinking: extended thinking cannot be combined with tool_choice any or tool, or "
                           "with output_format", param="thinking", code="invalid_value")
        out["enable_think"] = True
        out["thinking_budget_tokens"] = thinking
    # Without extended thinking the answer's text is as the model wrote it; with it the
    # thoughts are split out into a thinking block.
    out.update(messages=messages, max_completion_tokens=body["max_tokens"], stop=body.get("stop_sequences"),
               stream=bool(body.get("stream")), reasoning_format="none" if thinking in (None, False) else "deepseek")
    return out


def _tool_use(call):
    """A ``tool_use`` content block of a chat ``tool_calls`` item."""
    fn = call["function"]
    return {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": json.loads(fn["arguments"] or "{}")}


def _usage(stats):
    # Anthropic counts the prompt tokens read from the cache apart from the others.
    counts = Usage.of(stats) if stats is not None else Usage(0, 0, 0)
    return {"input_tokens": counts.new_prompt, "cache_read_input_tokens": counts.cached,
            "output_tokens": counts.output}


def _message(msg_id, answer, text, stats, stop_sequence=None, calls=(), thinking=""):
    # A thinking block has no signature here: nothing signs a local model's thoughts.
    out = {"id": msg_id, "type": "message", "role": "assistant", "model": answer.model,
           "content": ([{"type": "thinking", "thinking": thinking, "signature": ""}] if thinking else [])
           + ([{"type": "text", "text": text}] if text is not None and (text.strip() or not calls) else [])
           + [_tool_use(c) for c in calls],
           "stop_reason": stops.stop_reason(stats.stop_reason, bool(calls)) if stats else None,
           "stop_sequence": stop_sequence, "usage": _usage(stats)}
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
    msg_id = shapes.new_id("msg", "_")
    if body.get("stream"):
        return stream(_events(body, msg_id, answer), answer, done=False, encode=sse.encode_named, error=error_event)
    with answer:
        text = answer.text()
    return jsonify(_message(msg_id, answer, text, answer.stats, _stop_sequence(body, answer.stats), answer.calls,
                            "".join(answer.reasoning)))


def error_event(err):
    """A failure mid-stream as Anthropic's ``error`` event (its error types by status)."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}.get(err.status, "api_error")
    return "error", {"type": "error", "error": {"type": kind, "message": err.message}}


def _events(body, msg_id, answer):
    """The answer as Anthropic streams it: its content blocks
    (:func:`~geniex.server.conversation.blocks`: a thinking block first with extended
    thinking, text, a tool_use block per call with its input in one
    ``input_json_delta``: a call is sent once read whole), then the stop reason and
    usage."""
    start = _message(msg_id, answer, None, None)
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    index = 0
    for block in conversation.blocks(answer.events()):
        what = block[0]
        if what == "open":
            empty = {"type": "thinking", "thinking": "", "signature": ""} if block[1] == "thinking" else \
                {"type": "text", "text": ""}
            yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}
        elif what == "delta":
            delta = {"type": "thinking_delta", "thinking": block[2]} if block[1] == "thinking" else \
                {"type": "text_delta", "text": block[2]}
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        elif what == "close":
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
            index += 1
        else:
            use = _tool_use(block[1])
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {**use, "input": {}}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(use["input"])}
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
            index += 1
    stats = answer.stats
    yield "message_delta", {"type": "message_delta",
                            "delta": {"stop_reason": stops.stop_reason(stats.stop_reason, bool(answer.calls)),
                                      "stop_sequence": _stop_sequence(body, stats)},
                            "usage": _usage(stats), "timings": shapes.profile.timings(stats)}
    yield "message_stop", {"type": "message_stop"}


@bp.post("/v1/messages/count_tokens")
def count_tokens():
    """``{"input_tokens": n}``: the prompt tokens an answer to the request would read
    (the chat template's prompt, tokenized as an answer's is)."""
    body = read_body()
    validate(body, "messages_count.request.json")
    chat = chat_body({**body, "max_tokens": 1})
    validate(chat, "chat_completions.request.json")
    a = answerer()
    data, _, _ = a.result(chat, a.conversation(chat).template_task(tokens=True), caller())
    return jsonify({"input_tokens": len(data["tokens"])})
