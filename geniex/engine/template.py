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

A template comes from the model file, so it is rendered in a bounded sandbox on top of
Jinja's: each render (and the compile and the capability probes) must end within
:data:`RENDER_SECONDS` (a trace function checks the clock on every line run, so a loop
that prints nothing still ends), its output and every value it builds stay under
:data:`MAX_TEXT` characters (checked as output streams out, at every call, filter,
operator and namespace assignment, before anything larger is allocated where the size
can be known first), and the source itself is at most :data:`MAX_SOURCE` characters.
Crossing a bound is :class:`TemplateLimit`, a clear error, never a hang or a crash.
"""
import copy
import functools
import json
import math
import re
import sys
import time
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from geniex.errors import GenieXError

RENDER_SECONDS = 5.0        # one render, one compile or one probe
MAX_TEXT = 16 << 20         # characters of output, and of any one value built on the way
MAX_SOURCE = 1 << 20        # characters of template source (real ones are < 100k)
MAX_POWER_BITS = 1 << 16    # the size of an integer ``**`` may make
TEMPLATE_FILE = "<template>"  # the file name Jinja gives code compiled from a string


class TemplateRefused(GenieXError):
    """The template called ``raise_exception``: it does not accept this conversation
    (alternating roles, a system message where none is allowed, ...). The client's to fix."""


class TemplateFailed(Exception):
    """The template could not be rendered for a reason other than ``raise_exception``
    (a Jinja error, a construct the sandbox forbids): the caller may fall back."""


class TemplateLimit(GenieXError):
    """The template crossed one of the sandbox's bounds (time, output or value size,
    source size): the model's template is broken or hostile."""


class _OutOfTime(BaseException):
    # Raised by the trace function inside the template's frames. A BaseException, so no
    # ``except Exception`` in Jinja's runtime or a filter can swallow it and go on.
    pass


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


def _too_big(what, n):
    return TemplateLimit(f"the model's chat template {what} of {n:,} characters (geniex allows "
                         f"{MAX_TEXT:,}); it is broken or hostile")


def _size(value):
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


def _bounded(value, what="built a value"):
    n = _size(value)
    if n > MAX_TEXT:
        raise _too_big(what, n)
    return value


_LONG_NUMBER = re.compile(r"\d{8,}")


def _check_format(fmt):
    """A ``%`` or ``str.format`` pattern must not ask for a field wider than MAX_TEXT
    (``'%400000000d' % 1`` allocates that much at once)."""
    for m in _LONG_NUMBER.finditer(fmt):
        if int(m.group()) > MAX_TEXT:
            raise _too_big("asks for a field", int(m.group()))


def _check_args(args, kwargs):
    """No call from a template gets a number larger than any size it may build (widths,
    counts: ``center(10**9)``, ``lipsum(n=...)``, ``slice(...)``) or an oversized value."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_TEXT:
            raise _too_big("passes a size", abs(value))
        _bounded(value, "passes a value")


def _check_join(items, sep):
    if isinstance(items, (list, tuple, str)):
        n = sum(len(str(x)) for x in items) + len(str(sep)) * max(len(items) - 1, 0)
        if n > MAX_TEXT:
            raise _too_big("joins text", n)


def _check_replace(text, old, new):
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        hits = text.count(old) if old else len(text) + 1
        n = len(text) + hits * (len(new) - len(old))
        if n > MAX_TEXT:
            raise _too_big("replaces its way to text", n)


def _precheck(func, values, kwargs):
    """Results whose size is known before they are built: formats, joins, replacements
    (as str methods, or Jinja's ``join`` and ``replace`` filters)."""
    inner = getattr(func, "__wrapped__", func)      # the sandbox wraps str.format
    name, owner = getattr(inner, "__name__", ""), getattr(inner, "__self__", None)
    if isinstance(owner, str):
        if name in ("format", "format_map"):
            _check_format(owner)
        elif name == "join" and values:
            _check_join(values[0], owner)
        elif name == "replace" and len(values) >= 2:
            _check_replace(owner, values[0], values[1])
    elif name in ("do_join", "sync_do_join") and values:
        _check_join(values[0], values[1] if len(values) > 1 else kwargs.get("d", ""))
    elif name == "do_replace" and len(values) >= 3:
        _check_replace(*values[:3])
    elif name == "do_format" and values and isinstance(values[0], str):
        _check_format(values[0])


class _BoundedNamespace(Namespace):
    """``namespace()``, whose attributes cannot hold an oversized value (``{% set ns.s =
    ns.s ~ ns.s %}`` in a loop doubles a string each time)."""

    def __setitem__(self, name, value):
        super().__setitem__(name, _bounded(value, "stored a value"))


def _bounded_filter(func):
    @functools.wraps(func)    # keeps jinja_pass_arg: Jinja still passes the context first
    def run(*args, **kwargs):
        values = [a for a in args if not isinstance(a, (jinja2.runtime.Context, jinja2.nodes.EvalContext,
                                                       jinja2.Environment))]
        _check_args(values, kwargs)
        _precheck(func, values, kwargs)
        return _bounded(func(*args, **kwargs))
    return run


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with sizes bounded wherever a template can build a value."""

    intercepted_binops = frozenset(("*", "**", "+", "%"))

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(times, int) and _size(seq) * max(times, 0) > MAX_TEXT:
                raise _too_big("repeats text", _size(seq) * times)
        elif operator == "**":
            if (isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1
                    and right * math.log2(abs(left)) > MAX_POWER_BITS):
                raise TemplateLimit(f"the model's chat template computes {left} ** {right}, a number too large "
                                    "to build; it is broken or hostile")
        elif operator == "+":
            if _size(left) + _size(right) > MAX_TEXT:
                raise _too_big("joins text", _size(left) + _size(right))
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
        return _bounded(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's signature
        _check_args(args, kwargs)
        _precheck(__obj, args, kwargs)
        return _bounded(super().call(__context, __obj, *args, **kwargs))


def environment():
    """The sandboxed Jinja2 environment transformers renders chat templates in, with the
    bounds of this module (see the module doc)."""
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                              extensions=[_GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _BoundedNamespace
    return env


class _Deadline:
    """While active, every Python call in this thread and every line of the template's
    own code (a loop that prints nothing calls nothing) checks the clock, and past
    ``seconds`` raises _OutOfTime. The trace function is per thread: other threads (the
    server's other requests) run untraced."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __enter__(self):
        end = time.monotonic() + self.seconds

        def line(_frame, _event, _arg):
            if time.monotonic() > end:
                raise _OutOfTime()
            return line

        def call(frame, _event, _arg):
            if time.monotonic() > end:
                raise _OutOfTime()
            # Lines are traced in the template's code only: Jinja's runtime and the
            # filters loop over values the bounds above already limit.
            return line if frame.f_code.co_filename == TEMPLATE_FILE else None

        self._previous = sys.gettrace()
        sys.settrace(call)
        return self

    def __exit__(self, kind, exc, _tb):
        sys.settrace(self._previous)
        if kind is _OutOfTime:
            raise TemplateLimit(f"the model's chat template ran for more than {self.seconds:g} s "
                                "(an endless or enormous loop); it is broken or hostile") from None
        return False


class JinjaTemplate:
    """One compiled chat template. Raises :class:`TemplateFailed` if it does not compile,
    :class:`TemplateLimit` if it is larger than :data:`MAX_SOURCE` or crosses a bound
    while compiling or being probed."""

    def __init__(self, source, bos_token="", eos_token=""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        if len(source) > MAX_SOURCE:
            raise TemplateLimit(f"the model's chat template is {len(source):,} characters long (geniex "
                                f"compiles at most {MAX_SOURCE:,}); it is broken or hostile")
        try:
            with _Deadline(RENDER_SECONDS):
                self._compiled = environment().from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateFailed(_describe(e)) from None
        except RecursionError:
            raise TemplateFailed("the template nests too deeply to compile") from None
        self.object_arguments = self._requires_object_arguments()
        self.system_role = self._supports_system_role()
        self.tools = self._renders_tools()

    def render(self, messages, add_generation_prompt=True, tools=None, extra=None):
        """The prompt text for ``messages`` (dicts as in an OpenAI chat request, with
        text content). ``tools`` are OpenAI tool definitions; ``extra`` more template
        variables (a request's ``chat_template_kwargs``)."""
        if self.object_arguments:
            messages = _object_arguments(messages)
        if not self.system_role:
            messages = _system_into_user(messages)
        # The variables llama.cpp's server gives every template, under a request's own:
        # thinking on unless asked off (templates llama.cpp ships close a forced-open
        # block on `not enable_thinking`), and today's date where a template prints it
        # (Llama 3.x's date_string, FireFunction's datetime).
        now = datetime.now()
        context = {"enable_thinking": True, "date_string": now.strftime("%d %b %Y"),
                   "datetime": now.strftime("%b %d %Y %H:%M:%S GMT"), **(extra or {})}
        context.update(messages=messages, tools=tools or None, documents=None,
                       add_generation_prompt=add_generation_prompt,
                       bos_token=self.bos_token, eos_token=self.eos_token)
        try:
            return self._render(context)
        except (TemplateLimit, MemoryError) as e:
            if isinstance(e, MemoryError):
                raise TemplateLimit("the model's chat template ran out of memory; it is broken or hostile") from None
            raise
        except _Refusal as e:
            raise TemplateRefused(f"the model's chat template refused the conversation: {e}") from None
        except RecursionError:
            raise TemplateFailed("the template recursed too deeply") from None
        except Exception as e:  # noqa: BLE001 - any failure inside the template is the template's
            raise TemplateFailed(_describe(e)) from None

    def _render(self, context):
        """Render under the deadline, stopping as soon as the output passes MAX_TEXT."""
        parts, total = [], 0
        with _Deadline(RENDER_SECONDS):
            for chunk in self._compiled.generate(**context):
                total += len(chunk)
                if total > MAX_TEXT:
                    raise _too_big("renders text", total)
                parts.append(chunk)
        return "".join(parts)

    def _try_render(self, messages, tools=None):
        try:
            return self._render(dict(messages=messages, tools=tools, documents=None, add_generation_prompt=False,
                                     bos_token=self.bos_token, eos_token=self.eos_token))
        except TemplateLimit:
            raise
        except Exception:  # noqa: BLE001 - a probe the template does not handle shows nothing
            return ""

    def _supports_system_role(self):
        needle = "<System Needle>"
        return needle in self._try_render([{"role": "system", "content": needle},
                                           {"role": "user", "content": "Hey"}])

    def _renders_tools(self):
        # Whether the template shows the request's tools at all (llama.cpp's
        # supports_tools probe): a template that does not gets them described in a
        # system message instead (geniex.engine.toolcalls.tools).
        needle = "geniex_tool_needle"
        tool = {"type": "function", "function": {"name": needle, "description": "probe",
                                                 "parameters": {"type": "object", "properties": {}}}}
        return needle in self._try_render([{"role": "user", "content": "Hey"}], tools=[tool])

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
