"""``/`` (-> the Swagger UI), ``/docs/``, ``/openapi.json`` and ``/health``.

The Swagger UI files come from the flask-swagger-ui package's ``dist`` folder and are
served from here, so the page works with no internet (no CDN, no online validator).
"""
import functools
import mimetypes
from pathlib import Path

import flask_swagger_ui
from flask import Blueprint, Response, abort, current_app, jsonify, redirect, request, url_for

from geniex.server import openapi

bp = Blueprint("docs", __name__)

SWAGGER_DIST = Path(flask_swagger_ui.__file__).parent / "dist"

PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="UTF-8">
  <title>geniex local server</title>
  <link rel="stylesheet" type="text/css" href="{base}/swagger-ui.css">
  <link rel="stylesheet" type="text/css" href="{base}/index.css">
  <link rel="icon" type="image/png" href="{base}/favicon-32x32.png" sizes="32x32">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{base}/swagger-ui-bundle.js"></script>
  <script src="{base}/swagger-ui-standalone-preset.js"></script>
  <script>
    window.onload = function () {{
      window.ui = SwaggerUIBundle({{
        url: "{spec}",
        dom_id: "#swagger-ui",
        deepLinking: true,
        validatorUrl: null,
        presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
        plugins: [SwaggerUIBundle.plugins.DownloadUrl],
        layout: "StandaloneLayout"
      }});
    }};
  </script>
</body>
</html>
"""


@bp.before_app_request
def _webui_off():
    """``serve --no-webui``: the page and its files are not served (the API and
    ``/openapi.json`` are)."""
    if not current_app.config["GENIEX"].webui and (request.path == "/" or request.path.startswith("/docs/")):
        abort(404)


@bp.get("/")
def root():
    """The API's home is its documentation."""
    return redirect(url_for("docs.swagger_page"))


@bp.get("/docs/")
def swagger_page():
    """The Swagger UI over :func:`openapi_json`, from local files."""
    base = url_for("docs.swagger_page").rstrip("/")
    return Response(PAGE.format(base=base, spec=url_for("docs.openapi_json")), mimetype="text/html")


@functools.cache
def _dist_files():
    """The Swagger UI's files (about 2.5 MB), read once. Served from memory so that an
    answer holds no open file: clients that pipeline requests for the bundle and never
    read would otherwise hold a file descriptor per queued answer and could exhaust the
    process's (often 1024) and with it the model's worker pipes."""
    return {p.name: p.read_bytes() for p in SWAGGER_DIST.iterdir() if p.is_file()}


@bp.get("/docs/<path:name>")
def swagger_file(name):
    data = _dist_files().get(name)
    if data is None:
        abort(404)
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Response(data, mimetype=kind, headers={"Cache-Control": "public, max-age=3600"})


@bp.get("/openapi.json")
def openapi_json():
    """The OpenAPI document, generated from ``schemas/``."""
    return jsonify(openapi.document())


@bp.get("/health")
@bp.get("/v1/health")
def health():
    """``{"status": "ok", "model": <resident model or null>, ...}``."""
    cache = current_app.extensions["geniex.answerer"].cache
    report = cache.slots() or {}
    return jsonify({"status": "ok", **cache.status(), "slot_states": report.get("slots"),
                    "prompt_cache": report.get("prompt_cache")})
