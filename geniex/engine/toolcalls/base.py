"""What every tool-call family shares: the call record, the family interface and the
JSON helpers the families parse with.

A family knows where a call opens in the answer's text (:meth:`Family.find_opening`),
how much of a text's end might be the start of an opening (:meth:`Family.hold`, so a
stream holds back only that), and how to read the call(s) at an opening
(:meth:`Family.scan`). The stream parser (:mod:`.parser`) drives them the same way
for every family, streamed or not.
"""
import json
import uuid
from dataclasses import dataclass


class ParseError(ValueError):
    """The text at a call's opening is not a call of this family: the answer keeps it as
    content (never an error status)."""


@dataclass
class ToolCall:
    """One parsed call: the function's name and its arguments as a JSON string (OpenAI's
    ``function.arguments``), with an id (``call_...`` unless the model wrote one)."""

    name: str
    arguments: str
    id: str = ""

    def __post_init__(self):
        if not self.id:
            self.id = "call_" + uuid.uuid4().hex[:24]

    def openai(self):
        """OpenAI's ``tool_calls`` item."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


_DECODER = json.JSONDecoder()


def read_json(text, at=0, final=False, inside="its JSON"):
    """``(value, end)`` of the JSON value starting at ``text[at:]`` after whitespace;
    None when the text ends before the value does (more may come), unless ``final``
    (the answer is whole): then ParseError saying the answer ends ``inside`` it;
    ParseError when it cannot be JSON."""
    got = _read_json(text, at)
    if got is None and final:
        raise ParseError(f"the answer ends inside {inside}")
    return got


def _read_json(text, at):
    n = len(text)
    while at < n and text[at].isspace():
        at += 1
    if at >= n:
        return None
    try:
        value, end = _DECODER.raw_decode(text, at)
    except json.JSONDecodeError as e:
        # A value cut short fails at (or past) the end of the text; an error before the
        # end is in the text itself.
        if e.pos >= n - 1 or _incomplete(text[at:]):
            return None
        raise ParseError(f"not JSON: {e.msg}") from None
    return value, end


def _incomplete(text):
    """True when ``text`` is a JSON prefix whose brackets and strings are still open."""
    depth, in_string, escape = 0, False, False
    for c in text:
        if in_string:
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
    return in_string or depth > 0


def arguments_text(value):
    """A call's arguments as OpenAI sends them: a JSON string of an object (a string the
    model wrote is kept as it is when it is JSON already)."""
    if isinstance(value, str):
        try:
            json.loads(value)
            return value
        except ValueError:
            return json.dumps(value, ensure_ascii=False)
    if value is None:
        value = {}
    return json.dumps(value, ensure_ascii=False)


def call_from_object(obj, args_keys=("arguments", "parameters")):
    """A ToolCall from ``{"name": ..., "arguments"|"parameters": ...}`` (also OpenAI's
    ``{"function": {...}}`` wrapping); ParseError for anything else."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ParseError("a call needs a name")
    args = next((obj[k] for k in args_keys if k in obj), {})
    if not isinstance(args, (dict, str)):
        raise ParseError("a call's arguments must be an object")
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else ""
    return ToolCall(obj["name"], arguments_text(args), call_id)


def partial_suffix(text, marker):
    """Length of the longest end of ``text`` that is a proper beginning of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class Family:
    """A tool-call format. ``openings`` start a call anywhere in the answer; an
    ``anchored`` family's call is the answer itself (JSON from its first character)."""

    name = "base"
    openings = ()
    anchored = False

    def find_opening(self, text, at_start):
        """Index in ``text`` where a call opens, or None. ``at_start``: nothing but
        whitespace came before ``text`` in the answer."""
        best = None
        for marker in self.openings:
            i = text.find(marker)
            if i >= 0 and (best is None or i < best):
                best = i
        if best is None and self.anchored and at_start:
            stripped = text.lstrip()
            if stripped.startswith("{") or stripped.startswith("```"):
                best = 0                # the call's scan skips the whitespace before it
        return best

    def hold(self, text, at_start):
        """Index from which ``text`` must be held back: it might be the start of an
        opening the next piece completes."""
        if self.anchored and at_start and "```".startswith(text.strip()):
            return 0                    # whitespace, or the start of a code fence
        keep = max((partial_suffix(text, m) for m in self.openings), default=0)
        return len(text) - keep

    def scan(self, text, final):
        """Read the call(s) at the start of ``text`` (which starts at an opening):
        ``(calls, consumed)``, None when more text is needed (never when ``final``),
        or ParseError."""
        raise NotImplementedError
