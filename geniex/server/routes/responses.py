"""``POST /v1/responses``: OpenAI's Responses API (what coding agents speak), on the chat
path: ``instructions`` and ``input`` become chat messages (``function_call`` and
``function_call_output`` items the assistant's tool calls and the tool turns), function
``tools`` the chat request's tools; the answer comes back as a ``message`` output item
with ``output_text`` and one ``function_call`` item per call the model made (streamed as
the API's named events). Hosted tools (web search, file search, ...) are a 400 naming
them: they run on OpenAI's side.
"""
import time

from flask import Blueprint, jsonify

from geniex.engine import stops
from geniex.server import conversation, llama_fields, shapes, sse
from geniex.server.conversation import Usage
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
            _add_item(messages, item, i)
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
    reasoning = body.get("reasoning")
    if reasoning and any(reasoning.get(k) not in (None, "none") for k in ("effort", "summary", "generate_summary")):
        raise ApiError(400, "reasoning: reasoning effort and summaries are not supported on /v1/responses; leave "
                       "them out (a model that reasons writes its thoughts in the output text)", param="reasoning",
                       code="unsupported_value")
    out["tools"] = _tools(body.get("tools"))
    out["tool_choice"] = _tool_choice(body.get("tool_choice"))
    out["messages"] = messages
    fmt = text_format(body)
    if fmt is not None:
        out["response_format"] = fmt
    out["reasoning_format"] = "none"    # the answer's text as the model wrote it
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    out["stream"] = bool(body.get("stream"))
    return out


def _add_item(messages, item, i):
    """One ``input`` item onto the chat ``messages``: a message; a ``function_call``
    (joined to the assistant turn it follows, as chat holds an answer's text and calls
    in one message); a ``function_call_output`` as a tool turn."""
    kind = item.get("type", "message")
    if kind == "message":
        content = item.get("content")
        if isinstance(content, list):
            content = [{"type": "text", "text": p.get("text", "")} if p.get("type") in TEXT_PARTS else p
                       for p in content]
        messages.append({"role": item.get("role", "user"), "content": content})
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise ApiError(400, f"input[{i}].{key}: a function_call item needs a string {key}",
                               param=f"input[{i}].{key}", code="invalid_value")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = "\n".join(p.get("text", "") for p in output if isinstance(p, dict) and p.get("type") in TEXT_PARTS)
        if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
            raise ApiError(400, f"input[{i}]: a function_call_output item needs a string call_id and output",
                           param=f"input[{i}]", code="invalid_value")
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
    else:
        raise ApiError(400, f"input[{i}].type: {kind!r} items are not supported by this server; send message, "
                       "function_call and function_call_output items", param=f"input[{i}].type",
                       code="unsupported_value")


def _tools(tools):
    """Function ``tools`` (``{"type": "function", "name", "description", "parameters"}``)
    as the chat request's; anything else is a 400 naming it."""
    return conversation.function_tools(
        tools, ("function",), {k: k for k in ("name", "description", "parameters", "strict")},
        "tools run on OpenAI's side; this server offers function tools only")


def _tool_choice(choice):
    """``tool_choice`` as chat takes it: ``{"type": "function", "name"}`` names its
    function one level up."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return conversation.named_tool(choice.get("name"))
    raise ApiError(400, "tool_choice: expected none, auto, required or {\"type\": \"function\", \"name\": ...}",
                   param="tool_choice", code="unsupported_value")


def text_format(body):
    """``text.format`` as the chat request's ``response_format`` (None: free text); the
    Responses API puts a json_schema format's name, schema and strict beside its type."""
    text = body.get("text")
    if text is None:
        return None
    if isinstance(text, dict) and text.get("verbosity") not in (None, "medium"):
        raise ApiError(400, "text.verbosity: answer verbosity cannot be set: only the default (medium) is accepted",
                       param="text.verbosity", code="unsupported_value")
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
    counts = Usage.of(stats)
    return {"input_tokens": counts.prompt, "input_tokens_details": {"cached_tokens": counts.cached},
            "output_tokens": counts.output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts.total}


class _Response:
    """One response object as it grows (ids, creation time, its output items)."""

    def __init__(self, body, model):
        self.id = shapes.new_id("resp", "_")
        self.created = int(time.time())
        self.body = body
        self.model = model

    @staticmethod
    def message(text, status, msg_id=None):
        """A ``message`` output item (no content while in progress)."""
        return {"type": "message", "id": msg_id or shapes.new_id("msg", "_"), "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}] if status else []}

    @staticmethod
    def call(call, status="completed"):
        """A ``function_call`` output item of a chat ``tool_calls`` item (its id is the
        ``call_id`` the client answers with a ``function_call_output``)."""
        fn = call["function"]
        return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
                "name": fn["name"], "arguments": fn["arguments"] if status == "completed" else "", "status": status}

    def output(self, text, calls):
        """The output items of a whole answer: its text (unless it is only calls), then its calls."""
        items = [self.message(text, "completed")] if text.strip() or not calls else []
        return items + [self.call(c) for c in calls]

    def object(self, status, output=(), stats=None, warnings=()):
        incomplete = stats is not None and stops.cut_short(stats.stop_reason)
        obj = {"id": self.id, "object": "response", "created_at": self.created,
               "status": "incomplete" if incomplete else status, "model": self.model, "output": list(output),
               "error": None, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
               "instructions": self.body.get("instructions"), "max_output_tokens": self.body.get("max_output_tokens"),
               "parallel_tool_calls": self.body.get("parallel_tool_calls") is not False,
               "tool_choice": self.body.get("tool_choice") or "auto", "tools": list(self.body.get("tools") or []),
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
        events = _Events(resp)
        return stream(events.of(answer), answer, done=False, encode=sse.encode_named, error=events.error)
    with answer:
        text = answer.text()
    return jsonify(resp.object("completed", resp.output(text, answer.calls), answer.stats, answer.warnings))


class _Events:
    """The answer as the Responses API streams it, numbered in sequence: its content
    blocks (:func:`~geniex.server.conversation.blocks`) as a message item per text block
    and a function_call item per call (its arguments in one delta: a call is sent once
    read whole); a failure mid-stream as an ``error`` event."""

    def __init__(self, resp):
        self.resp = resp
        self._seq = iter(range(1 << 30))

    def event(self, kind, **fields):
        return kind, {"type": kind, "sequence_number": next(self._seq), **fields}

    def error(self, err):
        """A failure mid-stream as the API's ``error`` event."""
        return self.event("error", code=err.code, message=err.message, param=err.param)

    def of(self, answer):
        resp, event = self.resp, self.event
        items = []                      # the output items done so far
        msg_id, pieces = None, []       # the message being written
        yield event("response.created", response=resp.object("in_progress"))
        yield event("response.in_progress", response=resp.object("in_progress"))
        for block in conversation.blocks(answer.events()):
            what, at = block[0], len(items)
            if what == "call":
                item = resp.call(block[1])
                ids = dict(item_id=item["id"], output_index=at)
                yield event("response.output_item.added", output_index=at, item=resp.call(block[1], "in_progress"))
                yield event("response.function_call_arguments.delta", **ids, delta=item["arguments"])
                yield event("response.function_call_arguments.done", **ids, name=item["name"],
                            arguments=item["arguments"])
                yield event("response.output_item.done", output_index=at, item=item)
                items.append(item)
            elif block[1] != "text":
                continue                # the Responses API answers with the text as written (no thinking)
            elif what == "open":
                msg_id, pieces = shapes.new_id("msg", "_"), []
                yield event("response.output_item.added", output_index=at, item=resp.message("", "", msg_id))
                yield event("response.content_part.added", item_id=msg_id, output_index=at, content_index=0,
                            part={"type": "output_text", "text": "", "annotations": []})
            elif what == "delta":
                pieces.append(block[2])
                yield event("response.output_text.delta", item_id=msg_id, output_index=at, content_index=0,
                            delta=block[2], logprobs=[], **shapes.extras(block[3]))
            else:
                whole = "".join(pieces)
                ids = dict(item_id=msg_id, output_index=at, content_index=0)
                yield event("response.output_text.done", **ids, text=whole, logprobs=[])
                yield event("response.content_part.done", **ids,
                            part={"type": "output_text", "text": whole, "annotations": []})
                item = resp.message(whole, "completed", msg_id)
                yield event("response.output_item.done", output_index=at, item=item)
                items.append(item)
        final = resp.object("completed", items, answer.stats, answer.warnings)
        yield event("response.completed" if final["status"] == "completed" else "response.incomplete",
                    response=final)
