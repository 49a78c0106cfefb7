"""The request fields that constrain an answer, on every decoding route, as one Grammar.

| field | from | means |
|---|---|---|
| ``grammar`` | llama.cpp | a GBNF grammar (text) |
| ``grammar_string`` | GenieX | a GBNF grammar (text) |
| ``grammar_path`` | GenieX | a GBNF file inside the server's grammar folder (``serve --grammar-dir``) |
| ``json_schema`` | llama.cpp | a JSON schema (object) |
| ``response_format`` | OpenAI | ``text``; ``json_object`` (llama.cpp: with an optional ``schema``); ``json_schema`` with ``json_schema.schema`` |

At most one may constrain a request (a second is a 400 naming it); a grammar or schema
that does not compile is a 400 naming its field; a ``grammar_path`` outside the grammar
folder (or with none configured) is a 400. Compiling here, before the model is leased,
answers a bad grammar without loading anything.
"""
import os
from pathlib import Path

from geniex.engine.constraints import Grammar, GrammarError
from geniex.server.validation import ApiError

FIELDS = ("grammar", "grammar_string", "grammar_path", "json_schema", "response_format")
FORMATS = ("text", "json_object", "json_schema")
MAX_GRAMMAR_FILE = 1 << 20


def constrained(body):
    """Whether a request constrains its answer with a grammar field (text is no constraint)."""
    for name in FIELDS:
        value = body.get(name)
        if value in (None, "", {}):
            continue
        if name == "response_format" and isinstance(value, dict) and value.get("type") == "text":
            continue
        return True
    return False


def grammar_of(body, grammar_dir=None):
    """The Grammar a request body asks for, or None; ApiError 400 on bad input."""
    found = []
    for name in FIELDS:
        value = body.get(name)
        if value is None or value == "" or value == {}:
            continue
        grammar = _parse(name, value, grammar_dir)
        if grammar is not None:
            found.append((name, grammar))
    if len(found) > 1:
        first, second = found[0][0], found[1][0]
        raise ApiError(400, f"{second}: a request may constrain its answer one way; it already has {first}",
                       param=second, code="invalid_value")
    return found[0][1] if found else None


def _parse(name, value, grammar_dir):
    try:
        if name in ("grammar", "grammar_string"):
            if not isinstance(value, str):
                raise _bad(name, "expected a GBNF grammar as a string")
            return Grammar.parse("gbnf", value, param=name)
        if name == "grammar_path":
            return Grammar.parse("gbnf", _read_grammar_file(value, grammar_dir), param=name)
        if name == "json_schema":
            if not isinstance(value, (dict, bool)):
                raise _bad(name, "expected a JSON schema object")
            return Grammar.parse("json_schema", value, param=name)
        return _response_format(value)
    except GrammarError as e:
        raise ApiError(400, str(e), param=e.param or name, code="invalid_value") from None


def _response_format(value):
    if not isinstance(value, dict):
        raise _bad("response_format", "expected an object like {\"type\": \"json_object\"}")
    kind = value.get("type")
    if kind not in FORMATS:
        raise ApiError(400, f"response_format.type: expected one of {', '.join(FORMATS)}, got {kind!r}",
                       param="response_format.type", code="invalid_value")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")          # llama.cpp's extension: a schema on json_object
        if schema is None:
            return Grammar.parse("json_object", param="response_format")
        return Grammar.parse("json_schema", schema, param="response_format.schema")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ApiError(400, "response_format.json_schema: expected an object with a schema",
                       param="response_format.json_schema", code="invalid_value")
    if "strict" in spec and not isinstance(spec["strict"], bool):
        raise ApiError(400, "response_format.json_schema.strict: expected a boolean",
                       param="response_format.json_schema.strict", code="invalid_value")
    schema = spec.get("schema")
    if schema is None:
        # OpenAI's name-only form: any JSON object (the schema is the client's to check).
        return Grammar.parse("json_object", param="response_format.json_schema")
    # strict or not, the answer is decoded under the whole schema: output that cannot
    # break it is the stronger promise, and what llama.cpp's server does too.
    return Grammar.parse("json_schema", schema, param="response_format.json_schema.schema")


def _read_grammar_file(value, grammar_dir):
    if not isinstance(value, str) or not value:
        raise _bad("grammar_path", "expected a file name inside the server's grammar folder")
    if grammar_dir is None:
        raise ApiError(400, "grammar_path: this server has no grammar folder (start it with "
                       "geniex serve --grammar-dir DIR, or send the grammar itself in grammar_string)",
                       param="grammar_path", code="unsupported_value")
    root = Path(grammar_dir).resolve()
    path = (root / value).resolve()
    if os.path.commonpath([root, path]) != str(root) or path == root:
        raise ApiError(400, f"grammar_path: {value!r} is outside the server's grammar folder; name a file "
                       "inside it", param="grammar_path", code="invalid_value")
    if not path.is_file():
        raise ApiError(400, f"grammar_path: no grammar file {value!r} in the server's grammar folder",
                       param="grammar_path", code="invalid_value")
    if path.stat().st_size > MAX_GRAMMAR_FILE:
        raise _bad("grammar_path", f"{value!r} is larger than {MAX_GRAMMAR_FILE} bytes")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _bad("grammar_path", f"{value!r} cannot be read as UTF-8 text ({e.__class__.__name__})") from None


def _bad(name, why):
    return ApiError(400, f"{name}: {why}", param=name, code="invalid_value")

