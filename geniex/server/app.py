"""The Flask application factory: ``create_app(config)``.

One blueprint per area (``routes/chat``: OpenAI's chat and completions; ``routes/native``:
llama.cpp's own API; ``routes/embeddings``, ``routes/responses``, ``routes/messages``,
``routes/models``, ``routes/spec``, ``routes/docs``), one error
handler that maps every exception to OpenAI's error shape, and the guards of
:mod:`geniex.server.guard` (Host, Origin, API key, CORS for listed origins only). The engine side lives in ``app.extensions["geniex.answerer"]``
(an :class:`~geniex.server.answering.Answerer` with its model cache); whoever serves
the app closes that cache when the server stops (see :mod:`geniex.server.serving`).
"""
from dataclasses import dataclass, field

from flask import Flask, g, jsonify
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.routing import PathConverter

from geniex import config as geniex_config
from geniex.llama import libc
from geniex.server import guard, validation
from geniex.server.answering import Answerer
from geniex.server.placement import Defaults
from geniex.server.cache import ModelCache
from geniex.server.metrics import Metrics
from geniex.server.routes import chat, docs, embeddings, logits, messages, models, native, responses, spec
from geniex.server.validation import ApiError, as_api_error

DEFAULT_MAX_BODY = 8 << 20      # bytes; `geniex serve --max-body`
DEFAULT_MAX_QUEUE = 8           # requests waiting for the model; `geniex serve --max-queue`
QUEUE_WAIT_HEADER = "GenieX-Queue-Wait"     # seconds the request waited for the model


class AnyPathConverter(PathConverter):
    """Like ``path`` but may start with ``/``: ``/v1/models//abs/model.gguf``."""

    regex = ".+?"
    part_isolating = False


@dataclass
class ServerConfig:
    """What ``geniex serve`` was started with."""

    data_dir: object = None            # None = GENIEX_DATADIR or ~/.cache/geniex
    keepalive: float = 300.0
    defaults: Defaults = field(default_factory=Defaults)
    origins: str = ""                  # CORS: none by default; "*" or a comma list of origins
    allowed_hosts: str = ""            # Host names beyond loopback (comma list; "*" = any)
    api_key: str = ""                  # Bearer key every /v1 request must carry ("" = none)
    allow_paths: bool = False          # requests may name GGUF files by path
    max_body: int = DEFAULT_MAX_BODY   # request body bytes (413 above)
    max_queue: int = DEFAULT_MAX_QUEUE # requests waiting for the model (503 above)
    memory_budget: int | None = None   # KV cache bytes a context may take (None: limits' default)
    bind_host: str = ""                # the address(es) served on (also accepted as Hosts; comma list)
    model: str | None = None           # the default model (`geniex serve --model`)
    aliases: tuple = ()                # more names of the default model (--alias), as /v1/models shows it
    tags: tuple = ()                   # the default model's tags in /v1/models (--tags)
    webui: bool = True                 # the Swagger UI at / and /docs/ (--no-webui: off)
    metrics: bool = False              # GET /metrics (`--metrics`, off by default as in llama.cpp)
    slots: bool = True                 # GET /slots (`--no-slots` turns it off, as in llama.cpp)
    request_timeout: float | None = None  # seconds a request may hold the model (None: the model's default; 0: none)
    load_timeout: float | None = None  # seconds a model load may take (None: by its files' size; 0: no bound)


def create_app(config=None, store=None):
    """A ready WSGI app; ``store`` may be passed by tests (default: the data dir's)."""
    config = config or ServerConfig()
    if store is None:
        from geniex.store import Store
        store = Store(geniex_config.data_dir(config.data_dir))
    app = Flask("geniex.server", static_folder=None)
    app.json.sort_keys = False          # keep OpenAI's field order
    app.url_map.merge_slashes = False   # /v1/models//abs/path.gguf names a file
    app.url_map.converters["anypath"] = AnyPathConverter
    app.config["GENIEX"] = config
    app.config["MAX_CONTENT_LENGTH"] = config.max_body
    cache = ModelCache(config.keepalive, config.max_queue)
    app.extensions["geniex.answerer"] = Answerer(store, cache, config.defaults, allow_paths=config.allow_paths,
                                                 memory_budget=config.memory_budget, default_model=config.model,
                                                 metrics=Metrics(cache), request_timeout=config.request_timeout,
                                                 load_timeout=config.load_timeout, aliases=config.aliases)
    for module in (chat, native, embeddings, logits, responses, messages, models, spec, docs):
        app.register_blueprint(module.bp)
    # The request schemas are read now: a broken install fails at start, and no request
    # depends on opening files (a flood of connections may have used up descriptors).
    validation.schemas()

    @app.errorhandler(Exception)
    def error_answer(exc):
        if isinstance(exc, RequestEntityTooLarge):
            exc = ApiError(413, f"the request body is larger than this server's limit of {config.max_body} bytes "
                           "(geniex serve --max-body)", code="request_too_large")
        err = as_api_error(exc)
        metrics = app.extensions["geniex.answerer"].metrics
        if metrics is not None:
            metrics.record_failure(err.code)
        return jsonify(err.body()), err.status, err.headers

    @app.teardown_request
    def give_memory_back(exc):
        # A burst of large bodies leaves the heap at its peak unless it is trimmed.
        if g.get("geniex_big_body"):
            libc.malloc_trim()

    @app.after_request
    def queue_wait(response):
        # How long the request waited for the model, in seconds (docs/isolation.md).
        waited = g.get("geniex_queue_wait")
        if waited is not None:
            response.headers[QUEUE_WAIT_HEADER] = f"{waited:.3f}"
        return response

    guard.install(app, config)
    return app
