"""The Flask application factory: ``create_app(config)``.

One blueprint per area (``routes/chat``, ``routes/models``, ``routes/docs``), one error
handler that maps every exception to OpenAI's error shape, CORS headers for the
configured origins. The engine side lives in ``app.extensions["geniex.answerer"]``
(an :class:`~geniex.server.answering.Answerer` with its model cache); whoever serves
the app closes that cache when the server stops (see :mod:`geniex.server.serving`).
"""
from dataclasses import dataclass, field

from flask import Flask, jsonify, request
from werkzeug.routing import PathConverter

from geniex import config as geniex_config
from geniex.server.answering import Answerer, Defaults
from geniex.server.cache import ModelCache
from geniex.server.routes import chat, docs, models
from geniex.server.validation import as_api_error

CORS_HEADERS = "Content-Type, Authorization, GenieX-KeepCache"


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
    origins: str = "*"                 # CORS: "*" or a comma list of origins


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
    app.extensions["geniex.answerer"] = Answerer(store, ModelCache(config.keepalive), config.defaults)
    for module in (chat, models, docs):
        app.register_blueprint(module.bp)

    @app.errorhandler(Exception)
    def error_answer(exc):
        err = as_api_error(exc)
        return jsonify(err.body()), err.status

    allowed = [o.strip() for o in (config.origins or "").split(",") if o.strip()]

    @app.after_request
    def cors(response):
        origin = request.headers.get("Origin")
        if "*" in allowed:
            response.headers["Access-Control-Allow-Origin"] = "*"
        elif origin and origin in allowed:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.vary.add("Origin")
        else:
            return response
        response.headers["Access-Control-Allow-Headers"] = CORS_HEADERS
        response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        return response

    return app
