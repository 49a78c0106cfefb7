"""Serving the app with waitress until Ctrl-C / SIGTERM, then stopping cleanly:
the answer in flight ends at its next step, worker threads finish, the model is freed.
"""
import json
import logging
import signal
import threading

import waitress
from waitress.channel import HTTPChannel
from waitress.task import ErrorTask

from geniex.errors import UsageError
from geniex.server import DEFAULT_HOST
from geniex.server.app import create_app
from geniex.server.guard import is_loopback

log = logging.getLogger("geniex.server")

# Worker threads beyond the answering one and the queue (--max-queue): /health, the
# docs and the quick 503s of a full queue always find a free thread.
SPARE_THREADS = 3


def parse_host(value):
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); port 0 = any free port."""
    text = (value or DEFAULT_HOST).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--host {value!r}: expected HOST:PORT, e.g. {DEFAULT_HOST}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


class _JsonErrorTask(ErrorTask):
    """Waitress's own refusals (a malformed header, a body over its limit) in OpenAI's
    error shape, like every answer of the app, instead of plain text."""

    def execute(self):
        e = self.request.error
        body = json.dumps({"error": {
            "message": f"{e.reason}: {' '.join(str(e.body).split())}", "type": "invalid_request_error",
            "param": None, "code": e.reason.lower().replace(" ", "_")}}).encode()
        self.status = f"{e.code} {e.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _Channel(HTTPChannel):
    error_task_class = _JsonErrorTask


def make_server(app, host, port, config):
    """A waitress server for ``app`` (not yet running). ``channel_request_lookahead``
    keeps reading a connection while its request runs, which is how waitress notices
    a client that went away (``waitress.client_disconnected``). Waitress's own body
    limit sits above the app's (``MAX_CONTENT_LENGTH``, which answers a JSON 413)."""
    server = waitress.create_server(app, host=host, port=port, threads=config.max_queue + 1 + SPARE_THREADS,
                                    channel_request_lookahead=4, ident="geniex",
                                    max_request_body_size=2 * config.max_body + 65536)
    # One listening socket, or several (a name that resolved to several addresses).
    for listener in [server, *getattr(server, "map", {}).values()]:
        if hasattr(listener, "channel_class"):
            listener.channel_class = _Channel
    return server


def address(server):
    """``http://host:port`` the server actually listens on (the first, if several)."""
    if hasattr(server, "effective_listen"):     # a name that resolved to several addresses
        host, port = server.effective_listen[0][:2]
    else:
        host, port = server.effective_host, server.effective_port
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(config, host_value, announce=print):
    """Run the server in this (main) thread until interrupted; returns 0."""
    host, port = parse_host(host_value)
    config.bind_host = host
    app = create_app(config)
    cache = app.extensions["geniex.answerer"].cache
    try:
        server = make_server(app, host, port, config)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None

    def stop(signum, frame):
        # Let the answer in flight end now, then make waitress leave its loop. A
        # second signal while stopping is ignored: the shutdown is already bounded.
        if cache.stopping.is_set():
            return
        cache.stop()
        raise KeyboardInterrupt

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, stop)
    if not is_loopback(host) and not config.api_key:
        log.warning("listening on %s, beyond this machine, with no API key: anyone who can reach it can "
                    "use the server; set --api-key or GENIEX_API_KEY", host)
    announce(f"geniex server listening on {address(server)} (docs: {address(server)}/docs/); Ctrl-C to stop",
             flush=True)
    try:
        server.run()                    # returns after KeyboardInterrupt, threads joined
    finally:
        cache.close()
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.info("server stopped")
    return 0
