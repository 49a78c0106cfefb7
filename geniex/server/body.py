"""Reading a request body as strict JSON, before the schema sees it.

Python's ``json`` accepts more than JSON: ``NaN``, ``Infinity`` and ``1e999`` (which
becomes ``inf``), lone UTF-16 surrogates (``"\\udc00"``, which cannot be encoded when
the text reaches the tokenizer), and nesting deep enough to overflow the recursion
limit in the parser or the schema validator. Each is a 400 here, naming what is wrong.
The body's size is bounded before this by Flask's ``MAX_CONTENT_LENGTH`` (413), and
its shape here, before the schema validator walks it: the validator costs about as much
per object as the parser, so 8 MiB of 275,000 empty content parts took 29 s of
checking. A body of more than :data:`MAX_OBJECTS` objects, or with an array of more
than :data:`MAX_ITEMS` items, is a 413 as soon as the parser has seen that many.
"""
import json
import math

from geniex.server.validation import ApiError, field_path

MAX_DEPTH = 32          # a chat request needs 5 levels (body, messages, message, parts, part)
MAX_OBJECTS = 20_000    # JSON objects in a body: messages, content parts, tool schemas, ...
MAX_ITEMS = 262_144     # items of one array (a prompt of token ids: longer than any context we run)
BIG_BODY = 1 << 20      # requests with bodies from this size give memory back to the OS when they end
                        # (geniex.llama.libc.malloc_trim, from app.py)


class _TooMany(ValueError):
    pass


class _NotFinite(ValueError):
    pass


def _constant(token):
    raise _NotFinite(token)


def _float(text):
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def parse(raw):
    """The JSON value in ``raw`` (bytes); raises a 400 ApiError for anything that is not
    plain, finite, well-formed JSON of at most :data:`MAX_DEPTH` levels."""
    if not raw:
        raise ApiError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not UTF-8 (byte {e.start})", code="invalid_json") from None
    objects = [0]

    def count(pairs):
        # Called by the parser for each object as it ends: stops a body of too many early.
        objects[0] += 1
        if objects[0] > MAX_OBJECTS:
            raise _TooMany(f"the request body holds more than {MAX_OBJECTS} JSON objects")
        return dict(pairs)

    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, object_pairs_hook=count)
    except _TooMany as e:
        raise ApiError(413, f"{e}; send fewer messages or content parts", code="request_too_large") from None
    except _NotFinite as e:
        raise ApiError(400, f"the request body holds {e.args[0]}, which is not a finite number; "
                       "JSON numbers must be finite", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, f"the request body is nested more than {MAX_DEPTH} levels deep",
                       code="invalid_json") from None
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
    _check_strings(value)
    return value


def _check_strings(value):
    """At most MAX_DEPTH levels (the schema validator recurses), and every key and
    string encodable as UTF-8 (no lone surrogates). Walked without recursion."""
    stack = [((), value)]
    while stack:
        where, node = stack.pop()
        if len(where) >= MAX_DEPTH and isinstance(node, (dict, list)):     # level len(where) + 1
            raise ApiError(400, f"the request body is nested more than {MAX_DEPTH} levels deep",
                           code="invalid_json")
        if isinstance(node, dict):
            for k, v in node.items():
                _utf8(k, where)
                stack.append(((*where, k), v))
        elif isinstance(node, list):
            if len(node) > MAX_ITEMS:
                param = field_path(where) or None
                raise ApiError(413, f"{param or 'body'}: holds {len(node)} items, more than this server takes "
                               f"in one array ({MAX_ITEMS})", param=param, code="request_too_large")
            stack.extend(((*where, i), v) for i, v in enumerate(node))
        elif isinstance(node, str):
            _utf8(node, where)


def _utf8(text, where):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        param = field_path(where) or None
        raise ApiError(400, f"{param or 'body'}: holds a lone UTF-16 surrogate ({text[e.start]!r}), "
                       "which is not text; send valid Unicode", param=param, code="invalid_value") from None
