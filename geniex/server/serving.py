"""Serving the app with waitress until Ctrl-C / SIGTERM, then stopping cleanly:
the answer in flight ends at its next step and reaches its client, worker threads
finish, the model (and its worker process) is freed.

Clients cannot hold the server (docs/isolation.md, Limits): waitress reads and writes
every connection from one event loop, so an open connection costs a socket, not a
thread; this module bounds what a connection may hold on to: how many are open
(:data:`CONNECTION_LIMIT`), how long one may stay idle (:data:`IDLE_TIMEOUT`) or take to
send its request (:data:`READ_TIMEOUT`), and what happens when a client stops reading
its answers (:class:`_Channel`: no worker thread waits for it; it is closed after
:data:`SEND_STALL` seconds without progress).

Waitress has no public way to do most of this: beyond its documented API
(``create_server`` and its settings, ``run``, ``close``, ``effective_host``/``_port``/
``_listen`` and ``environ["waitress.client_disconnected"]``) this module overrides or
reaches, and setup.cfg therefore pins waitress to the releases it was written against
(tests/server/test_waitress_overrides.py checks each by what it does):

- ``HTTPChannel``, subclassed and set as each listener's ``channel_class``, with
  ``error_task_class`` (an ``ErrorTask`` whose ``execute`` writes the error): its own
  error pages are plain text;
- ``HTTPChannel.received`` (when a request started to arrive) and each listener's
  ``maintenance(now)``, replaced, over ``active_channels`` and each channel's
  ``last_activity``, ``requests``, ``will_close``: waitress bounds idleness only
  (``channel_timeout``), not the time a request takes to arrive;
- ``HTTPChannel.service``, ``write_soon`` and ``_flush_outbufs_below_high_watermark``
  (with ``outbuf_lock``, ``total_outbufs_len``, ``_flush_exception``, ``_flush_some``,
  ``server.add_task``): waitress waits for a client that does not read, in a worker
  thread and without a bound;
- a reset from the event loop (``server.trigger.pull_trigger(thunk)``,
  ``handle_close``, ``socket``, ``_map``, ``_fileno``, ``requests_lock``): waitress
  closes a connection only once its socket can take more bytes;
- a stop (:class:`_Stopper`, :func:`close_all`): the loop's map (``server.map`` or
  ``_map``) and trigger, listeners' ``accepting`` and ``del_channel``, and the
  ``task_dispatcher``'s ``active_count``, ``queue`` and ``shutdown``: waitress has no
  graceful stop.
"""
import json
import logging
import os
import signal
import socket
import struct
import threading
import time

import waitress
from waitress.channel import ClientDisconnected, HTTPChannel
from waitress.task import ErrorTask
from waitress.trigger import trigger as Trigger

from geniex.errors import UsageError
from geniex.server import DEFAULT_HOST
from geniex.server.app import create_app
from geniex.server.guard import is_loopback

log = logging.getLogger("geniex.server")

# Worker threads beyond the answering one and the queue (--max-queue): /health, the
# docs and the quick 503s of a full queue always find a free thread.
SPARE_THREADS = 3
CONNECTION_LIMIT = 1024     # open connections (waitress's default, 100, a few clients could fill)
FILE_RESERVE = 128          # file descriptors never given to connections (see make_server)
# Unread output a connection may hold before its next pipelined request waits (and a
# write waits for the client): about one answer, so a client that asks and never reads
# holds little memory. Below OUTPUT_IN_MEMORY it stays in memory: waitress's temporary
# files cost a descriptor each and a flood of never-reading clients ran out of them.
OUTPUT_HELD = 1 << 20
OUTPUT_IN_MEMORY = 8 << 20
IDLE_TIMEOUT = 30.0         # seconds a connection may stay idle between requests
READ_TIMEOUT = 30.0         # seconds a request's headers and body may take to arrive
SEND_STALL = 30.0           # seconds a client may go without reading what it asked for
CLEANUP_INTERVAL = 1.0      # seconds between the checks of these bounds
# SO_LINGER on, 0 seconds: close() resets the connection, dropping unsent output
# (struct linger is two ints on POSIX, two unsigned shorts on Windows).
_ABORT = struct.pack("HH" if os.name == "nt" else "ii", 1, 0)
SHUTDOWN_WAIT = 30.0        # seconds a stopping server waits for answers to end and reach their clients


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
    """A waitress connection that a client cannot use to hold a worker thread.

    Waitress waits in a worker thread until the client has read enough of what it was
    sent (the output over ``outbuf_high_watermark``) before it answers the next
    pipelined request, and while an answer is written; a client that never reads held
    that thread forever (13 such clients held all of them). Here the next request
    waits without a thread (:meth:`service` returns; the event loop's maintenance
    resumes it once the client has read), and a write waits at most
    :data:`SEND_STALL` seconds without progress before the connection is closed.
    """

    error_task_class = _JsonErrorTask
    paused = False              # a pipelined request waits for the client to read
    reading_since = None        # when the request being received started to arrive
    _writing = False
    _stalled_since = None

    def received(self, data):
        before = self.request
        result = super().received(data)
        if self.request is None:
            self.reading_since = None
        elif self.request is not before:
            self.reading_since = time.monotonic()
        return result

    def service(self):
        if self.connected and self.total_outbufs_len > self.adj.outbuf_high_watermark:
            self.paused = True              # resumed by _maintenance once the client has read
            self.server.pull_trigger()
            return
        try:
            super().service()
        except ClientDisconnected:
            self._drop()

    def write_soon(self, data):
        self._writing = True
        try:
            return super().write_soon(data)
        finally:
            self._writing = False

    def _flush_outbufs_below_high_watermark(self):
        # Between pipelined requests (not writing): no wait here, service() pauses the
        # next one instead. While writing: wait as waitress does, but not forever.
        if not self._writing or self.total_outbufs_len <= self.adj.outbuf_high_watermark:
            return
        with self.outbuf_lock:
            self._flush_exception(self._flush_some, do_close=False)
            last, since = self.total_outbufs_len, time.monotonic()
            while self.connected and self.total_outbufs_len > self.adj.outbuf_high_watermark:
                self.server.pull_trigger()
                self.outbuf_lock.wait(CLEANUP_INTERVAL)
                if self.total_outbufs_len < last:
                    last, since = self.total_outbufs_len, time.monotonic()
                elif time.monotonic() - since > SEND_STALL:
                    # Waitress catches this in its service() and only marks the
                    # connection to close once flushed, which a client that does not
                    # read never lets happen: it is reset from the loop instead. (Not
                    # _drop: its requests lock is taken before this one elsewhere.)
                    log.info("closing a connection from %s: it read nothing for %.0f s", self.addr, SEND_STALL)
                    self._reset_soon()
                    raise ClientDisconnected

    def _drop(self):
        """Give up on this client: its requests are cancelled and the connection is
        closed at once, its unsent output discarded. ``will_close`` alone is not enough:
        waitress closes a connection in ``handle_write``, which runs only once the socket
        can take more bytes, never for a client that stopped reading (it lived on,
        trickling output, until the kernel gave up). The close runs in the event loop's
        thread (a trigger thunk, after its select): closing from here or inside the
        maintenance pass changed the socket map while the loop was using it."""
        with self.requests_lock:
            for request in self.requests:
                request.close()
            self.requests = []
        self._reset_soon()

    def _reset_soon(self):
        self.will_close = True
        try:
            self.server.trigger.pull_trigger(self._close_now)
        except OSError:             # the loop has ended: server.close() closes the channel
            pass

    def _close_now(self):
        if self._fileno is None or self.socket is None or self._map.get(self._fileno) is not self:
            return                  # already closed (dropped twice, or by the loop itself)
        # An abortive close (a reset): a plain close leaves what the kernel still holds
        # for the client (megabytes of send buffer on loopback) to trickle out to a
        # client that reads slowly, for minutes; the client reads what it received, then
        # sees the connection reset instead of an end.
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
        except OSError:
            pass
        self.handle_close()

    def check_bounds(self, now, idle_cutoff):
        """Called by the event loop every :data:`CLEANUP_INTERVAL`: close a connection
        idle too long, one whose request takes too long to arrive, or one that stopped
        reading; resume a paused one whose client has read."""
        mono = time.monotonic()
        if self.paused:
            if self.total_outbufs_len <= self.adj.outbuf_high_watermark:
                self.paused = False
                self._stalled_since = None
                if self.connected and self.requests:
                    self.server.add_task(self)
                return
            if self._stalled_since is None or self.last_activity > self._stalled_since[1]:
                self._stalled_since = (mono, self.last_activity)
            elif mono - self._stalled_since[0] > SEND_STALL:
                log.info("closing a connection from %s: it read nothing for %.0f s", self.addr, SEND_STALL)
                self._drop()
            return
        if self.reading_since is not None and mono - self.reading_since > READ_TIMEOUT:
            log.info("closing a connection from %s: its request took more than %.0f s to arrive",
                     self.addr, READ_TIMEOUT)
            self.will_close = True
        elif not self.requests and self.last_activity < idle_cutoff:
            self.will_close = True


def _maintenance(server):
    """A replacement for waitress's idle check (``maintenance``) that applies every
    bound of :meth:`_Channel.check_bounds`."""
    def maintenance(now):
        cutoff = now - server.adj.channel_timeout
        for channel in list(server.active_channels.values()):
            if isinstance(channel, _Channel):
                channel.check_bounds(now, cutoff)
            elif not channel.requests and channel.last_activity < cutoff:
                channel.will_close = True
    return maintenance


def _raise_file_limit(wanted):
    """Let the process hold ``wanted`` open files (connections) if the hard limit allows."""
    try:
        import resource
    except ImportError:             # Windows: no such limit to raise
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else min(wanted, soft)


def make_server(app, host, port, config, also=(), descriptors=2):
    """A waitress server for ``app`` (not yet running), on ``host:port`` and the
    ``also`` (host, port) pairs. ``channel_request_lookahead`` keeps reading a
    connection while its request runs, which is how waitress notices a client that went
    away (``waitress.client_disconnected``). Waitress's own body limit sits above the
    app's (``MAX_CONTENT_LENGTH``, which answers a JSON 413). ``descriptors``: the
    file descriptors one connection may hold (4 behind the TLS front, which holds two
    of its own), which with the process's limit bounds the connections."""
    where = {"host": host, "port": port}
    if also:
        where = {"listen": " ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in [(host, port), *also])}
    # A connection may hold two descriptors: its socket and, once its unread output
    # passes waitress's in-memory buffer, that buffer's temporary file. Kept aside: the
    # listeners, the trigger, the model's worker pipes, logs and the store's files.
    wanted = descriptors * CONNECTION_LIMIT + FILE_RESERVE
    limit = max(64, (_raise_file_limit(wanted) - FILE_RESERVE) // descriptors)
    server = waitress.create_server(app, threads=config.max_queue + 1 + SPARE_THREADS,
                                    channel_request_lookahead=4, ident="geniex",
                                    max_request_body_size=2 * config.max_body + 65536,
                                    connection_limit=limit, channel_timeout=IDLE_TIMEOUT,
                                    cleanup_interval=CLEANUP_INTERVAL, outbuf_high_watermark=OUTPUT_HELD,
                                    outbuf_overflow=OUTPUT_IN_MEMORY, **where)
    # One listening socket, or several (a name that resolved to several addresses).
    for listener in [server, *getattr(server, "map", {}).values()]:
        if hasattr(listener, "channel_class"):
            listener.channel_class = _Channel
            listener.maintenance = _maintenance(listener)
    return server


def addresses_of(server):
    """Every ``http://host:port`` the server listens on."""
    if hasattr(server, "effective_listen"):     # several sockets
        pairs = [pair[:2] for pair in server.effective_listen]
    else:
        pairs = [(server.effective_host, server.effective_port)]
    return [f"http://[{h}]:{p}" if ":" in h else f"http://{h}:{p}" for h, p in pairs]


class _Stopper:
    """Ctrl-C / SIGTERM: stop taking connections, let the answers in flight end at their
    next step (the model runs in a worker process: the server never exits under a
    decode), wait until they reached their clients (at most :data:`SHUTDOWN_WAIT`
    seconds), then close every connection, which ends waitress's loop. A second
    signal closes everything at once."""

    def __init__(self, server, cache, fronts=()):
        self.server = server
        self.map, self.trigger = _loop_of(server)
        self.cache = cache
        self.fronts = fronts            # TLS fronts (--https): they stop accepting too
        self.started = False
        self.closed = False

    def signal(self, _signum, _frame):
        # A signal handler runs between two bytecodes of the event loop, which may hold
        # the trigger's lock: everything beyond setting flags happens in a thread.
        if self.started:
            log.warning("stopping now: closing every connection")
            threading.Thread(target=self._stop_now, name="geniex-stop-now", daemon=True).start()
            return
        self.started = True
        self.cache.stop()
        threading.Thread(target=self._drain, name="geniex-shutdown", daemon=True).start()

    def _listeners(self):
        return [ch for ch in list(self.map.values()) if getattr(ch, "accepting", False)]

    def _stop_listening(self):
        for front in self.fronts:
            front.close()
        for listener in self._listeners():
            listener.accepting = False
            listener.del_channel()
            listener.socket.close()

    def _busy(self):
        dispatcher = self.server.task_dispatcher
        channels = [ch for ch in list(self.map.values()) if isinstance(ch, HTTPChannel)]
        return (dispatcher.active_count or dispatcher.queue or self.cache.busy
                or any(ch.total_outbufs_len and ch.connected for ch in channels))

    def _drain(self):
        log.info("stopping: answers in flight end at their next step")
        _run_in_loop(self.trigger, self._stop_listening)
        if not self._wait(SHUTDOWN_WAIT) and not self.closed:     # (closed: a second signal)
            # An answer that does not reach its next step in time (a long prompt chunk on
            # a busy machine): end its worker, so its client still gets an error answer.
            from geniex.server import worker
            log.warning("an answer did not end within %.0f s of the signal; stopping its worker", SHUTDOWN_WAIT)
            worker.kill_all(stopping=True)
            self._wait(5.0)
        self._close_all()

    def _stop_now(self):
        # The models' workers first: an answer in a long prompt chunk would keep its
        # thread (and the exit) waiting for the chunk's end.
        from geniex.server import worker
        worker.kill_all(stopping=True)
        self._close_all()

    def _wait(self, seconds):
        deadline = time.monotonic() + seconds
        while self._busy():
            if time.monotonic() >= deadline or self.closed:
                return False
            time.sleep(0.05)
        return True

    def _close_all(self):
        if not self.closed:
            self.closed = True
            close_all(self.server)


def _loop_of(server):
    """The event loop's (map, trigger); the trigger is None once the loop has ended.
    A server on several addresses (waitress's MultiSocketServer) has no trigger or map
    of its own: its listeners share one map, each with a trigger of its own into the
    loop (the triggers outlive the listeners in it: a stop closes the listeners first).
    The trigger is looked up in the map, which holds it only while it is open: a
    closed trigger keeps its descriptor's number, which another file may have reused."""
    loop_map = getattr(server, "map", None)
    if loop_map is None:
        loop_map = server._map
    trigger = next((ch for ch in list(loop_map.values()) if isinstance(ch, Trigger)), None)
    return loop_map, trigger


def _run_in_loop(trigger, thunk):
    try:
        trigger.pull_trigger(thunk)
    except OSError:                 # the loop has ended (its trigger is closed)
        thunk()


def close_all(server):
    """End a running server's loop from another thread: close every connection, let
    the worker threads end (at most 5 s), then close the rest (listeners and triggers:
    closing a listener closes its trigger), which empties the loop's map and so ends
    it. In that order because a worker thread pulls the trigger after every task: once
    the trigger is closed that write fails (EBADF, a traceback on a clean stop), or
    lands in whatever file has since reused its descriptor."""
    loop_map, trigger = _loop_of(server)
    if trigger is None:
        return
    _run_in_loop(trigger, lambda: [ch.close() for ch in list(loop_map.values()) if isinstance(ch, HTTPChannel)])
    server.task_dispatcher.shutdown(timeout=5)
    _run_in_loop(trigger, lambda: [ch.close() for ch in list(loop_map.values())])


def serve(config, host_value, announce=print, port=None, tls=None):
    """Run the server in this (main) thread until interrupted; returns 0. ``host_value``
    may list several addresses (:func:`parse_hosts`). ``tls`` = (certfile, keyfile)
    serves HTTPS on them: waitress then listens on a loopback port of its own behind
    a TLS front on those addresses (:mod:`geniex.server.tls`), which relays at most as
    many connections as waitress takes."""
    addresses = parse_hosts(host_value, port)
    (host, port), also = addresses[0], addresses[1:]
    config.bind_host = ",".join(h for h, _ in addresses)
    ssl_context = None
    if tls is not None:
        from geniex.server import tls as tls_front
        ssl_context = tls_front.context(*tls)
    app = create_app(config)
    cache = app.extensions["geniex.answerer"].cache
    try:
        if ssl_context is None:
            server = make_server(app, host, port, config, also)
        else:
            server = make_server(app, "127.0.0.1", 0, config, descriptors=4)
    except OSError as e:
        raise UsageError(f"cannot listen on {host_value}: {e.strerror or e}") from None
    fronts = []
    if ssl_context is not None:
        backend = (server.effective_host, server.effective_port)
        # Waitress counts its listener and trigger against its limit: every connection
        # the front relays is taken at once.
        most = max(1, server.adj.connection_limit - 2)
        try:
            fronts.append(tls_front.TlsFront(addresses, backend, ssl_context, most).start())
        except UsageError:
            server.close()
            raise

    stopper = _Stopper(server, cache, fronts)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, stopper.signal)
    for bound, _ in addresses:
        if not is_loopback(bound) and not config.api_key:
            log.warning("listening on %s, beyond this machine, with no API key: anyone who can reach it can "
                        "use the server; set --api-key or GENIEX_API_KEY", bound)
    urls = [url for front in fronts for url in front.urls] or addresses_of(server)
    more = "".join(f" and {a}" for a in urls[1:])
    announce(f"geniex server listening on {urls[0]}{more} (docs: {urls[0]}/docs/); Ctrl-C to stop",
             flush=True)
    try:
        server.run()                    # returns once the stopper closed every connection
    finally:
        for front in fronts:
            front.close()
        cache.close()
        server.close()
        server.task_dispatcher.shutdown()
        from geniex.server import worker
        worker.kill_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.info("server stopped")
    return 0
