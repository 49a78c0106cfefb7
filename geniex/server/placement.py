"""Where a request is answered: the model it names (resolved in the store), the
context size, the speculative setup, and the load settings and model-cache key that
follow from them, checked before any model is touched.

With ``geniex serve --fixed-load`` the load settings are the server's (as
llama-server's are fixed at start): a request that asks for other ones (``nctx``,
``ngl``, ``compute``, cache types, or a ``spec_type``/``spec_draft_model`` that needs
another draft model) is a 400 naming the field, so no client can make the server reload
its model for everyone. Without it, the other ``spec_*`` fields never reload a model
either: they are settings of one answer (geniex.speculative.per_answer).
"""
import copy
import logging
import os
from dataclasses import dataclass, field

from geniex.engine import limits
from geniex.engine.session import REQUEST_LOAD_FIELDS, load_options
from geniex.errors import GenieXError, ModelNotFound, UsageError
from geniex.llama.devices import chosen_names
from geniex.server.cache import CacheKey
from geniex.server.validation import ApiError
from geniex.speculative import options as spec_options
from geniex.speculative import per_answer

log = logging.getLogger("geniex.server")

NEVER_DOWNLOADS = "(the server never downloads models)"
STORE_ONLY = ("this server loads models from its store only: name one like org/repo[:precision] "
              "(see GET /v1/models); start it with `geniex serve --allow-paths` to load GGUF files by path")
FIXED = "this server's load settings are fixed (geniex serve --fixed-load)"
DEFAULT_CACHE_RAM = 8192 << 20      # --cache-ram's default, llama-server's (8 GiB)
DEFAULT_PARALLEL = 4                # --parallel's default, llama-server's "auto"


@dataclass
class Defaults:
    """``geniex serve`` flags that requests may override (none of the load settings
    with ``fixed_load``)."""

    nctx: int = 4096
    ngl: int = -1
    compute: str | None = None
    cache_type_k: str = "q8_0"
    cache_type_v: str = "q8_0"
    prompt_kv: str = "f16"           # how prompts are read (--prompt-kv; LoadOptions.prompt_kv)
    chat_template: str | None = None  # --chat-template: a built-in name or Jinja text (None: each model's)
    # The speculative setup of a request that sets no spec_* field (serve's --spec-* flags).
    spec: spec_options.SpecOptions = field(default_factory=spec_options.SpecOptions)
    fixed_load: bool = False         # requests may not change the load settings (--fixed-load)
    cache_ram: int = DEFAULT_CACHE_RAM   # bytes of conversations kept in host memory (--cache-ram; 0: none)
    parallel: int = DEFAULT_PARALLEL     # answers a model runs at once (--parallel): its slots
    n_predict: int | None = None     # answer length when a request sets none (None: the route's default)
    seed: int = 0                    # a sampled answer's seed when a request sets none (--seed; 0: random)
    reasoning_format: str = "auto"   # a chat request's reasoning_format when it sets none (--reasoning-format)
    reasoning: str = "auto"          # enable_thinking when a request sets none (--reasoning on/off; auto: the template's)
    reasoning_budget: int = -1       # thinking_budget_tokens when a request sets none (--reasoning-budget)
    reasoning_budget_message: str = ""   # --reasoning-budget-message
    grammar_dir: str | None = None   # the folder grammar_path names files in (None: grammar_path refused)


@dataclass
class Placement:
    """A request's model and load settings (see the module doc)."""

    target: object                   # the store's ResolvedModel
    warnings: list                   # e.g. "answered by the server's default model"
    nctx: int                        # the context size, fitted to the model and the memory budget
    spec: object                     # SpecOptions, or None for a request that never drafts
    options: object                  # the LoadOptions a load for this request uses
    key: CacheKey                    # what a resident model must match to answer it


class Placer:
    """Makes a :class:`Placement` of a request body (see the module doc).

    ``default_model`` (``geniex serve --model``, also named by ``aliases``: ``--alias``)
    answers a request that names no model,
    or a name the store does not hold, as llama.cpp's server answers with its loaded
    model whatever the request says (with a warning in the answer). Without it GenieX's
    rules hold: a name the store does not hold is a 404 saying to pull it, and a request
    that names no model gets the resident one (``resident()``; a 400 while none is).
    """

    def __init__(self, store, defaults, resident, allow_paths=False, memory_budget=None, default_model=None,
                 aliases=()):
        self.store = store
        self.defaults = defaults
        self._resident = resident
        self.allow_paths = allow_paths          # requests may name GGUF files by path
        self.memory_budget = memory_budget      # KV cache bytes (None: limits.default_budget())
        self.default_model = default_model
        self.aliases = tuple(aliases)           # more names of default_model (serve --alias)

    def place(self, body, drafting=True, lenient=False):
        """The Placement of ``body``; ``drafting``: the request drafts with its ``spec_*``
        fields (or the server's setup); ``lenient``: a request that sets no load field
        takes a resident model of that name however it is loaded (tokenize, props, ...)."""
        target, warnings = self.target(body)
        self._check_start_only(body)
        self._check_fixed(body)
        nctx = self._sized(body, target)
        spec = self.spec(body) if drafting else None
        # A fixed server loads its own drafters whoever asks first, so that a request
        # that does not draft (or drafts by n-grams) cannot make the next one reload.
        load_spec = self.spec({}) if self.defaults.fixed_load else spec
        options = load_options(vars(self.defaults), {f: body.get(f) for f in REQUEST_LOAD_FIELDS}, {"nctx": nctx},
                               spec=load_spec, data_dir=self.store.root, memory_budget=self.memory_budget,
                               cache_ram=self.defaults.cache_ram, parallel=self.defaults.parallel)
        try:
            # Devices are compared as resolved, so "cpu" and an unset compute on a
            # CPU-only library share the loaded model.
            devices = chosen_names(options.compute)
        except GenieXError as e:
            raise ApiError(400, str(e), param="compute", code="invalid_value") from None
        # The key holds only what a load makes (a draft model: per_answer.load_key); the
        # other spec_* fields are the answer's own, on the drafters as loaded. ``None``:
        # a request that does not draft, or drafts without a draft model, may use
        # whatever drafters the resident model has rather than reloading it.
        needs = None if spec is None else per_answer.load_key(spec)
        key = CacheKey(target.name, options.nctx, options.ngl, devices,
                       (options.cache_type_k, options.cache_type_v), needs or None,
                       any_load=lenient and not any(body.get(f) is not None for f in REQUEST_LOAD_FIELDS))
        return Placement(target, warnings, nctx, spec, options, key)

    def resident(self):
        """The model a request without ``model`` gets: ``--model``, else the resident one."""
        return self.default_model or self._resident()

    def resolve(self, name, param="model"):
        """``name`` as the store resolves it, by path only with ``allow_paths``. Every
        failure is a 404 whose message depends on the name alone when paths are off,
        so a request learns nothing about files outside the store."""
        if name in self.aliases:
            return self._resolve_default(self.default_model)
        try:
            return self.store.resolve(name, paths=self.allow_paths)
        except ModelNotFound as e:
            message = f"{e} {NEVER_DOWNLOADS}"
        except GenieXError as e:            # a path that is not a (regular) GGUF file
            message = str(e)
        if not self.allow_paths and looks_like_path(name):
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
            return _runnable(self._resolve_default(default)), []
        try:
            return _runnable(self.resolve(name)), []
        except ApiError as e:
            default = self.default_model
            if default is None or e.status != 404 or name == default:
                raise
        log.info("model %r is not in the store; answering with %s", name, default)
        return _runnable(self._resolve_default(default)), [
            f"model {name!r} is not in the store; answered by {default} (the server's default model)"]

    def spec(self, body):
        """The request's speculative setup: its ``spec_*`` fields, or the server's when
        it sets none; with a draft model resolved in the store."""
        if any(body.get(f.request) is not None for f in spec_options.FIELDS):
            try:
                spec = spec_options.from_request(body)
            except UsageError as e:
                # The message names the request field (from_request spells fields that way).
                raise ApiError(400, str(e), param=getattr(e, "param", None), code="invalid_value") from None
        else:
            spec = copy.copy(self.defaults.spec)
        if spec.types and spec.draft_model:
            spec.draft_path = self._draft(spec.draft_model).path
        if self.defaults.fixed_load:
            self._check_fixed_spec(spec)
        return spec

    # -- checks ------------------------------------------------------------------------
    def _check_start_only(self, body):
        """A 400 naming a load setting only the server's start sets (its threads, how it
        reads prompts), rather than an answer that ignores it; the server's own value of
        ``prompt_kv`` is accepted."""
        for name, why in (("threads", "the server decodes on every physical core"),
                          ("prompt_kv", "set when the server starts (geniex serve --prompt-kv)")):
            value = body.get(name)
            if value is None or (name == "prompt_kv" and str(value).lower() == self.defaults.prompt_kv):
                continue
            raise ApiError(400, f"{name}: {why}, not per request; leave it out", param=name, code="invalid_value")

    def _check_fixed(self, body):
        """With ``fixed_load``: a 400 naming the first load field that differs from the
        server's."""
        if not self.defaults.fixed_load:
            return
        for name in REQUEST_LOAD_FIELDS:
            value, ours = body.get(name), getattr(self.defaults, name)
            if value is None:
                continue
            same = value.lower() == (ours or "").lower() if name.startswith("cache_type") else value == ours
            if name == "compute" and not same:
                try:
                    same = chosen_names(value) == chosen_names(ours)
                except GenieXError:
                    same = False
            if not same:
                raise ApiError(400, f"{name}: {FIXED}: {name} is {ours if ours is not None else 'the default'}; "
                               "leave it out", param=name, code="load_settings_fixed")

    def _check_fixed_spec(self, spec):
        """With ``fixed_load``: a 400 for a setup that needs another draft model than the
        server's (the other spec_* fields are an answer's own: per_answer)."""
        ours = copy.copy(self.defaults.spec)
        if ours.types and ours.draft_model:
            ours.draft_path = self._draft(ours.draft_model).path
        needs = per_answer.load_key(spec)
        if not needs or needs == per_answer.load_key(ours):
            return
        same_method = ours.model_types[:1] == spec.model_types[:1]
        differing = spec_options.FIELDS[1] if same_method else spec_options.FIELDS[0]
        shown = ",".join(ours.types) or "none"
        raise ApiError(400, f"{differing.request}: {FIXED}: its speculative setup is spec_type {shown}"
                       f"{' with ' + ours.draft_model if ours.draft_model else ''}; leave spec_type and "
                       "spec_draft_model out, or send the server's (the other spec_* fields are any answer's)",
                       param=differing.request, code="load_settings_fixed")

    def _sized(self, body, target):
        """The context size, checked against the model's trained context and the memory
        budget (limits.context_size): a requested ``nctx`` beyond them is a 400; the
        server's default is cut down to the trained context."""
        explicit = body.get("nctx") is not None
        nctx = body["nctx"] if explicit else self.defaults.nctx
        try:
            return limits.context_size(target, nctx, explicit=explicit, budget=self.memory_budget,
                                       field="nctx" if explicit else "the server's --nctx",
                                       slots=self.defaults.parallel, reader=self.defaults.prompt_kv == "f16")
        except UsageError as e:
            raise ApiError(400, str(e), param="nctx", code="invalid_value") from None

    def _resolve_default(self, name):
        # The default model is the operator's (--model) or already loaded: a path is fine.
        try:
            return self.store.resolve(name, paths=True)
        except GenieXError as e:
            raise ApiError(404, f"the default model {name}: {e}", param="model", code="model_not_found") from None

    def _draft(self, name):
        if not self.allow_paths and looks_like_path(name):
            raise ApiError(404, f"resolve draft model {name}: {STORE_ONLY}", param="spec_draft_model",
                           code="model_not_found")
        try:
            return self.store.resolve(name, paths=self.allow_paths)
        except ModelNotFound as e:
            if looks_like_path(name):
                message = f"resolve draft model {name}: {e}"
            else:
                message = f"resolve draft model {name}: not found; run `geniex pull {name}` first {NEVER_DOWNLOADS}"
            raise ApiError(404, message, param="spec_draft_model", code="model_not_found") from None
        except GenieXError as e:
            raise ApiError(400, f"resolve draft model {name}: {e}", param="spec_draft_model",
                           code="invalid_value") from None


def _runnable(target):
    # open_session refuses these too, but only after the resident model was freed.
    if target.runtime != "llama_cpp":
        raise ApiError(400, f"{target.name} is a {target.runtime} model; this server runs GGUF models "
                       "(llama_cpp runtime) only", param="model", code="unsupported_model")
    return target


def looks_like_path(name):
    """Whether a model name is a file path rather than a store name."""
    return os.path.isabs(os.path.expanduser(name)) or name.lower().endswith(".gguf") or name.startswith(".")
