"""llama.cpp's own server API, on our engine: ``/completion`` (and ``/completions``),
``/infill``, ``/tokenize``, ``/detokenize``, ``/apply-template``, ``/props``,
``/slots`` and ``/metrics``. Shapes follow llama.cpp's server (b11549); where they
differ, docs/server.md says how.
"""
import dataclasses

from flask import Blueprint, Response, current_app, jsonify

from geniex import profile
from geniex.engine import stops, tasks
from geniex.server import shapes
from geniex.server.answering import CHAT_MAX_TOKENS
from geniex.server.exchange import answerer, caller, read_body, stream
from geniex.server.metrics import CONTENT_TYPE
from geniex.server.validation import ApiError, validate, validate_spec

bp = Blueprint("native", __name__)

# -- decoding ---------------------------------------------------------------------------
@bp.post("/completion")
@bp.post("/completions")
def completion():
    """Continue a raw prompt (text or token ids) in llama.cpp's native shape."""
    body = read_body()
    if not isinstance(body, dict):
        validate(body, "completions.request.json")      # the 400 for a body that is no object
    if "prompt" not in body and "content" in body:
        body["prompt"] = body["content"]        # llama.cpp's older name
    prompts = body.get("prompt")
    if isinstance(prompts, list) and len(prompts) > 1 and all(isinstance(p, (str, list)) for p in prompts):
        return _several(body, prompts)
    validate(body, "completions.request.json")
    validate_spec(body)
    answer = answerer().complete(body, caller(), default_max=CHAT_MAX_TOKENS)
    return _native(body, answer)


def _several(body, prompts):
    """Several prompts in one request: answered one after another, a list of results
    (``index`` = the prompt's place), as llama.cpp's server answers them."""
    if body.get("stream"):
        raise ApiError(400, "prompt: several prompts are answered unstreamed only; send one prompt to stream",
                       param="prompt", code="unsupported_value")
    if len(prompts) > 64:
        raise ApiError(400, "prompt: at most 64 prompts per request", param="prompt", code="invalid_value")
    out = []
    for i, prompt in enumerate(prompts):
        one = {**body, "prompt": prompt}
        validate(one, "completions.request.json")
        validate_spec(one)
        answer = answerer().complete(one, caller(), default_max=CHAT_MAX_TOKENS)
        with answer:
            text = answer.text()
        out.append({**_final(one, answer, text), "index": i})
    return jsonify(out)


@bp.post("/infill")
def infill():
    """Fill in the middle: ``input_prefix``, ``input_suffix``, ``input_extra`` files and
    an optional ``prompt`` after the middle token, with the model's FIM tokens (501 for
    a model without them)."""
    body = read_body()
    validate(body, "infill.request.json")
    validate_spec(body)
    return _native(body, answerer().infill(body, caller()))


def _native(body, answer):
    if body.get("stream"):
        return stream(_native_events(body, answer), answer, done=False)
    with answer:
        text = answer.text()
    return jsonify(_final(body, answer, text))


def _native_events(body, answer):
    n = 0
    return_tokens = body.get("return_tokens") is True
    for event in answer.events():
        chunk = {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": 0,
                 "tokens_predicted": n, "tokens_evaluated": 0}
        if isinstance(event, tasks.Piece):
            n += len(event.tokens)
            chunk.update(content=event.text, tokens=list(event.tokens) if return_tokens else [], tokens_predicted=n)
            if answer.logprobs is not None:
                chunk["completion_probabilities"] = shapes.native_probs(event.logprobs or [])
        else:
            chunk["tokens_evaluated"] = event.total
        chunk.update(shapes.extras(event))
        yield chunk
    yield _final(body, answer, "", streamed=True)


def _final(body, answer, text, streamed=False):
    """The last (or only) object of a native answer (a streamed answer's probabilities
    came with its chunks)."""
    stats = answer.stats
    task = answer.task
    sampling = dataclasses.asdict(task.options.sampling) if task.options.sampling is not None else {}
    sampling.pop("logit_bias", None)
    sampling.pop("dry_breakers", None)
    out = {
        "index": 0, "content": text,
        "tokens": list(answer.tokens) if body.get("return_tokens") is True else [],
        "id_slot": 0, "stop": True, "model": answer.model,
        "tokens_predicted": stats.decode_tokens, "tokens_evaluated": stats.prompt_tokens,
        "generation_settings": {"n_predict": task.options.max_tokens, "stop": list(task.options.stop),
                                "speculative": bool(task.streaming.speculative and stats.spec_types),
                                **sampling,
                                # -inf is null in JSON, as llama.cpp writes it
                                "logit_bias": [{"token": t, "bias": None if b == float("-inf") else b}
                                               for t, b in answer.logit_bias]},
        "prompt": body.get("prompt") if isinstance(body.get("prompt"), str) else "",
        "has_new_line": "\n" in text, "truncated": False,
        "stop_type": stops.names(stats.stop_reason).llama, "stopping_word": "",
        "tokens_cached": stats.prompt_tokens + stats.decode_tokens,
        "timings": profile.timings(stats),
    }
    if answer.logprobs is not None and not streamed:
        out["completion_probabilities"] = shapes.native_probs(answer.logprobs)
    out["generation_settings"]["n_probs"] = task.options.logprobs or 0
    if answer.warnings:
        out["warnings"] = list(answer.warnings)
    return out


# -- answered at once ---------------------------------------------------------------------
@bp.post("/tokenize")
def tokenize():
    """``{"content", "add_special", "parse_special", "with_pieces"}`` -> ``{"tokens"}``."""
    body = read_body()
    validate(body, "tokenize.request.json")
    task = tasks.TokenizeTask(body["content"], add_special=body.get("add_special") is True,
                              parse_special=body.get("parse_special") is not False,
                              with_pieces=body.get("with_pieces") is True)
    return jsonify(_result(body, task))


@bp.post("/detokenize")
def detokenize():
    """``{"tokens": [ids]}`` -> ``{"content"}``."""
    body = read_body()
    validate(body, "detokenize.request.json")
    return jsonify(_result(body, tasks.DetokenizeTask(body.get("tokens") or [])))


@bp.post("/apply-template")
def apply_template():
    """The prompt the model's chat template makes of ``messages``: ``{"prompt"}``."""
    body = read_body()
    validate(body, "chat_completions.request.json")
    return jsonify(_result(body, answerer().conversation(body).template_task()))


def _result(body, task):
    data, _, warnings = answerer().result(body, task, caller())
    if warnings:
        data = {**data, "warnings": warnings}
    return data


@bp.get("/props")
def props():
    """The loaded (or default) model's properties, in llama.cpp's shape."""
    a = answerer()
    config = current_app.config["GENIEX"]
    name = a.resident()
    model = {}
    if name is not None:
        model, _, _ = a.result({}, tasks.PropsTask(), caller())
    n_ctx = model.get("n_ctx", a.defaults.nctx)
    return jsonify({
        "default_generation_settings": {
            "id": 0, "n_ctx": n_ctx, "speculative": bool(model.get("speculative")), "is_processing": a.cache.busy,
            "params": {"n_predict": CHAT_MAX_TOKENS, "seed": a.defaults.seed, "temperature": 0.0, "top_k": 0, "top_p": 0.0,
                       "min_p": 0.0, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                       "stop": []},
        },
        "total_slots": a.cache.status()["slots"] or a.defaults.parallel, "model_alias": name, "model_path": model.get("model_path"),
        "modalities": {"vision": False, "audio": False},
        "chat_template": model.get("chat_template", ""), "bos_token": model.get("bos_token", ""),
        "eos_token": model.get("eos_token", ""), "build_info": shapes.FINGERPRINT,
        "endpoint_slots": config.slots, "endpoint_metrics": config.metrics, "endpoint_props": False,
        "webui": False, "model": model,
    })


@bp.get("/slots")
def slots():
    """Every slot of the resident model (or the slots a model will have): its context,
    whether it answers, what it holds; llama.cpp's shape, with geniex's fields beside."""
    config = current_app.config["GENIEX"]
    if not config.slots:
        raise ApiError(501, "this server was started with --no-slots", code="not_supported")
    a = answerer()
    status = a.cache.status()
    report = a.cache.slots() or {}
    n_ctx = a.cache.resident_nctx() or a.defaults.nctx
    listed = report.get("slots")
    if listed is None:          # one slot (--parallel 1), or no model yet: what the cache knows
        busy = status["slots_busy"]
        listed = [{"id": i, "is_processing": i < busy, "n_ctx": n_ctx} for i in range(status["slots"] or a.defaults.parallel)]
    out = []
    for slot in listed:
        out.append({**slot, "id_task": -1, "speculative": status["speculative"], "model": status["model"],
                    "next_token": [{"has_next_token": slot["is_processing"], "has_new_line": False, "n_remain": -1,
                                    "n_decoded": 0}]})
    if out:
        out[0]["prompt_cache"] = report.get("prompt_cache", a.metrics.prompt_cache)
    return jsonify(out)


@bp.get("/metrics")
def metrics():
    """Prometheus text (geniex.server.metrics); 501 unless started with ``--metrics``."""
    config = current_app.config["GENIEX"]
    if not config.metrics:
        raise ApiError(501, "this server was started without --metrics", code="not_supported")
    m = answerer().metrics
    return Response(m.exposition(), content_type=CONTENT_TYPE,
                    headers={"Process-Start-Time-Unix": str(int(m.started))})
