"""``tool_choice`` ``required`` and a named function, enforced: a grammar (Lark with
JSON schemas inside, compiled by llguidance through :mod:`geniex.engine.constraints`)
that makes the answer one or more calls in the template's own format, each naming one
of the tools (or the named one) with arguments that match its ``parameters`` schema.
The loop samples every row under it, speculative or not, so the answer is the one
plain constrained decoding gives, and the grammar's fixed parts (``<tool_call>``,
``{"name": "``) are drafted for free by the forced-token drafter.
"""
import json

from geniex.engine.constraints import Grammar


def _params(tool):
    """A tool's ``parameters`` schema; an object schema that lists its properties and
    says nothing of others allows no others (as llama.cpp's schema converter reads it,
    and OpenAI's strict mode), so an enforced call holds the arguments the tool takes."""
    params = tool["function"].get("parameters")
    if not isinstance(params, dict) or not params:
        return {"type": "object"}
    if isinstance(params.get("properties"), dict) and "additionalProperties" not in params:
        params = {**params, "additionalProperties": False}
    return params


def _chosen(tools, name):
    return [t for t in tools if name is None or t["function"]["name"] == name]


def _call_schema(tools, args_key="arguments"):
    """JSON schema of one call object ``{"name": ..., args_key: {...}}`` of ``tools``."""
    options = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]}, args_key: _params(t)},
                "required": ["name", args_key], "additionalProperties": False} for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _json(schema):
    return "%json " + json.dumps(schema, ensure_ascii=False)


def _lit(text):
    return json.dumps(text, ensure_ascii=False)


def lark_source(family, tools, name=None, parallel=True):
    """The Lark grammar text of the calls ``family`` writes (``name``: that function only;
    ``parallel``: one or more calls, else exactly one)."""
    tools = _chosen(tools, name)
    many = parallel
    if family == "hermes":
        call = f'"<tool_call>\\n" {_json(_call_schema(tools))} "\\n</tool_call>"'
        more = ' ("\\n" call)*' if many else ""
        return f"start: call{more}\ncall: {call}\n"
    if family == "llama3":
        body = _json(_call_schema(tools, "parameters"))
        more = ' ("; " call)*' if many else ""
        return f"start: call{more}\ncall: {body}\n"
    if family == "mistral":
        items = {"type": "array", "items": _call_schema(tools), "minItems": 1}
        if not many:
            items["maxItems"] = 1
        return f'start: "[TOOL_CALLS]" {_json(items)}\n'
    if family == "gemma4":
        alternatives = " | ".join(f'{_lit("<|tool_call>call:" + t["function"]["name"])} {_json(_params(t))} '
                                  f'"<tool_call|>"' for t in tools)
        return f"start: call{'+' if many else ''}\ncall: {alternatives}\n"
    schema = {"type": "object", "properties": {"tool_call": _call_schema(tools)}, "required": ["tool_call"],
              "additionalProperties": False}
    return f"start: {_json(schema)}\n"


def call_grammar(family, tools, name=None, parallel=True):
    """The compiled :class:`~geniex.engine.constraints.Grammar` of :func:`lark_source`
    (a GrammarError naming ``tool_choice`` if a tool's schema does not compile)."""
    return Grammar.parse("lark", lark_source(family, tools, name, parallel), param="tool_choice")
