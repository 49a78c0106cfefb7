"""From a validated request body to an answer in progress, through the engine.

Nothing here touches the model: a request becomes a task (:mod:`geniex.engine.tasks`:
which messages or prompt, how to answer), which runs on the model that the
:class:`~geniex.server.cache.ModelCache` holds for the request's load settings; the
task renders the chat template, tokenizes and runs the same loop ``geniex infer``
runs, and its events come back here. What stays here is what needs no model:
resolving names in the store, the context size, the speculative settings, and the
mapping of errors to statuses.
"""
import logging
import os
from dataclasses import dataclass

from geniex import profile
from geniex.engine import limits, tasks
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import LoadOptions, open_session
from geniex.errors import Cancelled, ContextLengthExceeded, GenieXError, ModelNotFound, UsageError
from geniex.llama.devices import chosen_names
from geniex.speculative import options as spec_options
from geniex.speculative.options import SpecOptions
from geniex.server.cache import CacheKey
from geniex.server.validation import ApiError

log = logging.getLogger("geniex.server")

CHAT_MAX_TOKENS = 2048          # max_completion_tokens default (GenieX)
COMPLETION_MAX_TOKENS = 16      # /v1/completions max_tokens default (OpenAI)
NEVER_DOWNLOADS = "(the server never downloads models)"
STORE_ONLY = ("this server loads models from its store only: name one like org/repo[:precision] "
              "(see GET /v1/models); start it with `geniex serve --allow-paths` to load GGUF files by path")


@dataclass
class Defaults:
    """``geniex serve`` flags that requests may override."""

    nctx: int = 4096
    ngl: int = -1
    compute: str | None = None
    cache_type_k: str = "q8_0"
    cache_type_v: str = "q8_0"


def _get(body, field, default):
    value = body.get(field)
    return default if value is None else value


class Answer:
    """An answer in progress under a :class:`~geniex.server.cache.Lease`: the events of
    a task run (:mod:`geniex.engine.tasks`).

    The first event is taken on creation, so a prompt that does not fit fails here,
    while an HTTP status can still say so. :meth:`pieces` yields the text as it comes;
    :meth:`close` (always called) hands the model to the next request.
    """

    def __init__(self, lease, events, model, warnings):
        self.lease = lease
        self.model = model
        self.warnings = warnings
        self.stats = None                       # the answer's Stats, once it is done
        self._events = events
        try:
            self._first = next(events, None)
        except BaseException:
            lease.release()
            raise

    def pieces(self):
        """Printable text pieces until the answer ends (``stats`` is then set)."""
        event = self._first
        while event is not None:
            if isinstance(event, tasks.Done):
                self.stats = event.stats
            elif event.text:
                yield event.text
            event = next(self._events, None)

    def text(self):
        """Consume the whole answer; returns its text."""
        return "".join(self.pieces())

    def close(self):
        """Hand the model to the next request (once), logging the answer's profile."""
        if self.stats is not None and not self.lease.released:
            log.info("%s: %s (stop: %s)", self.model, profile.line(self.stats), self.stats.stop_reason)
        self.lease.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Answerer:
    """Turns request bodies into :class:`Answer` objects (or a warm-up's None)."""

    def __init__(self, store, cache, defaults=None, allow_paths=False, memory_budget=None):
        self.store = store
        self.cache = cache
        self.defaults = defaults or Defaults()
        self.allow_paths = allow_paths          # requests may name GGUF files by path
        self.memory_budget = memory_budget      # KV cache bytes (None: limits.default_budget())

    # -- the two routes --------------------------------------------------------------
    def chat(self, body, keep_cache, cancel):
        """``/v1/chat/completions``: None for a warm-up (empty ``messages``), else an Answer."""
        target = self._target(body["model"])
        body = self._sized(body, target)
        spec = self._spec(body)
        if not body["messages"]:
            self._lease(body, target, spec, cancel).release()
            return None
        messages, warnings = chat_messages(body["messages"], target, bool(spec.types))
        task = tasks.ChatTask(messages, self._gen_options(body, _get(body, "max_completion_tokens",
                                                                      _get(body, "max_tokens", CHAT_MAX_TOKENS))),
                              tools=body.get("tools"), template_kwargs=body.get("chat_template_kwargs"),
                              keep_cache=keep_cache)
        return _start(self._lease(body, target, spec, cancel), task, cancel, target.name, warnings, "messages")

    def complete(self, body, keep_cache, cancel):
        """``/v1/completions``: the raw prompt, no template, no drafting."""
        target = self._target(body["model"])
        body = self._sized(body, target)
        prompt = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
        task = tasks.CompletionTask(prompt, self._gen_options(body, _get(body, "max_tokens", COMPLETION_MAX_TOKENS)),
                                    keep_cache=keep_cache)
        return _start(self._lease(body, target, None, cancel), task, cancel, target.name, [], "prompt")

    # -- pieces ------------------------------------------------------------------------
    def resolve(self, name, param="model"):
        """``name`` as the store resolves it, by path only with ``allow_paths``. Every
        failure is a 404 whose message depends on the name alone when paths are off,
        so a request learns nothing about files outside the store."""
        try:
            return self.store.resolve(name, paths=self.allow_paths)
        except ModelNotFound as e:
            message = f"{e} {NEVER_DOWNLOADS}"
        except GenieXError as e:            # a path that is not a (regular) GGUF file
            message = str(e)
        if not self.allow_paths and _looks_like_path(name):
            message = f"{name}: {STORE_ONLY}"
        raise ApiError(404, message, param=param, code="model_not_found")

    def _sized(self, body, target):
        """``body`` with the context size checked against the model's trained context and
        the memory budget (limits.context_size): a requested ``nctx`` beyond them is a
        400; the server's default is cut down to the trained context."""
        explicit = body.get("nctx") is not None
        nctx = _get(body, "nctx", self.defaults.nctx)
        try:
            fitted = limits.context_size(target, nctx, explicit=explicit, budget=self.memory_budget,
                                         field="nctx" if explicit else "the server's --nctx")
        except UsageError as e:
            raise ApiError(400, str(e), param="nctx", code="invalid_value") from None
        return body if fitted == nctx else {**body, "nctx": fitted}

    def _target(self, name):
        target = self.resolve(name)
        # open_session refuses these too, but only after the resident model was freed.
        if target.runtime != "llama_cpp":
            raise ApiError(400, f"{target.name} is a {target.runtime} model; this server runs GGUF models "
                           "(llama_cpp runtime) only", param="model", code="unsupported_model")
        return target

    def _spec(self, body):
        try:
            spec = spec_options.from_request(body)
        except UsageError as e:
            # The message names the request field (from_request spells fields that way).
            raise ApiError(400, str(e), param=getattr(e, "param", None), code="invalid_value") from None
        if spec.types and spec.draft_model:
            spec.draft_path = self._draft(spec.draft_model).path
        return spec

    def _draft(self, name):
        if not self.allow_paths and _looks_like_path(name):
            raise ApiError(404, f"resolve draft model {name}: {STORE_ONLY}", param="spec_draft_model",
                           code="model_not_found")
        try:
            return self.store.resolve(name, paths=self.allow_paths)
        except ModelNotFound as e:
            if _looks_like_path(name):
                message = f"resolve draft model {name}: {e}"
            else:
                message = f"resolve draft model {name}: not found; run `geniex pull {name}` first {NEVER_DOWNLOADS}"
            raise ApiError(404, message, param="spec_draft_model", code="model_not_found") from None
        except GenieXError as e:
            raise ApiError(400, f"resolve draft model {name}: {e}", param="spec_draft_model",
                           code="invalid_value") from None

    def _lease(self, body, target, spec, cancel=None):
        d = self.defaults
        options = LoadOptions(nctx=_get(body, "nctx", d.nctx), ngl=_get(body, "ngl", d.ngl),
                              compute=_get(body, "compute", d.compute),
                              cache_type_k=_get(body, "cache_type_k", d.cache_type_k).lower(),
                              cache_type_v=_get(body, "cache_type_v", d.cache_type_v).lower(),
                              data_dir=self.store.root, spec=spec or SpecOptions())
        # ``spec=None`` in the key: a completion may use whatever drafter the resident
        # model has (it does not draft), rather than reloading the model without one.
        # Devices are compared as resolved, so "cpu" and an unset compute on a CPU-only
        # library share the loaded model.
        try:
            devices = chosen_names(options.compute)
        except GenieXError as e:
            raise ApiError(400, str(e), param="compute", code="invalid_value") from None
        key = CacheKey(target.name, options.nctx, options.ngl, devices,
                       (options.cache_type_k, options.cache_type_v), None if spec is None else spec.key())
        return self.cache.lease(key, lambda: open_session(target, options), cancel)

    @staticmethod
    def _gen_options(body, max_tokens):
        stop = body.get("stop") or ()
        sampling = SamplingParams(
            temperature=_get(body, "temperature", 0.0), top_k=_get(body, "top_k", 0),
            top_p=_get(body, "top_p", 0.0), min_p=_get(body, "min_p", 0.0),
            repetition_penalty=_get(body, "repetition_penalty", 1.0),
            presence_penalty=_get(body, "presence_penalty", 0.0),
            frequency_penalty=_get(body, "frequency_penalty", 0.0), seed=_get(body, "seed", 0))
        return GenOptions(max_tokens=max_tokens, stop=(stop,) if isinstance(stop, str) else tuple(stop),
                          sampling=sampling)


def _start(lease, task, cancel, model, warnings, field):
    """Run ``task`` under ``lease`` and take its first event (an Answer), mapping the
    errors a request causes to their statuses; the lease is released on failure."""
    try:
        return Answer(lease, lease.run(task, cancel), model, warnings)
    except Cancelled as e:
        log.info("%s: request cancelled (the client went away or the server is stopping) while its "
                 "prompt was processed; stopped after %d of %d prompt tokens", model, e.done, e.total)
        raise ApiError(503, f"the request was cancelled while its prompt was processed ({e})",
                       code="request_cancelled") from None
    except ContextLengthExceeded as e:
        # The engine's message names the CLI flag; a request sets the field instead.
        raise ApiError(400, str(e).replace("--nctx", "nctx"), param=field, code="context_length_exceeded") from None
    except UsageError as e:
        raise ApiError(400, str(e), param=e.param or field, code="invalid_value") from None
    except BaseException:
        lease.release()
        raise


def chat_messages(messages, target, speculative):
    """Request messages -> messages for the template (text ``content``; ``name``,
    ``tool_calls`` and ``tool_call_id`` kept, as llama.cpp's server keeps them), and
    warnings about content that was dropped (we only run the text path)."""
    out, dropped = [], 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            texts = [p["text"] for p in content if p.get("type") == "text"]
            dropped += len(content) - len(texts)
            content = "\n".join(texts)
        role = "system" if m["role"] == "developer" else m["role"]
        # A missing or null content is an empty string, as llama.cpp's server gives it.
        msg = {"role": role, "content": content or ""}
        for key in ("name", "tool_calls", "tool_call_id"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    warnings = []
    if dropped:
        if target.type == "vlm" and speculative:
            why = "speculative decoding is text-only"
        elif target.type == "vlm":
            why = "this server runs the text path only (no multimodal projector support)"
        else:
            why = f"{target.name} is a text-only model"
        warnings.append(f"{why}: dropped {dropped} image/audio content part(s)")
        log.warning("%s", warnings[-1])
    return out, warnings


def _looks_like_path(name):
    return os.path.isabs(os.path.expanduser(name)) or name.lower().endswith(".gguf") or name.startswith(".")
