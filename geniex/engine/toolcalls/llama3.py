"""Llama 3.1 / 3.2 / 3.3: a call is the whole answer as JSON ``{"name": ...,
"parameters": {...}}`` (``"type": "function"`` allowed), or follows ``<|python_tag|>``
(the built-in tools' channel) as the same JSON. llama.cpp detects the family by the
``ipython`` role header in the template."""
from geniex.engine.toolcalls.base import Family, ParseError, call_from_object, read_json

PYTHON_TAG = "<|python_tag|>"


class Llama3(Family):
    name = "llama3"
    openings = (PYTHON_TAG,)
    anchored = True

    def scan(self, text, final):
        at = len(PYTHON_TAG) if text.startswith(PYTHON_TAG) else 0
        got = read_json(text, at, final, "a call")
        if got is None:
            return None
        obj, end = got
        calls = [call_from_object(obj, ("parameters", "arguments"))]
        # Several calls are separated by ";" (Llama 3.2's convention).
        while True:
            rest = text[end:]
            stripped = rest.lstrip()
            if not stripped.startswith(";"):
                break
            more = read_json(text, end + (len(rest) - len(stripped)) + 1)
            if more is None:
                if final:
                    raise ParseError("the answer ends inside a call")
                return None
            calls.append(call_from_object(more[0], ("parameters", "arguments")))
            end = more[1]
        if not final and not text[end:].strip():
            return None                 # a ";" and another call may follow
        return calls, end
