"""``/v1/embeddings`` (OpenAI's shape), ``/embeddings`` (llama.cpp's) and ``/rerank``
(also ``/v1/rerank``, ``/reranking``, ``/v1/reranking``), from a model that declares a
pooling (a reranker: rank pooling and a classifier head). Any other model gets a 501
saying what it lacks (geniex.engine.embedding)."""
import base64
import struct
import time

from flask import Blueprint, jsonify

from geniex.engine import tasks
from geniex.server.exchange import answerer, caller, read_body
from geniex.server.validation import ApiError, validate

bp = Blueprint("embeddings", __name__)


def _inputs(body):
    raw = body.get("input", body.get("content"))
    if raw is None:
        raise ApiError(400, "input: required field is missing", param="input", code="invalid_value")
    if isinstance(raw, str):
        return [raw]
    if all(isinstance(x, int) for x in raw):
        return [raw]                                    # one input as token ids
    if any(isinstance(x, int) for x in raw):
        raise ApiError(400, "input: mix of token ids and other inputs; send a list of token-id lists",
                       param="input", code="invalid_value")
    return list(raw)


def _embed(body, pooled_only):
    validate(body, "embeddings.request.json")
    if body.get("dimensions") is not None:
        raise ApiError(400, "dimensions: this server returns the model's own width; leave it out",
                       param="dimensions", code="unsupported_value")
    normalize = body.get("embd_normalize")
    task = tasks.EmbedTask(_inputs(body), normalize=2 if normalize is None else normalize, pooled_only=pooled_only)
    t0 = time.perf_counter()
    a = answerer()
    data, model, warnings = a.result(body, task, caller())
    # An embedding samples no token, but its prompt costs a decode (llama.cpp counts it too).
    a.metrics.record_prompt(sum(item["tokens"] for item in data["data"]), time.perf_counter() - t0, len(data["data"]))
    return data, model, warnings


@bp.post("/v1/embeddings")
def openai_embeddings():
    """OpenAI's ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], ...}``."""
    body = read_body()
    data, model, warnings = _embed(body, pooled_only=True)
    b64 = body.get("encoding_format") == "base64"
    rows = []
    for i, item in enumerate(data["data"]):
        vec = item["embedding"][0]
        rows.append({"object": "embedding", "index": i,
                     "embedding": base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec})
    n = sum(item["tokens"] for item in data["data"])
    out = {"object": "list", "data": rows, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}}
    if warnings:
        out["warnings"] = warnings
    return jsonify(out)


@bp.post("/embeddings")
def llama_embeddings():
    """llama.cpp's ``[{"index", "embedding": [[...]]}]``: one vector per input, or one per
    token for a model that declares pooling ``none``."""
    data, _, _ = _embed(read_body(), pooled_only=False)
    return jsonify([{"index": i, "embedding": item["embedding"]} for i, item in enumerate(data["data"])])


@bp.post("/rerank")
@bp.post("/v1/rerank")
@bp.post("/reranking")
@bp.post("/v1/reranking")
def rerank():
    """``{"results": [{"index", "relevance_score"}], ...}`` sorted by score."""
    body = read_body()
    validate(body, "rerank.request.json")
    documents = body["documents"] if body.get("documents") is not None else body["texts"]
    data, model, warnings = answerer().result(body, tasks.RerankTask(body["query"], documents), caller())
    n = sum(r["tokens"] for r in data["results"])
    results = sorted(data["results"], key=lambda r: -r["relevance_score"])
    if body.get("top_n"):
        results = results[:body["top_n"]]
    for r in results:
        if body.get("return_text"):
            r["document"] = {"text": documents[r["index"]]}
        r.pop("tokens", None)
    out = {"model": model, "object": "list", "results": results, "usage": {"prompt_tokens": n, "total_tokens": n}}
    if warnings:
        out["warnings"] = warnings
    return jsonify(out)
