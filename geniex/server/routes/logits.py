"""GenieX's ``POST /v1/logits``: one prefill-only forward pass over pre-tokenized input,
the raw LM-head logits of the last position (``last_only``, the default) or of every
position, as the ``top_n`` (default 20) largest with their log-probabilities. No
sampling or decode loop runs; it is for on-target accuracy metrics (perplexity, MMLU)."""
from flask import Blueprint, jsonify

from geniex.engine import tasks
from geniex.server.exchange import answerer, caller, read_body
from geniex.server.validation import ApiError, validate

bp = Blueprint("logits", __name__)

TOP_N = 20                  # GenieX's default
MAX_ENTRIES = 1 << 17       # positions x top_n in one answer (each is a JSON object)


@bp.post("/v1/logits")
def logits():
    """``{"input_ids", "last_only", "top_n"}`` -> the logits of one prefill pass."""
    body = read_body()
    validate(body, "logits.request.json")
    for name in ("prompt", "text", "input", "content"):
        if body.get(name) is not None:
            raise ApiError(400, f"{name}: /v1/logits takes token ids only (input_ids), as GenieX's; tokenize text "
                           "with POST /tokenize first", param=name, code="unsupported_value")
    ids = body["input_ids"]
    last_only = body.get("last_only") is not False
    top_n = TOP_N if body.get("top_n") is None else body["top_n"]
    rows = 1 if last_only else len(ids)
    if rows * top_n > MAX_ENTRIES:
        raise ApiError(400, f"top_n: {rows} positions x top_n {top_n} is more than {MAX_ENTRIES} entries; ask "
                       "fewer top_n, last_only, or split the input", param="top_n", code="invalid_value")
    data, model, warnings = answerer().result(body, tasks.LogitsTask(list(ids), last_only, top_n), caller())
    out = {"object": "logits", "model": model, "last_only": last_only, "top_n": top_n, **data,
           "usage": {"prompt_tokens": data["n_tokens"], "total_tokens": data["n_tokens"]}}
    if warnings:
        out["warnings"] = warnings
    return jsonify(out)
