"""The generic fallback, for any template that renders ``tools`` without one of the
known families' markers (and for templates that do not render them at all, which get
the tools and this format described in a system message, as llama.cpp's server
polyfills them): the answer is one JSON object, ``{"tool_call": {"name", "arguments"}}``,
``{"tool_calls": [...]}``, or ``{"response": "text"}`` for a plain answer (llama.cpp's
generic format); ``{"name", "arguments"}`` alone is read as a call too."""
from geniex.engine.toolcalls.base import Family, ParseError, call_from_object, read_json

FENCE = "```"


class Generic(Family):
    name = "generic"
    anchored = True

    def scan(self, text, final):
        at = len(text) - len(text.lstrip())
        fenced = text.startswith(FENCE, at)
        if fenced:
            # ```json ... ``` around the object, as small models like to write it.
            newline = text.find("\n", at)
            if newline < 0:
                if final:
                    raise ParseError("an empty code fence")
                return None
            at = newline + 1
        got = read_json(text, at, final, "its JSON")
        if got is None:
            return None
        obj, end = got
        if fenced:
            rest = text[end:].lstrip()
            if not rest.startswith(FENCE):
                if final or not FENCE.startswith(rest):
                    raise ParseError("the code fence is not closed")
                return None
            end = len(text) - len(rest) + len(FENCE)
        if not isinstance(obj, dict):
            raise ParseError("the answer is not a JSON object")
        if "tool_calls" in obj and isinstance(obj["tool_calls"], list) and obj["tool_calls"]:
            calls = [call_from_object(c) for c in obj["tool_calls"]]
        elif "tool_call" in obj:
            calls = [call_from_object(obj["tool_call"])]
        elif "name" in obj and ("arguments" in obj or "parameters" in obj):
            calls = [call_from_object(obj)]
        elif isinstance(obj.get("response"), str) and len(obj) == 1:
            return obj["response"], end          # a plain answer in the generic format
        else:
            raise ParseError("the JSON is not a call")
        if not final and not text[end:].strip():
            return None                          # wait for the end: more may follow
        return calls, end
