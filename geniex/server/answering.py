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

from flask import g, has_request_context

from geniex import profile
from geniex.engine import limits, tasks
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import load_options
from geniex.engine.toolcalls import tools as agent
from geniex.errors import Cancelled, ContextLengthExceeded, GenieXError, ModelNotFound, UsageError
from geniex.llama.devices import chosen_names
from geniex.speculative import options as spec_options
from geniex.server import grammar_fields, llama_fields
from geniex.server.cache import CacheKey
from geniex.server.validation import ApiError
from geniex.server.worker import WorkerSession

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
    n_predict: int | None = None     # answer length when a request sets none (None: the route's default)
    reasoning_format: str = "auto"   # a chat request's reasoning_format when it sets none (--reasoning-format)
    reasoning_budget: int = -1       # thinking_budget_tokens when a request sets none (--reasoning-budget)
    reasoning_budget_message: str = ""   # --reasoning-budget-message
    grammar_dir: str | None = None   # the folder grammar_path names files in (None: grammar_path refused)


def _get(body, field, default):
    value = body.get(field)
    return default if value is None else value


class Answer:
    """An answer in progress under a :class:`~geniex.server.cache.Lease`: the events of
    a task run (:mod:`geniex.engine.tasks`).

    The first event is taken on creation, so a prompt that does not fit fails here,
    while an HTTP status can still say so. :meth:`events` yields the answer's Piece
    and Progress events (:meth:`pieces` its text) as they come; :meth:`close` (always
    called) hands the model to the next request and counts the answer in the metrics.
    """

    def __init__(self, lease, events, model, warnings, metrics=None):
        self.lease = lease
        self.model = model
        self.warnings = warnings
        self.stats = None                       # the answer's Stats, once it is done
        self.tokens = []                        # the answer's tokens so far
        self.reasoning = []                     # reasoning text pieces so far (chat answers)
        self.calls = []                         # tool calls so far (OpenAI tool_calls items)
        self.logit_bias = ()                    # as sampled: ((token, bias), ...)
        self.logprobs = None                    # [TokenText] so far, when the request asked for them
        self._metrics = metrics
        self._events = events
        try:
            self._first = next(events, None)
        except BaseException:
            lease.release()
            raise

    def events(self):
        """Piece and Progress events until the answer ends (``stats`` is then set)."""
        event = self._first
        while event is not None:
            if isinstance(event, tasks.Done):
                self.stats = event.stats
                self.logit_bias = event.logit_bias
            elif isinstance(event, tasks.Progress):
                yield event
            elif event.text or event.tokens or getattr(event, "reasoning", "") or getattr(event, "calls", None):
                self.tokens.extend(event.tokens)
                if self.logprobs is not None and event.logprobs:
                    self.logprobs.extend(event.logprobs)
                if getattr(event, "reasoning", ""):
                    self.reasoning.append(event.reasoning)
                self.calls.extend(getattr(event, "calls", None) or ())
                yield event
            event = next(self._events, None)

    def pieces(self):
        """Printable text pieces until the answer ends (``stats`` is then set)."""
        for event in self.events():
            if isinstance(event, tasks.Piece) and event.text:
                yield event.text

    def text(self):
        """Consume the whole answer; returns its text."""
        return "".join(self.pieces())

    def close(self):
        """Hand the model to the next request (once), logging the answer's profile; an
        answer left before its end is stopped first."""
        close_events = getattr(self._events, "close", None)
        if close_events is not None and not self.lease.released:
            close_events()
        if self.stats is not None and not self.lease.released:
            log.info("%s: %s (stop: %s)", self.model, profile.line(self.stats), self.stats.stop_reason)
            if self._metrics is not None:
                self._metrics.record(self.stats)
        self.lease.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Answerer:
    """Turns request bodies into :class:`Answer` objects (or a warm-up's None).

    ``default_model`` (``geniex serve --model``) answers a request that names no model,
    or a name the store does not hold, as llama.cpp's server answers with its loaded
    model whatever the request says (with a warning in the answer). Without it GenieX's
    rules hold: a name the store does not hold is a 404 saying to pull it, and a request
    that names no model gets the resident one (a 400 while none is loaded).
    """

    def __init__(self, store, cache, defaults=None, allow_paths=False, memory_budget=None,
                 default_model=None, metrics=None, request_timeout=None):
        self.store = store
        self.cache = cache
        self.defaults = defaults or Defaults()
        self.allow_paths = allow_paths          # requests may name GGUF files by path
        self.memory_budget = memory_budget      # KV cache bytes (None: limits.default_budget())
        self.default_model = default_model
        self.metrics = metrics                  # a geniex.server.metrics.Metrics, or None
        # Seconds a request may hold the model (--request-timeout); None: the model's
        # default (WorkerSession.default_timeout), 0: no limit.
        self.request_timeout = request_timeout

    # -- decoding routes -------------------------------------------------------------
    def chat(self, body, keep_cache, cancel):
        """A chat answer (``/v1/chat/completions``, ``/chat/completions``, and the
        Responses and Messages APIs once they have made messages): None for a warm-up
        (empty ``messages``), else an Answer."""
        target, warnings = self.target(body)
        body = self._sized(body, target)
        spec = self._spec(body)
        if not body["messages"]:
            self._lease(body, target, spec, cancel).release()
            return None
        messages, dropped = chat_messages(body["messages"], target, bool(spec.types))
        continue_final, add_prompt = continuation(body, messages)
        agent = self.agent_fields(body)
        task = tasks.ChatTask(messages, self._gen_options(body, CHAT_MAX_TOKENS),
                              keep_cache=keep_cache or body.get("cache_prompt") is True,
                              continue_final=continue_final, add_generation_prompt=add_prompt,
                              streaming=_streaming(body, True), **agent)
        return self._start(self._lease(body, target, spec, cancel), task, cancel, target.name,
                           warnings + dropped, "messages")

    def agent_fields(self, body):
        """The ChatTask fields of a request's tools, tool_choice, parallel_tool_calls,
        reasoning_format, enable_think and chat_template_kwargs, checked (a 400 naming
        the field) before any model is touched."""
        try:
            tools = agent.check_tools(body.get("tools"))
            choice = agent.check_tool_choice(body.get("tool_choice"), tools)
            fmt = body.get("reasoning_format")
            fmt = agent.check_reasoning_format(self.defaults.reasoning_format if fmt is None else fmt)
            kwargs = agent.template_kwargs(body.get("chat_template_kwargs"), body.get("enable_think"))
        except UsageError as e:
            raise ApiError(400, str(e), param=e.param, code="invalid_value") from None
        if tools and choice not in ("auto", "none") and _constrained(body):
            raise ApiError(400, "tool_choice: a required or named tool choice constrains the answer to calls, so "
                           "it cannot be combined with response_format or a grammar", param="tool_choice",
                           code="invalid_value")
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise ApiError(400, "parallel_tool_calls: expected a boolean", param="parallel_tool_calls",
                           code="invalid_value")
        budget = body.get("thinking_budget_tokens")
        constrained = _constrained(body) or bool(tools) and choice not in ("auto", "none")
        if budget is None:
            # The server's default budget holds free answers only: a constrained one
            # (a grammar, a required call) is held by its grammar instead.
            budget = -1 if constrained else self.defaults.reasoning_budget
        elif budget >= 0 and constrained:
            raise ApiError(400, "thinking_budget_tokens: a reasoning budget cannot be combined with "
                           "response_format, a grammar or a required tool choice (the answer would be "
                           "constrained twice)", param="thinking_budget_tokens", code="invalid_value")
        return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel is not False,
                "reasoning_format": fmt, "template_kwargs": kwargs,
                "reasoning_budget": budget,
                "reasoning_budget_message": self.defaults.reasoning_budget_message}

    def complete(self, body, keep_cache, cancel, default_max=COMPLETION_MAX_TOKENS):
        """A raw prompt, no template (``/v1/completions``, ``/completion``): text or token
        ids. It drafts only when the request asks for speculation (``spec_type``)."""
        target, warnings = self.target(body)
        body = self._sized(body, target)
        spec = self._spec(body) if body.get("spec_type") else None
        task = tasks.CompletionTask(one_prompt(body.get("prompt"), "prompt"),
                                    self._gen_options(body, default_max),
                                    keep_cache=keep_cache or body.get("cache_prompt") is True,
                                    streaming=_streaming(body, spec is not None))
        return self._start(self._lease(body, target, spec, cancel), task, cancel, target.name, warnings, "prompt")

    def infill(self, body, keep_cache, cancel):
        """``/infill``: fill in the middle with the model's FIM tokens."""
        target, warnings = self.target(body)
        body = self._sized(body, target)
        spec = self._spec(body) if body.get("spec_type") else None
        prompt = body.get("prompt") or ""
        task = tasks.InfillTask(prefix=body.get("input_prefix") or "", suffix=body.get("input_suffix") or "",
                                prompt=prompt if isinstance(prompt, str) else "",
                                extra=list(body.get("input_extra") or []),
                                options=self._gen_options(body, CHAT_MAX_TOKENS),
                                keep_cache=keep_cache or body.get("cache_prompt") is True,
                                streaming=_streaming(body, spec is not None))
        return self._start(self._lease(body, target, spec, cancel), task, cancel, target.name, warnings,
                           "input_prefix")

    # -- routes answered at once -------------------------------------------------------
    def result(self, body, task, cancel=None):
        """Run a task that answers at once (tokenize, templates, props, embeddings,
        rerank) on the request's model: ``(data, model name, warnings)``. The resident
        model serves whatever its load settings, unless the request sets some."""
        target, warnings = self.target(body)
        lease = self._lease(body, target, None, cancel, lenient=True)
        try:
            data = None
            for event in lease.run(task, cancel, self.timeout(lease)):
                if isinstance(event, tasks.Result):
                    data = event.data
            return data, target.name, warnings
        except (UsageError, ContextLengthExceeded) as e:
            raise _request_error(e, None) from None
        finally:
            lease.release()

    def resident(self):
        """The model a request without ``model`` gets: ``--model``, else the resident one."""
        return self.default_model or self.cache.resident()

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

    def target(self, body):
        """The model a request is answered by and the warnings that go with it."""
        name = body.get("model")
        default = self.resident()
        if not name:
            if default is None:
                raise ApiError(400, "model: required: name a stored model (see GET /v1/models), or start the "
                               "server with --model NAME to answer requests that name none", param="model",
                               code="model_required")
            return self._runnable(self._resolve_default(default)), []
        try:
            return self._runnable(self.resolve(name)), []
        except ApiError as e:
            default = self.default_model
            if default is None or e.status != 404 or name == default:
                raise
        log.info("model %r is not in the store; answering with %s", name, default)
        return self._runnable(self._resolve_default(default)), [
            f"model {name!r} is not in the store; answered by {default} (the server's default model)"]

    def _resolve_default(self, name):
        # The default model is the operator's (--model) or already loaded: a path is fine.
        try:
            return self.store.resolve(name, paths=True)
        except GenieXError as e:
            raise ApiError(404, f"the default model {name}: {e}", param="model", code="model_not_found") from None

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

    @staticmethod
    def _runnable(target):
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

    def _lease(self, body, target, spec, cancel=None, lenient=False):
        options = load_options(vars(self.defaults), {f: body.get(f) for f in LOAD_FIELDS}, spec=spec,
                               data_dir=self.store.root, memory_budget=self.memory_budget)
        # ``spec=None`` in the key: a completion may use whatever drafter the resident
        # model has (it does not draft), rather than reloading the model without one.
        # Devices are compared as resolved, so "cpu" and an unset compute on a CPU-only
        # library share the loaded model. ``lenient``: a request that sets no load field
        # takes the resident model of that name as it is loaded.
        try:
            devices = chosen_names(options.compute)
        except GenieXError as e:
            raise ApiError(400, str(e), param="compute", code="invalid_value") from None
        key = CacheKey(target.name, options.nctx, options.ngl, devices,
                       (options.cache_type_k, options.cache_type_v), None if spec is None else spec.key(),
                       any_load=lenient and not any(body.get(f) is not None for f in LOAD_FIELDS))
        # The model loads and answers in a worker process (geniex.server.worker): an
        # abort inside llama.cpp ends that process, not the server.
        # A model switch reloads in the worker process of the model it replaces.
        lease = self.cache.lease(key, lambda previous: WorkerSession.open(target, options, previous), cancel)
        if self.metrics is not None:
            self.metrics.record_wait(lease.waited)
        if has_request_context():
            g.geniex_queue_wait = lease.waited      # the GenieX-Queue-Wait header (app.py)
        return lease

    def timeout(self, lease):
        """Seconds a request may hold ``lease``'s model: ``--request-timeout``, else the
        model's default (one that fits the longest answer its context allows); None
        for no limit."""
        if self.request_timeout is not None:
            return self.request_timeout if self.request_timeout > 0 else None
        default = getattr(lease.session, "default_timeout", None)
        return default() if default is not None else None

    def _gen_options(self, body, default_max):
        llama_fields.check_unsupported(body)
        stop = body.get("stop") or ()
        sampling = SamplingParams(
            temperature=_get(body, "temperature", 0.0), top_k=_get(body, "top_k", 0),
            top_p=_get(body, "top_p", 0.0), min_p=_get(body, "min_p", 0.0),
            repetition_penalty=_get(body, "repetition_penalty", 1.0),
            presence_penalty=_get(body, "presence_penalty", 0.0),
            frequency_penalty=_get(body, "frequency_penalty", 0.0), seed=_get(body, "seed", 0),
            logit_bias=llama_fields.logit_bias(body))
        for name, value in llama_fields.sampling_fields(body).items():
            setattr(sampling, name, value)
        sampling = llama_fields.samplers(body, sampling)
        nctx = _get(body, "nctx", self.defaults.nctx)
        if sampling.penalty_last_n == -1:
            sampling.penalty_last_n = nctx
        if sampling.dry_penalty_last_n == -1:
            sampling.dry_penalty_last_n = nctx
        if self.defaults.n_predict is not None:
            default_max = nctx if self.defaults.n_predict < 0 else self.defaults.n_predict
        return GenOptions(max_tokens=llama_fields.max_tokens(body, default_max, nctx),
                          stop=(stop,) if isinstance(stop, str) else tuple(stop), sampling=sampling,
                          grammar=grammar_fields.grammar_of(body, self.defaults.grammar_dir),
                          logprobs=llama_fields.logprobs(body), prediction=_prediction(body))

    def _start(self, lease, task, cancel, model, warnings, field):
        """Run ``task`` under ``lease`` and take its first event (an Answer), mapping the
        errors a request causes to their statuses; the lease is released on failure."""
        try:
            answer = Answer(lease, lease.run(task, cancel, self.timeout(lease)), model, warnings, self.metrics)
            answer.task = task
            if task.options.logprobs is not None:
                answer.logprobs = []
            return answer
        except Cancelled as e:
            log.info("%s: request cancelled (the client went away or the server is stopping) while its "
                     "prompt was processed; stopped after %d of %d prompt tokens", model, e.done, e.total)
            raise ApiError(503, f"the request was cancelled while its prompt was processed ({e})",
                           code="request_cancelled") from None
        except (ContextLengthExceeded, UsageError) as e:
            raise _request_error(e, field) from None


def _prediction(body):
    """The text of OpenAI's ``prediction`` (``{"type": "content", "content": text or
    text parts}``, checked by the schema), or None."""
    pred = body.get("prediction")
    if not pred:
        return None
    content = pred.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content)
    return content or None


def _constrained(body):
    """Whether a request constrains its answer with a grammar field (text is no constraint)."""
    for name in grammar_fields.FIELDS:
        value = body.get(name)
        if value in (None, "", {}):
            continue
        if name == "response_format" and isinstance(value, dict) and value.get("type") == "text":
            continue
        return True
    return False


LOAD_FIELDS = ("nctx", "ngl", "compute", "cache_type_k", "cache_type_v")


def _request_error(e, field):
    """An engine error a request caused -> its ApiError (llama.cpp's shape for a prompt
    that does not fit: ``exceed_context_size_error`` with both counts)."""
    if isinstance(e, ContextLengthExceeded):
        # The engine's message names the CLI flag; a request sets the field instead.
        return ApiError(400, str(e).replace("--nctx", "nctx"), param=field, code="context_length_exceeded",
                        type_="exceed_context_size_error",
                        extra={"n_prompt_tokens": e.n_prompt_tokens, "n_ctx": e.n_ctx})
    return ApiError(400, str(e), param=e.param or field, code="invalid_value")


def _streaming(body, speculative):
    """What a decoding task reports besides its text, from llama.cpp's stream fields."""
    stream = bool(body.get("stream"))
    return tasks.Streaming(speculative=speculative, stream=stream,
                           progress=stream and body.get("return_progress") is True,
                           timings_per_token=body.get("timings_per_token") is True)


def one_prompt(prompt, field):
    """A request's prompt as the engine takes it: text, or a list of token ids (also a
    list holding one text or one token list, or a list mixing text and ids)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return prompt
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            return one_prompt(prompt[0], field)
        raise ApiError(400, f"{field}: this server answers one prompt per request (got {len(prompt)})",
                       param=field, code="invalid_value")
    raise ApiError(400, f"{field}: expected a text, a list of token ids, or a list of one of them",
                   param=field, code="invalid_value")


def continuation(body, messages):
    """``(continue_final, add_generation_prompt)`` as llama.cpp's server decides them: a
    conversation ending with an assistant message is continued (assistant prefill);
    two trailing assistant messages, or ``continue_final_message`` with
    ``add_generation_prompt``, are refused."""
    add_prompt = body.get("add_generation_prompt")
    add_prompt = True if add_prompt is None else add_prompt
    final = body.get("continue_final_message")
    if not isinstance(add_prompt, bool) or (final is not None and not isinstance(final, bool)):
        bad = "add_generation_prompt" if not isinstance(add_prompt, bool) else "continue_final_message"
        raise ApiError(400, f"{bad}: expected a boolean", param=bad, code="invalid_value")
    last_is_assistant = bool(messages) and messages[-1]["role"] == "assistant"
    if final is None and last_is_assistant:
        if len(messages) >= 2 and messages[-2]["role"] == "assistant":
            raise ApiError(400, "messages: cannot have 2 or more assistant messages at the end of the list",
                           param="messages", code="invalid_value")
        return True, False
    if final and add_prompt:
        raise ApiError(400, "cannot set both add_generation_prompt and continue_final_message to true",
                       param="continue_final_message", code="invalid_value")
    if final and not last_is_assistant:
        raise ApiError(400, "continue_final_message: the last message is not an assistant message",
                       param="continue_final_message", code="invalid_value")
    return bool(final), add_prompt


def chat_messages(messages, target, speculative):
    """Request messages -> messages for the template (text ``content``; ``name``,
    ``tool_calls``, ``tool_call_id`` and an assistant's ``reasoning_content`` kept, as
    llama.cpp's server keeps them), and
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
        for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
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
