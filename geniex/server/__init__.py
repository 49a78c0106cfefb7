"""The OpenAI-compatible local server (``geniex serve``).

``geniex.server.app.create_app(config)`` builds the Flask app;
``geniex.server.serving.serve`` runs it with waitress until Ctrl-C / SIGTERM.
Requests go: route (``routes/``) -> schema check (``validation``) -> model cache
(``cache``, keyed by model, load options and ``spec_*``) -> the engine's Session and
loop (``answering``) -> JSON or server-sent events (``shapes``, ``sse``).

This package's ``__init__`` stays import-free so the CLI can read :data:`DEFAULT_HOST`
without loading Flask.
"""
DEFAULT_HOST = "127.0.0.1:18181"
