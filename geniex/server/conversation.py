"""One conversation core for the chat, Responses and Messages APIs.

Each agents' API converts its request into a chat request (``routes/responses.py``,
``routes/messages.py``), and everything after that is shared: :func:`read` turns a chat
request into a :class:`Conversation` (the template's messages, tools, reasoning and
continuation settings, checked before any model is touched), which makes the one
:class:`~geniex.engine.tasks.ChatTask` or :class:`~geniex.engine.tasks.TemplateTask`
every route runs (``/v1/messages/count_tokens`` and ``/apply-template`` see the prompt
an answer would); on the way out, :class:`Usage` holds the counts every API reports,
:mod:`geniex.engine.stops` names the stop reasons, and :func:`blocks` turns an answer's
events into the content blocks both agents' APIs stream.
"""
import logging
from dataclasses import dataclass, field

from geniex.engine import tasks
from geniex.engine.toolcalls import tools as agent
from geniex.errors import UsageError
from geniex.server import grammar_fields
from geniex.server.validation import ApiError

log = logging.getLogger("geniex.server")


@dataclass
class Conversation:
    """A chat request as the engine takes it (see :func:`read`)."""

    messages: list                       # as the template takes them
    warnings: list = field(default_factory=list)    # content parts that were dropped
    continue_final: bool = False
    add_generation_prompt: bool = True
    tools: list | None = None
    tool_choice: str | dict = "auto"
    parallel_tool_calls: bool = True
    reasoning_format: str = "none"
    template_kwargs: dict | None = None
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""

    def chat_task(self, options, streaming):
        """The task that answers the conversation."""
        return tasks.ChatTask(self.messages, options, tools=self.tools, template_kwargs=self.template_kwargs,
                              continue_final=self.continue_final,
                              add_generation_prompt=self.add_generation_prompt, streaming=streaming,
                              tool_choice=self.tool_choice, parallel_tool_calls=self.parallel_tool_calls,
                              reasoning_format=self.reasoning_format, reasoning_budget=self.reasoning_budget,
                              reasoning_budget_message=self.reasoning_budget_message)

    def template_task(self, tokens=False):
        """The task that renders the prompt an answer would see (``tokens``: and its
        token ids, tokenized as the answer's prompt is)."""
        return tasks.TemplateTask(self.messages, tools=self.tools, template_kwargs=self.template_kwargs,
                                  continue_final=self.continue_final,
                                  add_generation_prompt=self.add_generation_prompt, tool_choice=self.tool_choice,
                                  tokens=tokens)


def read(body, target, speculative, defaults):
    """The :class:`Conversation` of a schema-checked chat request answered by ``target``
    (``speculative``: with drafting, which is text-only); ``defaults`` are the server's
    (its reasoning format and budget). Bad values are 400s naming their field."""
    messages, warnings = chat_messages(body["messages"], target, speculative)
    continue_final, add_prompt = continuation(body, messages)
    return Conversation(messages, warnings, continue_final, add_prompt, **agent_fields(body, defaults))


def agent_fields(body, defaults):
    """The conversation's tools, tool_choice, parallel_tool_calls, reasoning_format,
    template kwargs and reasoning budget, checked (a 400 naming the field)."""
    try:
        tools = agent.check_tools(body.get("tools"))
        choice = agent.check_tool_choice(body.get("tool_choice"), tools)
        fmt = body.get("reasoning_format")
        fmt = agent.check_reasoning_format(defaults.reasoning_format if fmt is None else fmt)
        kwargs = agent.template_kwargs(body.get("chat_template_kwargs"), body.get("enable_think"))
        if defaults.reasoning != "auto" and "enable_thinking" not in (kwargs or {}):
            kwargs = {**(kwargs or {}), "enable_thinking": defaults.reasoning == "on"}     # serve --reasoning
    except UsageError as e:
        raise ApiError(400, str(e), param=e.param, code="invalid_value") from None
    if tools and choice not in ("auto", "none") and grammar_fields.constrained(body):
        raise ApiError(400, "tool_choice: a required or named tool choice constrains the answer to calls, so "
                       "it cannot be combined with response_format or a grammar", param="tool_choice",
                       code="invalid_value")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls: expected a boolean", param="parallel_tool_calls",
                       code="invalid_value")
    budget = body.get("thinking_budget_tokens")
    constrained = grammar_fields.constrained(body) or bool(tools) and choice not in ("auto", "none")
    if budget is None:
        # The server's default budget holds free answers only: a constrained one
        # (a grammar, a required call) is held by its grammar instead.
        budget = -1 if constrained else defaults.reasoning_budget
    elif budget >= 0 and constrained:
        raise ApiError(400, "thinking_budget_tokens: a reasoning budget cannot be combined with "
                       "response_format, a grammar or a required tool choice (the answer would be "
                       "constrained twice)", param="thinking_budget_tokens", code="invalid_value")
    return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel is not False,
            "reasoning_format": fmt, "template_kwargs": kwargs, "reasoning_budget": budget,
            "reasoning_budget_message": defaults.reasoning_budget_message}


def continuation(body, messages):
    """``(continue_final, add_generation_prompt)`` as llama.cpp's server decides them: a
    conversation ending with an assistant message is continued (assistant prefill);
    two trailing assistant messages, or ``continue_final_message`` with
    ``add_generation_prompt``, are refused."""
    add_prompt = body.get("add_generation_prompt")
    add_prompt = True if add_prompt is None else add_prompt
    final = body.get("continue_final_message")
    if not isinstance(add_prompt, bool) or (final is not None and not isinstance(final, bool)):
        bad = "add_generation_prompt" if not isinstance(add_prompt, bool) else "continue_final_message"
        raise ApiError(400, f"{bad}: expected a boolean", param=bad, code="invalid_value")
    last_is_assistant = bool(messages) and messages[-1]["role"] == "assistant"
    if final is None and last_is_assistant:
        if len(messages) >= 2 and messages[-2]["role"] == "assistant":
            raise ApiError(400, "messages: cannot have 2 or more assistant messages at the end of the list",
                           param="messages", code="invalid_value")
        return True, False
    if final and add_prompt:
        raise ApiError(400, "cannot set both add_generation_prompt and continue_final_message to true",
                       param="continue_final_message", code="invalid_value")
    if final and not last_is_assistant:
        raise ApiError(400, "continue_final_message: the last message is not an assistant message",
                       param="continue_final_message", code="invalid_value")
    return bool(final), add_prompt


def chat_messages(messages, target, speculative):
    """Request messages -> messages for the template (text ``content``; ``name``,
    ``tool_calls``, ``tool_call_id`` and an assistant's ``reasoning_content`` kept, as
    llama.cpp's server keeps them), and warnings about content that was dropped (the
    text path only)."""
    out, dropped = [], 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            texts = [p["text"] for p in content if p.get("type") == "text"]
            dropped += len(content) - len(texts)
            content = "\n".join(texts)
        role = "system" if m["role"] == "developer" else m["role"]
        # A missing or null content is an empty string, as llama.cpp's server gives it.
        msg = {"role": role, "content": content or ""}
        for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    warnings = []
    if dropped:
        if target.type == "vlm" and speculative:
            why = "speculative decoding is text-only"
        elif target.type == "vlm":
            why = "this server runs the text path only (no multimodal projector support)"
        else:
            why = f"{target.name} is a text-only model"
        warnings.append(f"{why}: dropped {dropped} image/audio content part(s)")
        log.warning("%s", warnings[-1])
    return out, warnings


# -- tools of the agents' APIs ------------------------------------------------------------
def function_tools(tools, kinds, fields, refused):
    """An agents' API's client ``tools`` as chat's function tools: a tool whose ``type``
    is one of ``kinds`` becomes ``{"type": "function", "function": {...}}`` with
    ``fields`` mapping chat's names to the API's; any other type is a 400 naming it
    (``refused`` says why: a hosted tool runs on the API owner's side)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else "?"
        if kind not in kinds:
            raise ApiError(400, f"tools[{i}].type: {kind!r} {refused}", param=f"tools[{i}].type",
                           code="unsupported_value")
        out.append({"type": "function",
                    "function": {ours: tool[theirs] for ours, theirs in fields.items() if theirs in tool}})
    return out


def named_tool(name):
    """Chat's ``tool_choice`` naming one function."""
    return {"type": "function", "function": {"name": name}}


# -- what comes back ------------------------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    """The token counts every API reports, from an answer's Stats: the whole prompt,
    the part of it the KV cache already held, and the answer's tokens."""

    prompt: int
    cached: int
    output: int

    @classmethod
    def of(cls, stats):
        return cls(stats.prompt_tokens, stats.prompt_reused, stats.decode_tokens)

    @property
    def new_prompt(self):
        """Prompt tokens decoded for this answer (Anthropic's ``input_tokens``)."""
        return self.prompt - self.cached

    @property
    def total(self):
        return self.prompt + self.output


def blocks(events):
    """An answer's events as content blocks, the shape the Responses and Messages APIs
    stream: ``("open", kind)``, ``("delta", kind, text, piece)``, ``("close", kind)`` with
    ``kind`` ``"thinking"`` or ``"text"``, and ``("call", call)`` for each whole tool call
    (a block is closed before a call, and thinking before text). An answer with no text
    and no call is still one empty text block, as a whole answer gives it."""
    open_kind, answered = None, False
    for ev in events:
        if not isinstance(ev, tasks.Piece):
            continue
        for kind, text in (("thinking", ev.reasoning), ("text", ev.text)):
            if not text:
                continue
            if open_kind != kind:
                if open_kind is not None:
                    yield "close", open_kind
                yield "open", kind
                open_kind = kind
            yield "delta", kind, text, ev
        for call in ev.calls:
            if open_kind is not None:
                yield "close", open_kind
                open_kind = None
            yield "call", call
        answered = answered or bool(ev.text or ev.calls)
    if not answered and open_kind != "text":
        if open_kind is not None:
            yield "close", open_kind
        yield "open", "text"
        open_kind = "text"
    if open_kind is not None:
        yield "close", open_kind

