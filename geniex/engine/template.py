"""A model's own Jinja chat template, rendered the way Hugging Face transformers does.

``tokenizer.chat_template`` in a GGUF is the template the model was trained with,
written for transformers' ``apply_chat_template``. This module renders it the same
way: Jinja2's ``ImmutableSandboxedEnvironment`` (a template cannot touch Python
objects or mutate its inputs) with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a no-op ``{% generation %}`` block, and the globals and
filters transformers adds: ``raise_exception``, ``strftime_now`` and its own
``tojson`` (no HTML escaping, non-ASCII kept, ``indent``/``separators``/``sort_keys``).

Two adjustments follow llama.cpp's server, the reference for "the same prompt"; each
is decided once per template by trial renders, as llama.cpp decides them:

- an assistant tool call's ``arguments`` arrive from OpenAI clients as a JSON
  *string*, while many templates print them with ``| tojson`` and expect an object: a
  template that renders object arguments but not string ones gets the string parsed;
- a template that has no system turn (it drops the system message or refuses it with
  ``raise_exception``, as Gemma-2's and some Mistral templates do) gets the system text
  at the start of the next user message (joined by a newline).
"""
import copy
import json
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from geniex.errors import GenieXError


class TemplateRefused(GenieXError):
    """The template called ``raise_exception``: it does not accept this conversation
    (alternating roles, a system message where none is allowed, ...). The client's to fix."""


class TemplateFailed(Exception):
    """The template could not be rendered for a reason other than ``raise_exception``
    (a Jinja error, a construct the sandbox forbids): the caller may fall back."""


class _Refusal(Exception):
    # Raised inside the template by raise_exception; turned into TemplateRefused.
    pass


def _raise_exception(message):
    raise _Refusal(str(message))


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: Jinja's own escapes <, >, & and ' for HTML, which a prompt
    # must not get, and it takes no separators.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses the
    block to mark assistant tokens for training masks; a prompt needs only the text)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def environment():
    """The sandboxed Jinja2 environment transformers renders chat templates in."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class JinjaTemplate:
    """One compiled chat template. Raises :class:`TemplateFailed` if it does not compile."""

    def __init__(self, source, bos_token="", eos_token=""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._compiled = environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateFailed(_describe(e)) from None
        self.object_arguments = self._requires_object_arguments()
        self.system_role = self._supports_system_role()

    def render(self, messages, add_generation_prompt=True, tools=None, extra=None):
        """The prompt text for ``messages`` (dicts as in an OpenAI chat request, with
        text content). ``tools`` are OpenAI tool definitions; ``extra`` more template
        variables (a request's ``chat_template_kwargs``)."""
        if self.object_arguments:
            messages = _object_arguments(messages)
        if not self.system_role:
            messages = _system_into_user(messages)
        context = dict(extra or {})
        context.update(messages=messages, tools=tools or None, documents=None,
                       add_generation_prompt=add_generation_prompt,
                       bos_token=self.bos_token, eos_token=self.eos_token)
        try:
            return self._compiled.render(**context)
        except _Refusal as e:
            raise TemplateRefused(f"the model's chat template refused the conversation: {e}") from None
        except RecursionError:
            raise TemplateFailed("the template recursed too deeply") from None
        except Exception as e:  # noqa: BLE001 - any failure inside the template is the template's
            raise TemplateFailed(_describe(e)) from None

    def _try_render(self, messages):
        try:
            return self._compiled.render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=False,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except Exception:  # noqa: BLE001 - a probe the template does not handle shows nothing
            return ""

    def _supports_system_role(self):
        needle = "<System Needle>"
        return needle in self._try_render([{"role": "system", "content": needle},
                                           {"role": "user", "content": "Hey"}])

    def _requires_object_arguments(self):
        # llama.cpp's capability probe: render one tool call with its arguments as a
        # JSON string and as an object, and see which shows the argument's key.
        def shows_needle(arguments):
            call = {"id": "call_1___", "type": "function",
                    "function": {"arguments": arguments, "name": "ipython"}}
            out = self._try_render([{"role": "user", "content": "Hey"},
                                    {"role": "assistant", "content": None, "tool_calls": [call]}])
            return '"argument_needle":' in out or "'argument_needle':" in out

        needle = {"argument_needle": "print('Hello, World!')"}
        as_string = shows_needle(json.dumps(needle, separators=(",", ":")))
        return not as_string and shows_needle(needle)


def _object_arguments(messages):
    """A copy of ``messages`` with tool-call arguments given as JSON strings parsed."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls:
            m = copy.deepcopy(m)
            for call in m["tool_calls"]:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass   # not JSON: the template gets the string as sent
        out.append(m)
    return out


def _system_into_user(messages):
    """System messages merged into the user message that follows them (or sent as a
    user message of their own when another role follows), as llama.cpp does for a
    template without a system turn."""
    out, pending = [], ""

    def flush():
        nonlocal pending
        if pending:
            out.append({"role": "user", "content": pending})
            pending = ""

    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            out.append(m)
            continue
        if m.get("role") == "system":
            pending = f"{pending}\n{content}" if pending else content
            continue
        if m.get("role") == "user" and pending:
            m = dict(m, content=pending + (f"\n{content}" if content else ""))
            pending = ""
        elif m.get("role") != "user":
            flush()
        out.append(m)
    flush()
    return out


def _describe(e):
    where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
    return f"{type(e).__name__}: {e}{where}"
