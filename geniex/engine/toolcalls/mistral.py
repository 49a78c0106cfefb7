"""Mistral: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments", "id"}``
(Mistral Nemo, Small 3), or ``[TOOL_CALLS]name[ARGS]{...}`` per call (the newer
templates). llama.cpp detects the family by ``[TOOL_CALLS]`` in the template. An id
the model wrote (Mistral's templates want nine letters and digits back) is kept."""
import re

from geniex.engine.toolcalls.base import Family, ParseError, ToolCall, arguments_text, call_from_object, read_json

OPEN = "[TOOL_CALLS]"
_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")


class Mistral(Family):
    name = "mistral"
    openings = (OPEN,)

    def scan(self, text, final):
        at = len(OPEN)
        rest = text[at:]
        if not rest.strip():
            if final:
                raise ParseError("nothing after [TOOL_CALLS]")
            return None
        if rest.lstrip().startswith("["):
            got = read_json(text, at, final, "the call list")
            if got is None:
                return None
            items, end = got
            if not isinstance(items, list) or not items:
                raise ParseError("[TOOL_CALLS] is followed by a list of calls")
            return [call_from_object(item) for item in items], end
        m = _NAMED.match(rest)
        if m is None:
            if final or len(rest) > 256 or not re.fullmatch(r"\s*[A-Za-z0-9_.\-]*(\[[A-Z_]*\]?[A-Za-z0-9]*)*", rest):
                raise ParseError("[TOOL_CALLS] is followed by neither a list nor name[ARGS]")
            return None
        got = read_json(text, at + m.end())
        if got is None:
            if final:
                raise ParseError("the answer ends inside a call's arguments")
            return None
        args, end = got
        if not isinstance(args, dict):
            raise ParseError("a call's arguments must be an object")
        return [ToolCall(m.group(1), arguments_text(args), m.group(2) or "")], end
