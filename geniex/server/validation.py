"""Request validation against ``schemas/*.json``, and OpenAI's error shape.

Every error the server answers goes through :func:`as_api_error` (called by the one
error handler in :mod:`geniex.server.app`), so all of them look like OpenAI's::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "...", "code": "..."}}

A schema may carry ``"x-error"`` next to a rule: that text replaces jsonschema's own
message when the rule fails (used where the generic message would not say what to do).
"""
import json
import logging
from functools import lru_cache
import sysconfig
from pathlib import Path

import jsonschema
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from werkzeug.exceptions import HTTPException

from geniex.errors import (ContextLengthExceeded, GenieXError, LibraryError, LoadCancelled, LoadTimeout, ModelCrashed,
                           ModelLoadError, ModelNotFound, RequestTimeout, ServerStopping, Unsupported, UsageError)

log = logging.getLogger("geniex.server")

# The schemas live at the top of the source tree (the OpenAPI document refers to them).
def _schema_dir():
    # A source checkout (editable install, tests) keeps them at the top of the tree; a
    # regular install puts them under <prefix>/share/geniex/schemas (setup.cfg data_files).
    here = Path(__file__).resolve().parents[2] / "schemas"
    if here.is_dir():
        return here
    return Path(sysconfig.get_path("data")) / "share" / "geniex" / "schemas"


SCHEMA_DIR = _schema_dir()

# Error types by status, as llama.cpp's server names them where OpenAI has no name.
_TYPES = {401: "authentication_error", 404: "not_found_error", 501: "not_supported_error",
          503: "service_unavailable_error"}


class ApiError(Exception):
    """An error answer: HTTP status, message, and OpenAI's ``param`` / ``code``; ``type_``
    overrides the type the status gives, ``extra`` adds fields (llama.cpp's
    ``n_prompt_tokens`` / ``n_ctx`` for a prompt that does not fit)."""

    def __init__(self, status, message, param=None, code=None, headers=None, type_=None, extra=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})     # e.g. Retry-After, Allow, WWW-Authenticate
        self.type = type_ or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.extra = dict(extra or {})

    def body(self):
        """The JSON body in OpenAI's error shape."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code,
                          **self.extra}}


@lru_cache(maxsize=None)
def schemas():
    """``{file name: schema}`` of every ``schemas/*.json`` (loaded once)."""
    found = {p.name: json.loads(p.read_text()) for p in sorted(SCHEMA_DIR.glob("*.json"))}
    if not found:
        raise LibraryError(f"no request schemas in {SCHEMA_DIR}; is the source tree complete?")
    return found


@lru_cache(maxsize=None)
def _validator(name):
    registry = Registry().with_resources(
        (file, Resource.from_contents(schema)) for file, schema in schemas().items())
    schema = schemas()[name]
    base = jsonschema.validators.validator_for(schema)
    base.check_schema(schema)
    # JSON Schema counts 2048.0 as an integer; the engine would get a float where it
    # needs an int (range(), ctypes). An integer field takes integers only.
    strict = jsonschema.validators.extend(
        base, type_checker=base.TYPE_CHECKER.redefine("integer", _is_integer))
    return strict(schema, registry=registry)


def _is_integer(_checker, instance):
    return isinstance(instance, int) and not isinstance(instance, bool)


def validate(body, schema_name):
    """Check a request body against ``schemas/<schema_name>``; raise a 400 ApiError
    naming the first field at fault and what was expected."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_request_body")
    error = best_match(_validator(schema_name).iter_errors(body))
    if error is None:
        return
    where = list(error.absolute_path)
    if error.validator == "required":
        # jsonschema reports a missing field at its parent object: name the field.
        where.append(next(f for f in error.validator_value if f not in error.instance))
    param = field_path(where)
    raise ApiError(400, f"{param or 'body'}: {_explain(error)}", param=param or None, code="invalid_value")


def validate_spec(body):
    """Check a body's ``spec_*`` fields by the chat schema's rules (routes without a
    schema of their own, or one that does not list them, take the same fields)."""
    spec = {k: v for k, v in body.items() if isinstance(k, str) and k.startswith("spec_")}
    if spec:
        validate({**spec, "messages": []}, "chat_completions.request.json")


def field_path(parts):
    """``["messages", 0, "role"]`` -> ``"messages[0].role"``."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _explain(error):
    custom = error.schema.get("x-error") if isinstance(error.schema, dict) else None
    if custom:
        return custom
    if error.validator == "required":
        return "required field is missing"
    if error.validator == "type":
        wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        text = f"expected {' or '.join(wanted)}, got {_json_type(error.instance)} {json.dumps(error.instance)[:60]}"
        if "integer" in wanted and isinstance(error.instance, float) and error.instance.is_integer():
            text += f" (write {int(error.instance)}, without a decimal point)"
        return text
    if error.validator == "enum":
        return f"expected one of {', '.join(json.dumps(v) for v in error.validator_value)}, got {json.dumps(error.instance)[:60]}"
    return error.message


def _json_type(value):
    for name, kind in (("null", type(None)), ("boolean", bool), ("integer", int), ("number", float),
                       ("string", str), ("array", list), ("object", dict)):
        if isinstance(value, kind):
            return name
    return type(value).__name__


# GenieXError subclasses -> (status, code); anything else a GenieXError is the
# client's to fix (bad flag value, a template that refuses the conversation, ...).
# Why these statuses (docs/isolation.md): a model file that cannot be loaded is a 422,
# the request was understood but names something that cannot be used (retrying the
# same request will not help; another model will); a model that crashed under a
# request is a 502, the server is up but the process behind it failed (a retry loads
# the model again); a request over its time budget with nothing produced, or whose
# model did not load within its bound, is a 504.
_STATUS = [
    (ModelCrashed, 502, "model_crashed"),
    (RequestTimeout, 504, "request_timeout"),
    (LoadTimeout, 504, "load_timeout"),
    (LoadCancelled, 503, "request_cancelled"),
    (ServerStopping, 503, "shutting_down"),
    (ModelNotFound, 404, "model_not_found"),
    (ContextLengthExceeded, 400, "context_length_exceeded"),
    (Unsupported, 501, "not_supported"),
    (UsageError, 400, "invalid_value"),
    (ModelLoadError, 422, "model_load_failed"),
    (LibraryError, 500, "library_error"),
    (GenieXError, 400, None),
]


def as_api_error(exc):
    """Any exception -> ApiError (the single mapping the error handler uses)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, HTTPException):
        # Keep the headers the status needs (405's Allow).
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return ApiError(exc.code or 500, f"{exc.name}: {exc.description}",
                        code=exc.name.lower().replace(" ", "_"), headers=headers)
    for kind, status, code in _STATUS:
        if isinstance(exc, kind):
            return ApiError(status, str(exc), param=exc.param, code=code)
    log.exception("internal error")
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")
