"""Hermes 2/3 Pro, Qwen 2.5, Qwen3 (and the many templates that copied them): each
call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, anywhere in the
answer, as many as the model writes. llama.cpp detects the family by ``<tool_call>``
in the template."""
from geniex.engine.toolcalls.base import Family, ParseError, call_from_object, read_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class Hermes(Family):
    name = "hermes"
    openings = (OPEN,)

    def scan(self, text, final):
        body = len(OPEN)
        end = text.find(CLOSE, body)
        if end >= 0:
            got = read_json(text[:end], body)
            if got is None or text[got[1]:end].strip():
                raise ParseError("a <tool_call> block holds one JSON object")
            return [call_from_object(got[0])], end + len(CLOSE)
        got = read_json(text, body)
        if got is None:
            if final:
                raise ParseError("the answer ends inside a <tool_call> block")
            return None
        rest = text[got[1]:]
        if rest.strip() and not CLOSE.startswith(rest.strip()):
            raise ParseError("text after a call's JSON inside <tool_call>")
        if not final:
            return None                 # the closing tag may still come
        # The model stopped after the JSON without closing the block (an end-of-turn
        # token came first): the call is whole.
        return [call_from_object(got[0])], len(text)
