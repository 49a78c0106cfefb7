"""OpenAI's response shapes (``schemas/responses.json`` documents them), built from
an answer's text and its :class:`~geniex.engine.stats.Stats`."""
import math
import time
import uuid

from geniex import __version__, profile
from geniex.engine import stops
from geniex.server.conversation import Usage

# llama.cpp's server puts its build ("b11549-...") here, and its clients check for it:
# the build of the library geniex drives, then geniex's own version.
FINGERPRINT = f"b11549-geniex-{__version__}"

def new_id(prefix, sep="-"):
    """A fresh id: ``chatcmpl-<hex>``; the Responses and Messages APIs use ``_``."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:24]}"


def usage(stats):
    """``usage`` of a response: OpenAI's counts, draft acceptance in the predicted-output
    fields when drafts were made, and llama.cpp-style ``timings`` from
    :func:`geniex.profile.timings` (which ``geniex run`` turns back into the profile)."""
    counts = Usage.of(stats)
    body = {
        "prompt_tokens": counts.prompt,
        "completion_tokens": counts.output,
        "total_tokens": counts.total,
        "prompt_tokens_details": {"cached_tokens": counts.cached},
    }
    if stats.drafted:
        body["completion_tokens_details"] = {
            "accepted_prediction_tokens": stats.accepted,
            "rejected_prediction_tokens": stats.drafted - stats.accepted,
        }
    body["timings"] = profile.timings(stats)
    return body


class Envelope:
    """The fields every object of one answer shares (id, created, model)."""

    def __init__(self, kind, model):
        self.kind = kind
        self.id = new_id("chatcmpl" if kind.startswith("chat") else "cmpl")
        self.created = int(time.time())
        self.model = model

    def wrap(self, obj, choices, **extra):
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT, "choices": choices}
        body.update(extra)
        return body


def chat_completion(env, text, stats, warnings=(), logprobs=None, reasoning="", calls=()):
    """A whole ``chat.completion``; ``logprobs`` are the answer's TokenText records (when
    asked), ``reasoning`` becomes ``message.reasoning_content`` and ``calls``
    ``message.tool_calls`` (content then null when the model wrote none)."""
    message = {"role": "assistant", "content": None if calls and not text.strip() else text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = list(calls)
    choice = {"index": 0, "message": message,
              "logprobs": chat_logprobs(logprobs), "finish_reason": stops.finish_reason(stats.stop_reason, bool(calls))}
    body = env.wrap("chat.completion", [choice], usage=usage(stats), timings=profile.timings(stats))
    if warnings:
        body["warnings"] = list(warnings)
    return body


def completion(env, text, stats, warnings=(), logprobs=None):
    """A whole ``text_completion`` (``logprobs``: the answer's TokenText records, when asked)."""
    choice = {"index": 0, "text": text, "logprobs": LegacyLogprobs().add(logprobs),
              "finish_reason": stops.finish_reason(stats.stop_reason)}
    body = env.wrap("text_completion", [choice], usage=usage(stats), timings=profile.timings(stats))
    if warnings:
        body["warnings"] = list(warnings)
    return body


def chat_chunk(env, delta, finish=None, include_usage=False, stats=None, warnings=(), logprobs=None):
    """One ``chat.completion.chunk``. The finishing one (``stats`` given) carries
    llama.cpp-style ``timings``; ``"usage": null`` is set when usage will follow, as
    OpenAI does."""
    choice = {"index": 0, "delta": delta, "logprobs": chat_logprobs(logprobs), "finish_reason": finish}
    return env.wrap("chat.completion.chunk", [choice], **_extras(include_usage, stats, warnings))


def call_deltas(index, call):
    """A tool call as OpenAI streams it: a first delta with its id, type, name and empty
    arguments, then one with the arguments (a call is sent once read whole)."""
    fn = call["function"]
    return [{"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                             "function": {"name": fn["name"], "arguments": ""}}]},
            {"tool_calls": [{"index": index, "function": {"arguments": fn["arguments"]}}]}]


def text_chunk(env, text, finish=None, include_usage=False, stats=None, logprobs=None):
    """One streamed ``text_completion``; the finishing one (``stats`` given) carries
    ``timings``; ``logprobs`` is the legacy object of the chunk's tokens."""
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
    return env.wrap("text_completion", [choice], **_extras(include_usage, stats))


def extras(event):
    """The fields an engine event adds to its stream chunk: llama.cpp's
    ``prompt_progress`` and per-token ``timings`` (when the request asked for them)."""
    out = {}
    if getattr(event, "timings", None) is not None:
        out["timings"] = event.timings
    if hasattr(event, "processed"):
        out["prompt_progress"] = {"total": event.total, "cache": event.cache, "processed": event.processed,
                                  "time_ms": event.time_ms}
    return out


def usage_chunk(env, obj, stats):
    """The last event before ``[DONE]`` with ``stream_options.include_usage``."""
    return env.wrap(obj, [], usage=usage(stats))


def _extras(include_usage, stats, warnings=()):
    extra = {}
    if include_usage:
        extra["usage"] = None
    if stats is not None:
        extra["timings"] = profile.timings(stats)
    if warnings:
        extra["warnings"] = list(warnings)
    return extra


# -- log-probabilities ------------------------------------------------------------------
# A log-probability JSON can carry: -inf is not JSON, so it is the lowest float32, as
# llama.cpp's server writes it.
LOWEST = -3.4028234663852886e38


def _lp(value):
    return value if math.isfinite(value) else LOWEST


def token_text(raw):
    """A token's bytes as text: an incomplete UTF-8 sequence (a character split across
    tokens) is left out, as llama.cpp's server does; ``bytes`` has them all."""
    return raw.decode("utf-8", errors="ignore")


def chat_logprobs(entries):
    """OpenAI's chat ``logprobs`` object of TokenText records (None: not asked)."""
    if entries is None:
        return None
    return {"content": [{"id": e.id, "token": token_text(e.bytes), "logprob": _lp(e.logprob),
                         "bytes": list(e.bytes),
                         "top_logprobs": [{"id": t, "token": token_text(b), "logprob": _lp(lp), "bytes": list(b)}
                                          for t, b, lp in e.top]}
                        for e in entries]}


def native_probs(entries):
    """llama.cpp's ``completion_probabilities`` of TokenText records."""
    return [{"id": e.id, "token": token_text(e.bytes), "bytes": list(e.bytes), "logprob": _lp(e.logprob),
             "top_logprobs": [{"id": t, "token": token_text(b), "bytes": list(b), "logprob": _lp(lp)}
                              for t, b, lp in e.top]}
            for e in entries]


class LegacyLogprobs:
    """OpenAI's completions ``logprobs`` object (``tokens``, ``token_logprobs``,
    ``top_logprobs``, ``text_offset``), built chunk by chunk: ``text_offset`` counts
    characters of the answer text from its start."""

    def __init__(self):
        self.offset = 0

    def add(self, entries):
        """The object of ``entries`` (None: not asked), continuing the offsets."""
        if entries is None:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            text = token_text(e.bytes)
            out["tokens"].append(text)
            out["token_logprobs"].append(_lp(e.logprob))
            top = {}
            for _, b, lp in e.top:
                top.setdefault(token_text(b), _lp(lp))   # two tokens of one text: the likelier
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
