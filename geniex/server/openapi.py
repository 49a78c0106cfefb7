"""The OpenAPI 3.1 document, generated from ``schemas/*.json`` so it cannot drift
from what the server validates.

Each schema file's ``$defs`` (and each request schema itself) become
``components/schemas`` entries; references between files (``common.json#/$defs/X``)
and inside one (``#/$defs/X``) are rewritten to ``#/components/schemas/X``.
"""
import copy
from functools import lru_cache

from geniex import __version__
from geniex.server.validation import schemas

# (method, path, summary, request schema title or None, response schema, streamed shape)
ROUTES = [
    ("post", "/v1/chat/completions", "Chat (OpenAI-compatible), with per-request speculative decoding",
     "ChatCompletionRequest", "ChatCompletion", "ChatCompletionChunk"),
    ("post", "/v1/completions", "Continue a raw prompt (no chat template, no speculation)",
     "CompletionRequest", "Completion", "Completion"),
    ("get", "/v1/models", "Models in the store, one entry per precision", None, "ModelList", None),
    ("get", "/v1/models/{model}", "One stored model", None, "Model", None),
    ("get", "/health", "Server status and the resident model", None, "Health", None),
    ("post", "/v1/spec/reset", "Forget what drafting learned from earlier answers (n-gram memory)",
     None, "SpecReset", None),
    # llama.cpp's server API and the agents' APIs (docs/server.md)
    ("post", "/chat/completions", "Chat, as /v1/chat/completions (llama.cpp's path without /v1)",
     "ChatCompletionRequest", "ChatCompletion", "ChatCompletionChunk"),
    ("post", "/completion", "llama.cpp's native completion (also /completions): text or token ids",
     "CompletionRequest", "NativeCompletion", "NativeCompletion"),
    ("post", "/infill", "Fill in the middle with the model's FIM tokens", "InfillRequest", "NativeCompletion",
     "NativeCompletion"),
    ("post", "/tokenize", "Text -> token ids", "TokenizeRequest", "Tokens", None),
    ("post", "/detokenize", "Token ids -> text", "DetokenizeRequest", "Tokens", None),
    ("post", "/apply-template", "The prompt the chat template makes of messages", "ChatCompletionRequest",
     "Tokens", None),
    ("get", "/props", "The loaded model's properties", None, "Props", None),
    ("get", "/slots", "The one slot (501 with --no-slots)", None, "Slots", None),
    ("get", "/metrics", "Prometheus metrics (501 without --metrics)", None, "MetricsText", None),
    ("post", "/v1/embeddings", "Embeddings with the model's declared pooling (OpenAI's shape)",
     "EmbeddingsRequest", "Embeddings", None),
    ("post", "/embeddings", "Embeddings (llama.cpp's shape)", "EmbeddingsRequest", "Embeddings", None),
    ("post", "/rerank", "Relevance scores from a reranking model", "RerankRequest", "Rerank", None),
    ("post", "/v1/logits", "Raw logits of one prefill-only pass over input_ids (GenieX)", "LogitsRequest", "Logits",
     None),
    ("post", "/v1/responses", "OpenAI's Responses API, on the chat path", "ResponsesRequest", "ResponseObject",
     "ResponseObject"),
    ("post", "/v1/messages", "Anthropic's Messages API, on the chat path", "MessagesRequest", "AnthropicMessage",
     "AnthropicMessage"),
    ("post", "/v1/messages/count_tokens", "Prompt tokens of a Messages request", "MessagesCountRequest",
     "AnthropicMessage", None),
]

DESCRIPTION = """\
A local OpenAI-compatible server over llama.cpp (`geniex serve`). It never downloads:
models come from the store (`geniex pull`). One model is resident at a time and
requests are answered one at a time. The model is reloaded when `model`, `nctx`, `ngl`,
`compute` or any `spec_*` field changes, and freed after `--keepalive` idle seconds.

Header `GenieX-KeepCache: true` keeps the KV cache of the previous request, so a
follow-up turn decodes only its new tokens; without it each request starts clean.

Security defaults: no CORS unless `--origins` lists origins, a `Host` header other than
a loopback name needs `--allowed-hosts`, requests name stored models only (unless
`--allow-paths`), and with `--api-key` every `/v1` request carries
`Authorization: Bearer <key>` (use the Authorize button here).

Draft acceptance is in `usage.completion_tokens_details` (accepted/rejected prediction
tokens) and in llama.cpp-style `timings` (`draft_n`, `draft_n_accepted`).
"""


def _refs_to_components(node):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str) and "#/$defs/" in v:
                out[k] = "#/components/schemas/" + v.split("#/$defs/", 1)[1]
            elif k not in ("$schema", "$id"):
                out[k] = _refs_to_components(v)
        return out
    if isinstance(node, list):
        return [_refs_to_components(v) for v in node]
    return node


def components():
    """``components/schemas`` built from every schema file."""
    found = {}
    for file, schema in schemas().items():
        schema = copy.deepcopy(schema)
        defs = schema.pop("$defs", {})
        if "properties" in schema:          # a request body schema
            defs = {schema["title"]: schema, **defs}
        for name, sub in defs.items():
            if name in found:
                raise ValueError(f"schema name {name} is defined twice ({file})")
            found[name] = _refs_to_components(sub)
    return found


def _json(ref):
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def _operation(summary, request_schema, response, streamed):
    op = {"summary": summary, "responses": {}}
    ok = {"description": "OK", "content": _json(response)}
    if response == "MetricsText":
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    if response == "ChatCompletion":
        # A warm-up (empty ``messages``) loads the model and answers ``null``.
        ok["description"] = "OK (`null` for a warm-up: empty `messages`)"
        ok["content"]["application/json"]["schema"] = {
            "anyOf": [{"$ref": "#/components/schemas/ChatCompletion"}, {"type": "null"}]}
    if streamed:
        ok["content"]["text/event-stream"] = {
            "schema": {"type": "string", "description":
                       f"With `stream: true`: `data: <{streamed} as JSON>` events, then `data: [DONE]`."}}
    op["responses"]["200"] = ok
    if request_schema:
        op["requestBody"] = {"required": True, "content": _json(request_schema)}
        op["parameters"] = [{"name": "GenieX-KeepCache", "in": "header", "required": False,
                             "schema": {"type": "string", "enum": ["true", "false"]},
                             "description": "`true` keeps the KV cache from the previous request."}]
        op["responses"]["400"] = {"description": "Invalid request, or the prompt does not fit "
                                  "(`context_length_exceeded`)", "content": _json("Error")}
        op["responses"]["413"] = {"description": "The request body is larger than `geniex serve --max-body`",
                                  "content": _json("Error")}
        op["responses"]["503"] = {"description": "The queue is full (`--max-queue`; see `Retry-After`), or "
                                  "the server is stopping", "content": _json("Error")}
    op["responses"]["404"] = {"description": "Model (or draft model) not in the store", "content": _json("Error")}
    op["responses"]["401"] = {"description": "Missing or wrong API key (a server started with `--api-key`)",
                              "content": _json("Error")}
    op["responses"]["403"] = {"description": "Host or Origin not allowed (`--allowed-hosts`, `--origins`)",
                              "content": _json("Error")}
    op["security"] = [{"bearerAuth": []}, {}]
    return op


@lru_cache(maxsize=None)
def document():
    """The whole OpenAPI document (a dict, built once)."""
    paths = {}
    for method, path, summary, request_schema, response, streamed in ROUTES:
        op = _operation(summary, request_schema, response, streamed)
        if "{model}" in path:
            op.setdefault("parameters", []).append(
                {"name": "model", "in": "path", "required": True, "schema": {"type": "string"},
                 "description": "`org/repo[:precision]`"})
        if path in ("/health", "/v1/models", "/v1/spec/reset", "/props", "/slots", "/metrics"):
            op["responses"].pop("404")
        if path == "/health":           # open without the API key
            op["responses"].pop("401")
            op.pop("security")
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "geniex local server", "version": __version__, "description": DESCRIPTION},
        "paths": paths,
        "components": {"schemas": components(), "securitySchemes": {"bearerAuth": {
            "type": "http", "scheme": "bearer",
            "description": "Needed only when the server runs with `--api-key` / `GENIEX_API_KEY`."}}},
    }
