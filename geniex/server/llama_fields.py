"""llama.cpp's server request fields, on every decoding route: the ones that mean what
ours mean are mapped onto them, the ones with no effect at their neutral value are
accepted at that value, and the rest are a 400 naming the field (never a 200 that
ignores it).

llama.cpp copies any field of a chat or OpenAI completion request into its own
parameters, so its clients send ``n_predict``, ``repeat_penalty`` or ``samplers`` to
``/v1/chat/completions`` as well as to ``/completion``: the same mapping applies to
all of them.
"""
import math

from geniex.server.validation import ApiError

MAX_TOP_LOGPROBS = 20      # top_logprobs / completions logprobs (OpenAI's bound)
MAX_N_PROBS = 100          # llama.cpp's n_probs (unbounded there; each is a JSON object per token)

# Our sampler chain, in the order it runs (geniex.engine.sampling); each name is a
# sampler of llama.cpp's ``samplers`` list, and the fields that switch it off.
CHAIN = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
_OFF = {"penalties": {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
        "top_n_sigma": {"top_n_sigma": -1.0}, "top_k": {"top_k": 0}, "typ_p": {"typical_p": 1.0},
        "top_p": {"top_p": 0.0}, "min_p": {"min_p": 0.0},
        "xtc": {"xtc_probability": 0.0}, "dry": {"dry_multiplier": 0.0}}
_ALIASES = {"typical_p": "typ_p"}
# llama.cpp's samplers that are no-ops at the neutral values we require below.
NEUTRAL_SAMPLERS = frozenset(("infill", "adaptive_p"))
# One-letter forms of a ``samplers`` string (common_sampler_types_from_chars).
_CHARS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
          "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill", "a": "adaptive_p"}

# field -> test of a value that changes nothing (the field is then accepted).
NEUTRAL = {
    "min_keep": lambda v: v <= 1, "n_cmpl": lambda v: v == 1,
    "t_max_prompt_ms": lambda v: v <= 0, "t_max_predict_ms": lambda v: v <= 0,
    "n_indent": lambda v: v <= 0, "adaptive_target": lambda v: v < 0,
}
# field -> a value that changes nothing (booleans, strings, lists).
NEUTRAL_EXACT = {"backend_sampling": False, "post_sampling_probs": False, "verbose": False,
                 "response_fields": [], "lora": [], "grammar_lazy": False, "grammar_triggers": []}
# Why a field cannot be honoured where that is not plain: the 400 says so.
WHY = {
    "post_sampling_probs": "token probabilities are reported from the raw logits (as llama.cpp does without "
                           "post_sampling_probs), not after the sampler chain",
    "t_max_prompt_ms": "time limits are not supported", "t_max_predict_ms": "time limits are not supported",
    "grammar_lazy": "lazy grammars (a grammar that starts at a trigger) are not supported; send tools with "
                    "tool_choice required or a named tool to constrain tool calls",
    "grammar_triggers": "lazy grammars (a grammar that starts at a trigger) are not supported; send tools with "
                        "tool_choice required or a named tool to constrain tool calls",
}
# Settings that take effect only with a field above (adaptive_decay) are accepted with
# any value: at that field's neutral value they change nothing.


def check_unsupported(body):
    """A 400 naming the first llama.cpp field whose value would change the answer in a
    way this server does not reproduce."""
    for name, neutral in NEUTRAL.items():
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ApiError(400, f"{name}: expected a number, got {value!r}", param=name, code="invalid_value")
        if not neutral(value):
            raise _unsupported(name, value)
    for name, neutral in NEUTRAL_EXACT.items():
        value = body.get(name)
        if value is not None and value != neutral and not (isinstance(neutral, (list, dict)) and not value):
            raise _unsupported(name, value)
    if body.get("id_slot") not in (None, -1, 0):
        raise ApiError(400, f"id_slot: this server has one slot, 0 (or -1 for any); got {body['id_slot']!r}",
                       param="id_slot", code="invalid_value")
    if body.get("n_predict") == 0:
        raise _unsupported("n_predict", 0, "evaluating the prompt without predicting is not supported")


def _unsupported(name, value, why=None):
    why = why or WHY.get(name) or "this sampler or setting is not implemented by this server"
    return ApiError(400, f"{name}: {value!r} cannot be honoured: {why}; leave it out or at its neutral value",
                    param=name, code="unsupported_value")


def logprobs(body):
    """How many alternatives per answer token a request asks to see with each token's
    log-probability; None when it asks for none. Read from OpenAI's chat fields
    (``logprobs: true`` with ``top_logprobs`` 0-20), OpenAI's completions field
    (``logprobs``: 0-20) or llama.cpp's ``n_probs`` (1-100; 0 = none)."""
    n_probs = body.get("n_probs")
    if n_probs is not None:
        if not isinstance(n_probs, int) or isinstance(n_probs, bool) or not 0 <= n_probs <= MAX_N_PROBS:
            raise ApiError(400, f"n_probs: expected an integer from 0 to {MAX_N_PROBS}, got {n_probs!r}",
                           param="n_probs", code="invalid_value")
        if n_probs > 0:
            return n_probs
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise ApiError(400, f"top_logprobs: expected an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r}",
                       param="top_logprobs", code="invalid_value")
    if asked is None or asked is False:
        if top:
            raise ApiError(400, "top_logprobs: requires logprobs to be set to true", param="top_logprobs",
                           code="invalid_value")
        return None
    if asked is True:
        return top or 0
    if not isinstance(asked, int) or not 0 <= asked <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"logprobs: expected a boolean (chat) or an integer from 0 to {MAX_TOP_LOGPROBS} "
                       f"(completions), got {asked!r}", param="logprobs", code="invalid_value")
    return asked


def refuse_logprobs(body, route, instead="/v1/chat/completions (logprobs, top_logprobs) or /completion (n_probs)"):
    """A 400 naming the field when a route whose answer has no place for token
    log-probabilities is asked for them (rather than computing them and dropping them)."""
    for name in ("n_probs", "logprobs", "top_logprobs"):
        if body.get(name):
            raise ApiError(400, f"{name}: token log-probabilities are not reported on {route}; ask {instead}",
                           param=name, code="unsupported_value")


def max_tokens(body, default, n_ctx):
    """``n_predict`` (llama.cpp; -1 = until the context is full) over ``max_tokens`` /
    ``max_completion_tokens``, else ``default``."""
    n = body.get("n_predict")
    if n is None:
        n = body.get("max_completion_tokens")
    if n is None:
        n = body.get("max_tokens")
    if n is None:
        return default
    if not isinstance(n, int) or isinstance(n, bool) or n < -1:
        raise ApiError(400, f"n_predict: expected an integer >= -1, got {n!r}", param="n_predict",
                       code="invalid_value")
    return n_ctx if n == -1 else n


def sampling_fields(body):
    """SamplingParams keyword arguments from llama.cpp's names (``repeat_penalty``,
    ``repeat_last_n``, ``logit_bias``, ``ignore_eos``, ``samplers``, ``seed`` -1)."""
    out = {}
    if body.get("repeat_penalty") is not None and body.get("repetition_penalty") is None:
        out["repetition_penalty"] = _number(body, "repeat_penalty", 0, 10)
    if body.get("repeat_last_n") is not None:
        n = body["repeat_last_n"]
        if not isinstance(n, int) or isinstance(n, bool) or n < -1 or n > 1 << 20:
            raise ApiError(400, f"repeat_last_n: expected an integer >= -1, got {n!r}", param="repeat_last_n",
                           code="invalid_value")
        out["penalty_last_n"] = n
    if body.get("typical_p") is not None:
        out["typical_p"] = _number(body, "typical_p", 0, 1e9)
    seed = body.get("seed")
    if seed in (-1, 0xFFFFFFFF):
        out["seed"] = 0                 # llama.cpp's "random seed"
    if body.get("xtc_probability") is not None:
        out["xtc_probability"] = _number(body, "xtc_probability", 0, 1)
    if body.get("xtc_threshold") is not None:
        out["xtc_threshold"] = _number(body, "xtc_threshold", 0, 1)
    if body.get("top_n_sigma") is not None:
        out["top_n_sigma"] = _number(body, "top_n_sigma", -1e9, 1e9)    # <= 0 = off, as in llama.cpp
    if body.get("dynatemp_range") is not None:
        out["dynatemp_range"] = max(0.0, _number(body, "dynatemp_range", -1e9, 100))   # <= 0 = off
    if body.get("dynatemp_exponent") is not None:
        out["dynatemp_exponent"] = _number(body, "dynatemp_exponent", 0, 100)
    if body.get("mirostat") is not None:
        if body["mirostat"] not in (0, 1, 2) or isinstance(body["mirostat"], bool):
            raise ApiError(400, f"mirostat: expected 0 (off), 1 or 2, got {body['mirostat']!r}", param="mirostat",
                           code="invalid_value")
        out["mirostat"] = int(body["mirostat"])
    if body.get("mirostat_tau") is not None:
        out["mirostat_tau"] = _number(body, "mirostat_tau", 0, 100)
    if body.get("mirostat_eta") is not None:
        out["mirostat_eta"] = _number(body, "mirostat_eta", 0, 10)
    out.update(_dry_fields(body))
    if body.get("ignore_eos") is not None:
        if not isinstance(body["ignore_eos"], bool):
            raise ApiError(400, "ignore_eos: expected a boolean", param="ignore_eos", code="invalid_value")
        out["ignore_eos"] = body["ignore_eos"]
    return out


def _dry_fields(body):
    """llama.cpp's ``dry_*`` fields (DRY, geniex.engine.dry)."""
    out = {}
    if body.get("dry_multiplier") is not None:
        out["dry_multiplier"] = _number(body, "dry_multiplier", 0, 1000)
    if body.get("dry_base") is not None:
        out["dry_base"] = _number(body, "dry_base", 0, 100)
    for name, low in (("dry_allowed_length", 0), ("dry_penalty_last_n", -1)):
        n = body.get(name)
        if n is not None:
            if not isinstance(n, int) or isinstance(n, bool) or not low <= n <= 1 << 20:
                raise ApiError(400, f"{name}: expected an integer from {low} to {1 << 20}, got {n!r}", param=name,
                               code="invalid_value")
            out[name] = n
    breakers = body.get("dry_sequence_breakers")
    if breakers is not None:
        if not isinstance(breakers, list) or len(breakers) > 64 or not all(isinstance(b, str) for b in breakers):
            raise ApiError(400, "dry_sequence_breakers: expected a list of at most 64 strings",
                           param="dry_sequence_breakers", code="invalid_value")
        long = [b for b in breakers if len(b) != 1]
        if long:
            raise ApiError(400, f"dry_sequence_breakers: {long[0]!r}: this server takes one-character breakers "
                           "only (a token holding the character breaks a repeat); a longer breaker, matched "
                           "across tokens by llama.cpp, cannot be honoured", param="dry_sequence_breakers",
                           code="unsupported_value")
        out["dry_sequence_breakers"] = tuple(breakers)
    return out


def logit_bias(body):
    """``logit_bias`` as ((token or text, bias), ...): ``{"id": bias}`` (OpenAI),
    ``[[id, bias]]`` or ``[["text", bias]]`` (llama.cpp: every token of the text),
    ``false`` = never. The engine checks the ids against the model's vocabulary."""
    raw = body.get("logit_bias")
    if not raw:
        return ()
    items = list(raw.items()) if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise ApiError(400, "logit_bias: expected an object or a list of [token, bias] pairs",
                       param="logit_bias", code="invalid_value")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ApiError(400, f"logit_bias[{i}]: expected [token, bias]", param="logit_bias", code="invalid_value")
        key, bias = item
        if bias is False:
            bias = -math.inf
        elif not isinstance(bias, (int, float)) or isinstance(bias, bool):
            raise ApiError(400, f"logit_bias[{i}]: the bias must be a number or false", param="logit_bias",
                           code="invalid_value")
        if isinstance(raw, dict):
            if not key.lstrip("-").isdigit():
                raise ApiError(400, f"logit_bias: {key!r} is not a token id", param="logit_bias",
                               code="invalid_value")
            key = int(key)
        elif not isinstance(key, (int, str)) or isinstance(key, bool):
            raise ApiError(400, f"logit_bias[{i}]: the token must be an id or a text", param="logit_bias",
                           code="invalid_value")
        out.append((key, float(bias)))
    return tuple(out)


def samplers(body, params):
    """Apply a ``samplers`` list (or string of letters): a sampler of ours left out of
    it is switched off; an order ours cannot run is a 400."""
    raw = body.get("samplers")
    if raw is None:
        return params
    names = [_CHARS.get(c, c) for c in raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ApiError(400, "samplers: expected a list of sampler names or a string of letters",
                       param="samplers", code="invalid_value")
    names = [_ALIASES.get(n, n) for n in names]
    ours = [n for n in names if n in CHAIN]
    unknown = [n for n in names if n not in CHAIN and n not in NEUTRAL_SAMPLERS]
    if unknown:
        raise ApiError(400, f"samplers: {unknown[0]!r} is not a sampler this server runs (it runs "
                       f"{', '.join(CHAIN)})", param="samplers", code="invalid_value")
    if ours != [n for n in CHAIN if n in ours]:
        raise ApiError(400, f"samplers: this server runs its samplers in the order {', '.join(CHAIN)}; "
                       f"{', '.join(ours)} is another order", param="samplers", code="unsupported_value")
    for name, off in _OFF.items():
        if name not in ours:
            for field, value in off.items():
                setattr(params, field, value)
    if "temperature" not in ours and params.temperature > 0:
        raise ApiError(400, "samplers: a chain without temperature samples at temperature 1 in llama.cpp; "
                       "this server samples with the temperature field: list temperature, or send "
                       "temperature 0 (greedy)", param="samplers", code="unsupported_value")
    return params


def _number(body, name, low, high):
    value = body[name]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise ApiError(400, f"{name}: expected a number from {low} to {high}, got {value!r}", param=name,
                       code="invalid_value")
    return float(value)
