"""Serving the app with waitress until Ctrl-C / SIGTERM, then stopping cleanly:
the answer in flight ends at its next step, worker threads finish, the model is freed.
"""
import logging
import signal
import threading

import waitress

from geniex.errors import UsageError
from geniex.server import DEFAULT_HOST
from geniex.server.app import create_app

log = logging.getLogger("geniex.server")

# Enough workers that requests queued behind the one being answered wait for the
# model (the cache serves them in turn) instead of waiting for a free thread.
THREADS = 8


def parse_host(value):
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); port 0 = any free port."""
    text = (value or DEFAULT_HOST).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--host {value!r}: expected HOST:PORT, e.g. {DEFAULT_HOST}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def make_server(app, host, port):
    """A waitress server for ``app`` (not yet running). ``channel_request_lookahead``
    keeps reading a connection while its request runs, which is how waitress notices
    a client that went away (``waitress.client_disconnected``)."""
    return waitress.create_server(app, host=host, port=port, threads=THREADS,
                                  channel_request_lookahead=4, ident="geniex")


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
    app = create_app(config)
    cache = app.extensions["geniex.answerer"].cache
    try:
        server = make_server(app, host, port)
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
