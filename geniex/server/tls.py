"""HTTPS for ``geniex serve --https``: TLS terminated in front of waitress.

Waitress speaks plain HTTP only. Rather than a second server for HTTPS (cheroot has
TLS, but every bound of :mod:`geniex.server.serving` — idle, read and send timeouts,
the connection limit, paused pipelines, the JSON error pages — is written against
waitress and would have to be redone and kept in step), :class:`TlsFront` accepts TLS
connections with the standard library's ``ssl`` module on the address the user asked
for and relays each one, decrypted, to the same waitress server listening on a
loopback port of its own. Everything past the handshake is the plain server, bounds
and all; what the front adds is bounded too: the handshake must end within
:data:`HANDSHAKE_SECONDS`, at most ``max_connections`` connections are relayed at once
(one thread each), and a client that stops reading for :data:`SEND_STALL` seconds is
closed, as waitress closes it.
"""
import logging
import selectors
import socket
import ssl
import threading

from geniex.errors import UsageError

log = logging.getLogger("geniex.server")

HANDSHAKE_SECONDS = 30.0    # a TLS handshake must end within this
SEND_STALL = 30.0           # seconds a client may go without reading what it was sent
BUFFER = 64 * 1024


def context(certfile, keyfile):
    """A server-side TLS context (TLS 1.2 at least) with the certificate chain and key;
    a UsageError naming the flag when they cannot be loaded."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except FileNotFoundError as e:
        raise UsageError(f"--certfile/--keyfile: {e.filename}: no such file") from None
    except (ssl.SSLError, OSError) as e:
        raise UsageError(f"--certfile {certfile} / --keyfile {keyfile}: cannot load the certificate and key "
                         f"({getattr(e, 'reason', None) or e})") from None
    return ctx


class TlsFront:
    """Listens on ``(host, port)`` (port 0: any free one), and relays each TLS
    connection to ``backend`` (the waitress server's ``(host, port)``)."""

    def __init__(self, host, port, backend, ssl_context, max_connections=1024):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.sock = socket.create_server((host, port), family=family, backlog=128)
        except OSError as e:
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.backend = backend
        self.ctx = ssl_context
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closed = False
        self._thread = None

    @property
    def url(self):
        return f"https://[{self.host}]:{self.port}" if ":" in self.host else f"https://{self.host}:{self.port}"

    def start(self):
        """Accept connections in a thread of their own."""
        self._thread = threading.Thread(target=self._accept, name="geniex-tls", daemon=True)
        self._thread.start()
        return self

    def close(self):
        """Stop accepting (connections being relayed finish on their own)."""
        if not self._closed:
            self._closed = True
            try:
                self.sock.close()
            except OSError:
                pass

    def _accept(self):
        while not self._closed:
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return                  # closed
            if not self._slots.acquire(blocking=False):
                log.info("refusing a TLS connection from %s: too many open connections", addr[0])
                conn.close()
                continue
            threading.Thread(target=self._relay, args=(conn, addr), name="geniex-tls-conn", daemon=True).start()

    def _relay(self, conn, addr):
        tls = backend = None
        try:
            conn.settimeout(HANDSHAKE_SECONDS)
            try:
                tls = self.ctx.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError) as e:
                log.info("TLS handshake with %s failed: %s", addr[0], getattr(e, "reason", None) or e)
                return
            tls.settimeout(SEND_STALL)
            backend = socket.create_connection(self.backend)
            backend.settimeout(SEND_STALL)
            _pump(tls, backend)
        except (OSError, ssl.SSLError):
            pass                        # either side went away: close both
        finally:
            for s in (tls, backend, conn):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
            self._slots.release()


def _pump(tls, backend):
    """Copy bytes both ways until either side closes."""
    with selectors.DefaultSelector() as sel:
        sel.register(tls, selectors.EVENT_READ)
        sel.register(backend, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fileobj is tls:
                    try:
                        data = tls.recv(BUFFER)
                    except ssl.SSLWantReadError:
                        continue        # a partial TLS record: wait for the rest
                    if not data:
                        return
                    backend.sendall(data)
                    while tls.pending():    # decrypted bytes the selector cannot see
                        backend.sendall(tls.recv(tls.pending()))
                else:
                    data = backend.recv(BUFFER)
                    if not data:
                        return
                    tls.sendall(data)
