"""How a request wants its answer made: the loop's GenOptions (sampling, length,
stop strings, grammar, log-probabilities, a predicted output) and what a decoding task
reports besides its text, from the request's OpenAI, llama.cpp and GenieX fields."""
from geniex.engine import tasks
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.server import grammar_fields, llama_fields


def _get(body, name, default):
    value = body.get(name)
    return default if value is None else value


def gen_options(body, defaults, nctx, default_max):
    """The GenOptions of a request answered in a context of ``nctx`` tokens;
    ``default_max`` is the route's answer length when neither the request nor the
    server (``--n-predict``) sets one. Fields we cannot honour are 400s naming them."""
    llama_fields.check_unsupported(body)
    stop = body.get("stop") or ()
    sampling = SamplingParams(
        temperature=_get(body, "temperature", 0.0), top_k=_get(body, "top_k", 0),
        top_p=_get(body, "top_p", 0.0), min_p=_get(body, "min_p", 0.0),
        repetition_penalty=_get(body, "repetition_penalty", 1.0),
        presence_penalty=_get(body, "presence_penalty", 0.0),
        frequency_penalty=_get(body, "frequency_penalty", 0.0), seed=_get(body, "seed", defaults.seed),
        logit_bias=llama_fields.logit_bias(body))
    for name, value in llama_fields.sampling_fields(body).items():
        setattr(sampling, name, value)
    sampling = llama_fields.samplers(body, sampling)
    if sampling.penalty_last_n == -1:
        sampling.penalty_last_n = nctx
    if sampling.dry_penalty_last_n == -1:
        sampling.dry_penalty_last_n = nctx
    if defaults.n_predict is not None:
        default_max = nctx if defaults.n_predict < 0 else defaults.n_predict
    return GenOptions(max_tokens=llama_fields.max_tokens(body, default_max, nctx),
                      stop=(stop,) if isinstance(stop, str) else tuple(stop), sampling=sampling,
                      grammar=grammar_fields.grammar_of(body, defaults.grammar_dir),
                      logprobs=llama_fields.logprobs(body), prediction=prediction(body))


def prediction(body):
    """The text of OpenAI's ``prediction`` (``{"type": "content", "content": text or
    text parts}``, checked by the schema), or None."""
    pred = body.get("prediction")
    if not pred:
        return None
    content = pred.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content)
    return content or None


def streaming(body, spec):
    """What a decoding task reports besides its text, from llama.cpp's stream fields;
    ``spec``: the request's speculative setup (None: it does not draft)."""
    stream = bool(body.get("stream"))
    return tasks.Streaming(speculative=spec is not None, spec=spec, stream=stream,
                           progress=stream and body.get("return_progress") is True,
                           timings_per_token=body.get("timings_per_token") is True)
