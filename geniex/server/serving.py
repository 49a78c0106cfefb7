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


def parse_hosts(value, port=None):
    """``--host`` with several addresses, comma separated (``127.0.0.1,::1`` with
    ``--port``, or ``127.0.0.1:8080,[::1]:8080``) -> [(host, port)]. An address without
    a port takes ``port``, else the port another address names."""
    items = [part.strip() for part in (value or DEFAULT_HOST).split(",") if part.strip()]
    parsed = []
    for item in items:
        bare_v6 = item.count(":") > 1 and not item.startswith("[")
        host, sep, tail = ("", "", "") if bare_v6 else item.rpartition(":")
        if bare_v6 or not sep:
            parsed.append((item.strip("[]"), None))
        else:
            parsed.append(parse_host(item))
    named = [p for _, p in parsed if p is not None]
    fallback = port if port is not None else (named[0] if named else None)
    if fallback is None:
        raise UsageError(f"--host {value!r}: expected HOST:PORT, e.g. {DEFAULT_HOST} (or give --port)")
    return [(host, fallback if p is None or port is not None else p) for host, p in parsed]


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


def make_server(app, host, port, config, also=()):
    """A waitress server for ``app`` (not yet running), on ``host:port`` and the
    ``also`` (host, port) pairs. ``channel_request_lookahead`` keeps reading a
    connection while its request runs, which is how waitress notices a client that went
    away (``waitress.client_disconnected``). Waitress's own body limit sits above the
    app's (``MAX_CONTENT_LENGTH``, which answers a JSON 413)."""
    where = {"host": host, "port": port}
    if also:
        where = {"listen": " ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in [(host, port), *also])}
    server = waitress.create_server(app, threads=config.max_queue + 1 + SPARE_THREADS,
                                    channel_request_lookahead=4, ident="geniex",
                                    max_request_body_size=2 * config.max_body + 65536, **where)
    # One listening socket, or several (a name that resolved to several addresses).
    for listener in [server, *getattr(server, "map", {}).values()]:
        if hasattr(listener, "channel_class"):
            listener.channel_class = _Channel
    return server


def addresses_of(server):
    """Every ``http://host:port`` the server listens on."""
    if hasattr(server, "effective_listen"):     # several sockets
        pairs = [pair[:2] for pair in server.effective_listen]
    else:
        pairs = [(server.effective_host, server.effective_port)]
    return [f"http://[{h}]:{p}" if ":" in h else f"http://{h}:{p}" for h, p in pairs]


def address(server):
    """``http://host:port`` the server actually listens on (the first, if several)."""
    return addresses_of(server)[0]


def serve(config, host_value, announce=print, port=None):
    """Run the server in this (main) thread until interrupted; returns 0. ``host_value``
    may list several addresses (:func:`parse_hosts`)."""
    addresses = parse_hosts(host_value, port)
    (host, port), also = addresses[0], addresses[1:]
    config.bind_host = ",".join(h for h, _ in addresses)
    app = create_app(config)
    cache = app.extensions["geniex.answerer"].cache
    try:
        server = make_server(app, host, port, config, also)
    except OSError as e:
        raise UsageError(f"cannot listen on {host_value}: {e.strerror or e}") from None

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
    for bound, _ in addresses:
        if not is_loopback(bound) and not config.api_key:
            log.warning("listening on %s, beyond this machine, with no API key: anyone who can reach it can "
                        "use the server; set --api-key or GENIEX_API_KEY", bound)
    more = "".join(f" and {a}" for a in addresses_of(server)[1:])
    announce(f"geniex server listening on {address(server)}{more} (docs: {address(server)}/docs/); Ctrl-C to stop",
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
