"""Gemma 4: ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, anywhere in the
answer. Values are Gemma's own notation: strings between ``<|"|>`` quote tokens
(written as they are, no escapes), numbers, ``true``/``false``/``null``, and lists and
objects whose keys are bare; JSON strings are read too. llama.cpp detects the family by
``<|tool_call>`` in the template."""
import json
import re

from geniex.engine.toolcalls.base import Family, ParseError, ToolCall

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_NAME = re.compile(r"\s*call:\s*([A-Za-z0-9_.\-]+)\s*")
_BARE = re.compile(r"[^,}\]]*")
_KEY = re.compile(r"\s*([^:{}\[\],]+?)\s*:")
_DECODER = json.JSONDecoder()


class _Short(Exception):
    """The text ends before the value does."""


class Gemma4(Family):
    name = "gemma4"
    openings = (OPEN,)

    def scan(self, text, final):
        m = _NAME.match(text, len(OPEN))
        if m is None or m.end() >= len(text):
            if final or (m is None and not re.fullmatch(r"\s*(c(a(l(l(:\s*[A-Za-z0-9_.\-]*)?)?)?)?)?", text[len(OPEN):])):
                raise ParseError("<|tool_call> is not followed by call:NAME{...}")
            return None
        try:
            args, end = _value(text, m.end())
        except _Short:
            if final:
                raise ParseError("the answer ends inside a call") from None
            return None
        if not isinstance(args, dict):
            raise ParseError("a call's arguments are an object")
        rest = text[end:]
        stripped = rest.lstrip()
        if stripped.startswith(CLOSE):
            end += len(rest) - len(stripped) + len(CLOSE)
        elif not final and (not stripped or CLOSE.startswith(stripped)):
            return None                 # the closing marker may still come
        elif not final or stripped:
            raise ParseError("a call is closed by <tool_call|>")
        return [ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))], end


def _skip(text, i):
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        raise _Short()
    return i


def _value(text, i):
    i = _skip(text, i)
    if text.startswith(QUOTE, i):
        end = text.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise _Short()
        return text[i + len(QUOTE):end], end + len(QUOTE)
    if QUOTE.startswith(text[i:]):
        raise _Short()
    c = text[i]
    if c == '"':
        try:
            return _DECODER.raw_decode(text, i)
        except json.JSONDecodeError:
            if '"' not in text[i + 1:]:
                raise _Short() from None
            raise ParseError("a bad string") from None
    if c == "{":
        return _object(text, i + 1)
    if c == "[":
        return _list(text, i + 1)
    m = _BARE.match(text, i)
    if m.end() >= len(text):
        raise _Short()
    word = m.group().strip()
    if not word:
        raise ParseError("a value is missing")
    try:
        return json.loads(word), m.end()       # numbers, true, false, null
    except ValueError:
        return word, m.end()                   # a bare word: a string


def _object(text, i):
    out = {}
    i = _skip(text, i)
    if text[i] == "}":
        return out, i + 1
    while True:
        i = _skip(text, i)
        if text.startswith(QUOTE, i):
            end = text.find(QUOTE, i + len(QUOTE))
            if end < 0:
                raise _Short()
            key = text[i + len(QUOTE):end]
            i = _skip(text, end + len(QUOTE))
            if text[i] != ":":
                raise ParseError("a key is followed by ':'")
            i += 1
        elif text[i] == '"':
            key, i = _value(text, i)
            i = _skip(text, i)
            if text[i] != ":":
                raise ParseError("a key is followed by ':'")
            i += 1
        else:
            m = _KEY.match(text, i)
            if m is None:
                if re.fullmatch(r"[^:{}\[\],]*", text[i:]):
                    raise _Short()
                raise ParseError("an object's key is missing")
            key, i = m.group(1), m.end()
        out[key], i = _value(text, i)
        i = _skip(text, i)
        if text[i] == ",":
            i += 1
        elif text[i] == "}":
            return out, i + 1
        else:
            raise ParseError("an object's items are separated by ','")


def _list(text, i):
    out = []
    i = _skip(text, i)
    if text[i] == "]":
        return out, i + 1
    while True:
        value, i = _value(text, i)
        out.append(value)
        i = _skip(text, i)
        if text[i] == ",":
            i += 1
        elif text[i] == "]":
            return out, i + 1
        else:
            raise ParseError("a list's items are separated by ','")
