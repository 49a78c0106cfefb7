"""HTTPS for ``geniex serve --https``: TLS terminated in front of waitress.

Waitress speaks plain HTTP only. Rather than a second server for HTTPS (cheroot has
TLS, but every bound of :mod:`geniex.server.serving` — idle, read and send timeouts,
the connection limit, paused pipelines, the JSON error pages — is written against
waitress and would have to be redone and kept in step), :class:`TlsFront` accepts TLS
connections with the standard library's ``ssl`` module on the addresses the user asked
for and relays each one, decrypted, to the same waitress server listening on a
loopback port of its own. Everything past the handshake is the plain server, bounds
and all. What the front adds is bounded as waitress bounds a plain connection:

- one thread, an event loop (as waitress's), relays every connection: an open
  connection costs two sockets and at most :data:`HELD` bytes each way, not a thread;
- at most ``max_connections`` are open at once (the plain server's connection limit).
  When all are taken, a new connection takes the place of the one that has waited
  longest for its handshake, else of the one that has sent nothing since its
  handshake: connections that only sit there (no handshake, half a handshake, a
  handshake and nothing more) cannot lock other clients out. A connection with a
  request is never closed for a new one (if every connection has one, the new one is
  refused, as before);
- a handshake must end within :data:`HANDSHAKE_SECONDS`, and a client that stops
  reading is closed after :data:`SEND_STALL` seconds without progress, as waitress
  closes it.
"""
import errno
import logging
import selectors
import socket
import ssl
import threading
import time

from geniex.errors import UsageError

log = logging.getLogger("geniex.server")

HANDSHAKE_SECONDS = 10.0    # a TLS handshake must end within this
SEND_STALL = 30.0           # seconds a client may go without reading what it was sent
CONNECT_SECONDS = 10.0      # seconds the connection to waitress's loopback port may take
BUFFER = 64 * 1024          # bytes read at once
HELD = 256 * 1024           # bytes held toward one side before the other side is not read
RECORD = 16 * 1024          # bytes written to the client at once (one TLS record)
TICK = 0.5                  # seconds between checks of the bounds
ACCEPTS = 64                # connections accepted per turn of the loop (the others wait in the backlog)

READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


def context(certfile, keyfile):
    """A server-side TLS context (TLS 1.2 at least, no renegotiation) with the
    certificate chain and key; a UsageError naming the flag when they cannot be loaded."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except FileNotFoundError as e:
        raise UsageError(f"--certfile/--keyfile: {e.filename}: no such file") from None
    except (ssl.SSLError, OSError) as e:
        raise UsageError(f"--certfile {certfile} / --keyfile {keyfile}: cannot load the certificate and key "
                         f"({getattr(e, 'reason', None) or e})") from None
    return ctx


class _Connection:
    """One client: its TLS socket, once past the handshake its socket to waitress, and
    what is on its way each way."""

    def __init__(self, sock, addr, ctx, now):
        self.addr = addr[0]
        self.tls = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        self.backend = None
        self.since = now                # accepted, then connected to waitress
        self.handshaken = False
        self.connecting = False         # to waitress
        self.sent_any = False           # the client sent bytes past its handshake
        self.wants = READ               # what the TLS socket waits for (handshake, or a read that must write)
        self.to_backend = bytearray()
        self.to_client = bytearray()
        self.backend_done = False       # waitress closed its side: close once to_client is sent
        self.stalled_since = None       # to_client waits and the client has not read since then
        self.events = {}                # socket -> the events it is registered for

    @property
    def idle(self):
        """Nothing of a request on it: still in its handshake, or silent since."""
        return not self.handshaken or not self.sent_any


class TlsFront:
    """Listens on each ``(host, port)`` of ``addresses`` (port 0: any free one) and relays
    each TLS connection to ``backend`` (the waitress server's ``(host, port)``)."""

    def __init__(self, addresses, backend, ssl_context, max_connections=1024):
        self.listeners = []
        try:
            for host, port in addresses:
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                try:
                    sock = socket.create_server((host, port), family=family, backlog=1024)
                except OSError as e:
                    raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
                sock.setblocking(False)
                self.listeners.append((host, sock))
        except UsageError:
            self._close_listeners()
            raise
        self.backend = (backend[0], int(backend[1]))     # (waitress gives its port as text)
        self.ctx = ssl_context
        self.max_connections = max_connections
        self._conns = set()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closed = False
        self._stopped_listening = threading.Event()
        self._thread = None
        self._next_check = 0.0

    @property
    def urls(self):
        out = []
        for host, sock in self.listeners:
            port = sock.getsockname()[1]
            out.append(f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}")
        return out

    def start(self):
        """Relay connections in a thread of their own."""
        for _, sock in self.listeners:
            self._sel.register(sock, READ, "listener")
        self._sel.register(self._wake_r, READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="geniex-tls", daemon=True)
        self._thread.start()
        return self

    def close(self):
        """Stop accepting (connections being relayed go on until either side closes)."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            self._close_listeners()
            return
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._stopped_listening.wait(5)

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self):
        try:
            while not (self._closed and not self._conns and self._stopped_listening.is_set()):
                if self._closed and not self._stopped_listening.is_set():
                    for _, sock in self.listeners:
                        self._sel.unregister(sock)
                    self._close_listeners()
                    self._stopped_listening.set()
                for key, mask in self._sel.select(TICK):
                    if key.data == "listener":
                        self._accept(key.fileobj)
                    elif key.data == "wake":
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    else:
                        conn, side = key.data
                        if conn in self._conns:
                            self._serve(conn, side, mask)
                if time.monotonic() >= self._next_check:
                    self._next_check = time.monotonic() + TICK
                    self._check_bounds()
        except Exception:           # noqa: BLE001 - a bug here must not pass unseen
            log.exception("the TLS front failed; HTTPS connections are no longer relayed")
            for conn in list(self._conns):
                self._drop(conn)
        finally:
            self._close_listeners()
            self._stopped_listening.set()
            self._sel.close()
            for s in (self._wake_r, self._wake_w):
                s.close()

    def _close_listeners(self):
        for _, sock in self.listeners:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self, listener):
        for _ in range(ACCEPTS):
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("cannot accept a TLS connection: %s", e.strerror)
                return
            if len(self._conns) >= self.max_connections and not self._make_room(addr[0]):
                log.info("refusing a TLS connection from %s: %d connections are open, each with a request",
                         addr[0], len(self._conns))
                sock.close()
                continue
            sock.setblocking(False)
            try:
                conn = _Connection(sock, addr, self.ctx, time.monotonic())
            except (ssl.SSLError, OSError):
                sock.close()
                continue
            self._conns.add(conn)
            self._update(conn)

    def _make_room(self, newcomer):
        """Close the connection that has waited longest for its handshake, else the one
        silent longest since it; False when every connection has a request."""
        idle = [c for c in self._conns if c.idle]
        if not idle:
            return False
        victim = min(idle, key=lambda c: (c.handshaken, c.since))
        log.info("closing a TLS connection from %s (%s) for a new one from %s", victim.addr,
                 "its handshake had not ended" if not victim.handshaken else "it sent nothing", newcomer)
        self._drop(victim)
        return True

    def _check_bounds(self):
        now = time.monotonic()
        for conn in list(self._conns):
            if not conn.handshaken and now - conn.since > HANDSHAKE_SECONDS:
                log.info("closing a TLS connection from %s: its handshake took more than %.0f s", conn.addr,
                         HANDSHAKE_SECONDS)
                self._drop(conn)
            elif conn.connecting and now - conn.since > CONNECT_SECONDS:
                log.warning("closing a TLS connection from %s: the server's loopback port did not accept it",
                            conn.addr)
                self._drop(conn)
            elif conn.stalled_since is not None and now - conn.stalled_since > SEND_STALL:
                log.info("closing a TLS connection from %s: it read nothing for %.0f s", conn.addr, SEND_STALL)
                self._drop(conn)

    # -- one connection ------------------------------------------------------------------------
    def _serve(self, conn, side, mask):
        try:
            if side == "client":
                if not conn.handshaken:
                    self._handshake(conn)
                else:
                    self._read_client(conn)
                    self._write_client(conn)
            else:
                if conn.connecting:
                    self._connected(conn)
                else:
                    if mask & READ:
                        self._read_backend(conn)
                    self._write_backend(conn)
            # Decrypted bytes the selector cannot see (the rest of a record read in part).
            while conn in self._conns and conn.handshaken and conn.tls.pending() \
                    and len(conn.to_backend) < HELD and self._read_client(conn):
                pass
        except (ssl.SSLError, OSError) as e:
            log.debug("TLS connection from %s: %s", conn.addr, e)
            self._drop(conn)                # either side failed: close both
            return
        if conn in self._conns:
            self._update(conn)

    def _handshake(self, conn):
        try:
            conn.tls.do_handshake()
        except ssl.SSLWantReadError:
            conn.wants = READ
            return
        except ssl.SSLWantWriteError:
            conn.wants = WRITE
            return
        except (ssl.SSLError, OSError) as e:
            log.info("TLS handshake with %s failed: %s", conn.addr, getattr(e, "reason", None) or e)
            self._drop(conn)
            return
        conn.handshaken = True
        conn.wants = READ
        conn.since = time.monotonic()
        backend = socket.socket(socket.AF_INET6 if ":" in self.backend[0] else socket.AF_INET, socket.SOCK_STREAM)
        backend.setblocking(False)
        conn.backend = backend
        conn.connecting = True
        code = backend.connect_ex(self.backend)
        if code == 0:
            conn.connecting = False
        elif code not in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            raise OSError(code, "cannot connect to the server's loopback port")
        self._read_client(conn)             # a request that came with the handshake's end

    def _connected(self, conn):
        code = conn.backend.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, "cannot connect to the server's loopback port")
        conn.connecting = False
        self._write_backend(conn)

    def _read_client(self, conn):
        """Read what the client sent (up to :data:`HELD` waiting); the bytes read."""
        conn.wants = READ
        got = 0
        while len(conn.to_backend) < HELD:
            try:
                data = conn.tls.recv(BUFFER)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLWantWriteError:
                conn.wants = WRITE          # the read must write first (TLS bookkeeping)
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError, ConnectionError):
                data = b""
            if not data:                    # the client has gone: close both
                self._drop(conn)
                return 0
            conn.to_backend += data
            conn.sent_any = True
            got += len(data)
        self._write_backend(conn)
        return got

    def _write_client(self, conn):
        if conn not in self._conns:
            return
        wrote = False
        while conn.to_client:
            try:
                n = conn.tls.send(conn.to_client[:RECORD])
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                break
            del conn.to_client[:n]
            wrote = True
        if not conn.to_client:
            conn.stalled_since = None
            if conn.backend_done:
                self._drop(conn)            # waitress closed it and the client has it all
        elif wrote or conn.stalled_since is None:
            conn.stalled_since = time.monotonic()

    def _read_backend(self, conn):
        while len(conn.to_client) < HELD:
            try:
                data = conn.backend.recv(BUFFER)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionError:
                data = b""
            if not data:
                conn.backend_done = True
                break
            conn.to_client += data
        self._write_client(conn)

    def _write_backend(self, conn):
        if conn not in self._conns or conn.connecting:
            return
        while conn.to_backend:
            try:
                n = conn.backend.send(conn.to_backend)
            except (BlockingIOError, InterruptedError):
                break
            del conn.to_backend[:n]

    def _update(self, conn):
        """Register each socket for what it waits for now."""
        client = conn.wants
        backend = 0
        if conn.handshaken:
            if len(conn.to_backend) >= HELD:
                client &= ~READ
            if conn.to_client:
                client |= WRITE
            if conn.connecting:
                backend = WRITE
            else:
                if len(conn.to_client) < HELD and not conn.backend_done:
                    backend |= READ
                if conn.to_backend:
                    backend |= WRITE
        self._register(conn, conn.tls, client, "client")
        if conn.backend is not None:
            self._register(conn, conn.backend, backend, "backend")

    def _register(self, conn, sock, events, side):
        was = conn.events.get(sock, 0)
        if events == was:
            return
        if not events:
            self._sel.unregister(sock)
        elif not was:
            self._sel.register(sock, events, (conn, side))
        else:
            self._sel.modify(sock, events, (conn, side))
        conn.events[sock] = events

    def _drop(self, conn):
        self._conns.discard(conn)
        for sock in (conn.tls, conn.backend):
            if sock is None:
                continue
            if conn.events.pop(sock, 0):
                try:
                    self._sel.unregister(sock)
                except (KeyError, ValueError):
                    pass
            try:
                sock.close()
            except OSError:
                pass
