"""From a checked request body to an answer in progress, in order: the task and its
placement (:mod:`~geniex.server.conversation`, :mod:`~geniex.server.generation`,
:mod:`~geniex.server.placement`), a turn on the model the
:class:`~geniex.server.cache.ModelCache` holds for it, the run
(:mod:`~geniex.server.answer`). The routes read and check the request before, and
shape the answer after.

Nothing here touches the model (the task renders the chat template, tokenizes and runs
the same loop ``geniex infer`` runs, in the model's worker process), nor Flask: what a
route knows about its caller comes in a :class:`Caller`.
"""
import dataclasses
from dataclasses import dataclass
from typing import Callable

from geniex.engine import tasks
from geniex.errors import ContextLengthExceeded, UsageError
from geniex.server import answer as answers, conversation
from geniex.server.answer import request_error
from geniex.server.generation import gen_options, streaming
from geniex.server.placement import Defaults, Placer
from geniex.server.validation import ApiError
from geniex.server.worker import WorkerSession

CHAT_MAX_TOKENS = 2048          # max_completion_tokens default (GenieX)
COMPLETION_MAX_TOKENS = 16      # /v1/completions max_tokens default (OpenAI)


@dataclass
class Caller:
    """What a route knows about who asks (:func:`geniex.server.exchange.caller`)."""

    # GenieX-KeepCache: True/False reuse the cached prompt always/never; None: as the
    # engine decides (where it cannot change the answer), llama.cpp's cache_prompt default
    keep_cache: bool | None = None
    cancel: Callable | None = None             # true once the client left or the server stops
    # Whose cached conversations this request may reuse: the API key it was let in with
    # (None without keys), so that one key's cache never answers (or times) another's.
    owner: object = None
    on_wait: Callable | None = None            # hears the seconds the request waited for the model


class Answerer:
    """Turns request bodies into :class:`~geniex.server.answer.Answer` objects (or a
    warm-up's None), and runs the tasks that answer at once."""

    def __init__(self, store, cache, defaults=None, allow_paths=False, memory_budget=None,
                 default_model=None, metrics=None, request_timeout=None, load_timeout=None, aliases=()):
        self.cache = cache
        self.defaults = defaults or Defaults()
        self.placer = Placer(store, self.defaults, cache.resident, allow_paths=allow_paths,
                             memory_budget=memory_budget, default_model=default_model, aliases=aliases)
        self.metrics = metrics                  # a geniex.server.metrics.Metrics, or None
        # Seconds a request may hold the model (--request-timeout); None: the model's
        # default (WorkerSession.default_timeout), 0: no limit.
        self.request_timeout = request_timeout
        # Seconds a model load may take (--load-timeout); None: by its files' size, 0: no bound.
        self.load_timeout = load_timeout

    # -- decoding routes -------------------------------------------------------------
    def chat(self, body, caller):
        """A chat answer (``/v1/chat/completions``, ``/chat/completions``, and the
        Responses and Messages APIs once they have made a chat request): None for a
        warm-up (empty ``messages``), else an Answer."""
        place = self.placer.place(body)
        if not body["messages"]:
            self._take(place, caller).release()
            return None
        conv = conversation.read(body, place.target, bool(place.spec.types), self.defaults)
        task = conv.chat_task(gen_options(body, self.defaults, place.nctx, CHAT_MAX_TOKENS), streaming(body, place.spec))
        return self._answer(place, task, body, caller, conv.warnings, "messages")

    def complete(self, body, caller, default_max=COMPLETION_MAX_TOKENS):
        """A raw prompt, no template (``/v1/completions``, ``/completion``): text or token
        ids. It drafts only when the request asks for speculation (``spec_type``)."""
        place = self.placer.place(body, drafting=bool(body.get("spec_type")))
        task = tasks.CompletionTask(one_prompt(body.get("prompt"), "prompt"),
                                    gen_options(body, self.defaults, place.nctx, default_max),
                                    streaming=streaming(body, place.spec))
        return self._answer(place, task, body, caller, [], "prompt")

    def infill(self, body, caller):
        """``/infill``: fill in the middle with the model's FIM tokens."""
        place = self.placer.place(body, drafting=bool(body.get("spec_type")))
        prompt = body.get("prompt") or ""
        task = tasks.InfillTask(prefix=body.get("input_prefix") or "", suffix=body.get("input_suffix") or "",
                                prompt=prompt if isinstance(prompt, str) else "",
                                extra=list(body.get("input_extra") or []),
                                options=gen_options(body, self.defaults, place.nctx, CHAT_MAX_TOKENS),
                                streaming=streaming(body, place.spec))
        return self._answer(place, task, body, caller, [], "input_prefix")

    # -- routes answered at once -------------------------------------------------------
    def conversation(self, body):
        """The :class:`~geniex.server.conversation.Conversation` of a chat request, as
        an answer would see it (``/apply-template``, ``count_tokens``)."""
        target, _ = self.placer.target(body)
        return conversation.read(body, target, False, self.defaults)

    def result(self, body, task, caller):
        """Run a task that answers at once (tokenize, templates, props, embeddings,
        rerank) on the request's model: ``(data, model name, warnings)``. The resident
        model serves whatever its load settings, unless the request sets some."""
        place = self.placer.place(body, drafting=False, lenient=True)
        lease = self._take(place, caller)
        try:
            data = None
            for event in lease.run(task, caller.cancel, self.timeout(lease)):
                if isinstance(event, tasks.Result):
                    data = event.data
            return data, place.target.name, place.warnings
        except (UsageError, ContextLengthExceeded) as e:
            raise request_error(e, None) from None
        finally:
            lease.release()

    def resident(self):
        """The model a request without ``model`` gets: ``--model``, else the resident one."""
        return self.placer.resident()

    def timeout(self, lease):
        """Seconds a request may hold ``lease``'s model: ``--request-timeout``, else the
        model's default (one that fits the longest answer its context allows); None
        for no limit."""
        if self.request_timeout is not None:
            return self.request_timeout if self.request_timeout > 0 else None
        default = getattr(lease.session, "default_timeout", None)
        return default() if default is not None else None

    # -- the turn and the run ---------------------------------------------------------------
    def _take(self, place, caller):
        """A turn on the model ``place`` needs, loaded if it is not resident. The model
        loads and answers in a worker process (geniex.server.worker): an abort inside
        llama.cpp ends that process, not the server; a model switch reloads in the worker
        process of the model it replaces."""
        target, options = place.target, place.options
        lease = self.cache.lease(place.key, lambda previous: WorkerSession.open(
            target, options, previous, cancel=caller.cancel, load_timeout=self.load_timeout), caller.cancel)
        if self.metrics is not None:
            self.metrics.record_wait(lease.waited)
        if caller.on_wait is not None:
            caller.on_wait(lease.waited)
        return lease

    def _answer(self, place, task, body, caller, warnings, field):
        """``task`` answered under a turn on ``place``'s model, reusing the cached prompt
        as ``cache_prompt`` (or else GenieX-KeepCache) says, and only the caller's own."""
        keep = body.get("cache_prompt")
        if keep is not None and not isinstance(keep, bool):      # (checked before a slot is taken)
            raise ApiError(400, "cache_prompt: expected a boolean", param="cache_prompt", code="invalid_value")
        lease = self._take(place, caller)
        task = dataclasses.replace(task, keep_cache=caller.keep_cache if keep is None else keep, owner=caller.owner)
        return answers.start(lease, task, caller.cancel, self.timeout(lease), place.target.name,
                             place.warnings + warnings, self.metrics, field)


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
