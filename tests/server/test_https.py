"""``geniex serve --https --certfile --keyfile``: a real TLS server (a self-signed
certificate made here with the openssl command), reached with ``requests`` verifying
against that certificate, and by ``geniex run``; and the TLS front's bounds
(geniex.server.tls): idle, half-open and slow-handshake connections beyond its limit do
not lock a client out, and hold no thread each."""
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest
import requests

from awaiting import until
from serverproc import DEMO, Server


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def server(tmp_path_factory, cert):
    with Server(tmp_path_factory.mktemp("https"), "--https", "--certfile", cert[0], "--keyfile", cert[1],
                "--nctx", "1024") as s:
        yield s


def test_answers_over_tls_verified_against_the_certificate(server, cert):
    assert server.url.startswith("https://")
    r = requests.get(server.url + "/health", verify=str(cert[0]), timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    body = {"model": DEMO, "max_tokens": 6, "messages": [{"role": "user", "content": "Hi"}]}
    r = requests.post(server.url + "/v1/chat/completions", json=body, verify=str(cert[0]), timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    with requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, verify=str(cert[0]),
                       stream=True, timeout=120) as r:
        lines = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert lines[-1] == "data: [DONE]"


def test_no_plain_http_and_no_unverified_tls(server):
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url + "/health", timeout=30)            # the system's CAs do not know it
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(server.url.replace("https://", "http://") + "/health", timeout=30)
    # The server is still answering after both.
    assert server.proc.poll() is None


def test_geniex_run_over_https(server, cert, cli):
    p = cli("run", DEMO, "--host", server.url, "-p", "Hello", "--max-tokens", "4",
            env={"REQUESTS_CA_BUNDLE": str(cert[0])})
    assert p.returncode == 0, p.stderr
    assert "tok/s" in p.stderr


def test_https_flags_are_checked(cli, cert, tmp_path):
    p = cli("serve", "--https", "--certfile", cert[0])
    assert p.returncode == 2 and "--keyfile" in p.stderr
    p = cli("serve", "--certfile", cert[0], "--keyfile", cert[1])
    assert p.returncode == 2 and "--https" in p.stderr
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    p = cli("serve", "--host", "127.0.0.1:0", "--https", "--certfile", junk, "--keyfile", cert[1])
    assert p.returncode != 0 and "cannot load the certificate" in p.stderr


# -- the TLS front's bounds (geniex.server.tls), on a small WSGI app without a model ----------
class _App:
    """``/hold`` answers once ``release`` is set; ``/big`` is 8 MiB; ``/echo`` returns
    the body; anything else ``ok``."""

    def __init__(self):
        self.release = threading.Event()
        self.held = 0

    def __call__(self, environ, start_response):
        path = environ["PATH_INFO"]
        body = b"ok"
        if path == "/hold":
            self.held += 1
            self.release.wait(60)
        elif path == "/big":
            body = b"x" * (8 << 20)
        elif path == "/echo":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]


class _Front:
    def __init__(self, cert, max_connections):
        from types import SimpleNamespace
        from geniex.server import serving, tls
        self.app = _App()
        self.server = serving.make_server(self.app, "127.0.0.1", 0, SimpleNamespace(max_queue=4, max_body=4 << 20),
                                          descriptors=4)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.front = tls.TlsFront([("127.0.0.1", 0)], (self.server.effective_host, self.server.effective_port),
                                  tls.context(*cert), max_connections).start()
        self.url = self.front.urls[0]
        self.port = int(self.url.rsplit(":", 1)[1])
        self.client_ctx = ssl.create_default_context(cafile=str(cert[0]))

    def raw(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def tls(self):
        return self.client_ctx.wrap_socket(self.raw(), server_hostname="127.0.0.1")

    def half_hello(self):
        """A connection that sent half of a real ClientHello."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        hello = self.client_ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
        with pytest.raises(ssl.SSLWantReadError):
            hello.do_handshake()
        data = outgoing.read()
        c = self.raw()
        c.sendall(data[:len(data) // 2])
        return c

    def close(self):
        from geniex.server import serving
        self.app.release.set()
        self.front.close()
        serving.close_all(self.server)
        self.thread.join(30)


@pytest.fixture
def front(cert):
    f = _Front(cert, max_connections=8)
    yield f
    f.close()


def _closed(c, timeout):
    c.settimeout(timeout)
    try:
        return c.recv(100) == b""
    except ConnectionResetError:
        return True
    except (socket.timeout, ssl.SSLError):
        return False


def test_idle_and_half_open_tls_connections_beyond_the_limit_do_not_lock_a_client_out(front, cert):
    threads = threading.active_count()
    socks = []
    try:
        for _ in range(3):                  # three times the limit, of each kind in turn
            socks += [front.raw() for _ in range(3)]             # no handshake at all
            socks += [front.half_hello() for _ in range(3)]      # half a handshake
            socks += [front.tls() for _ in range(3)]             # a handshake, then nothing
        until(lambda: len(front.front._conns) <= 8, timeout=10, what="the front to hold its limit")
        for _ in range(3):
            r = requests.get(front.url + "/health", verify=str(cert[0]), timeout=10)
            assert r.status_code == 200 and r.text == "ok"
        assert threading.active_count() <= threads + 1          # no thread per connection
        assert len(front.front._conns) <= 8
    finally:
        for c in socks:
            c.close()


def test_connections_with_a_request_are_not_closed_for_new_ones(cert):
    f = _Front(cert, max_connections=2)
    try:
        box = []
        clients = [threading.Thread(target=lambda: box.append(requests.get(f.url + "/hold", verify=str(cert[0]),
                                                                          timeout=60)))
                   for _ in range(2)]
        for t in clients:
            t.start()
        until(lambda: f.app.held == 2, timeout=20, what="two requests in flight")
        late = f.raw()
        assert _closed(late, 10)                            # refused: each open connection has a request
        late.close()
        f.app.release.set()
        for t in clients:
            t.join(30)
        assert [r.status_code for r in box] == [200, 200]
    finally:
        f.close()


def test_a_handshake_that_does_not_end_is_closed(front, monkeypatch):
    from geniex.server import tls
    monkeypatch.setattr(tls, "HANDSHAKE_SECONDS", 1.0)
    for c in (front.raw(), front.half_hello()):
        started = time.monotonic()
        assert _closed(c, 10)
        assert time.monotonic() - started < 8
        c.close()
    until(lambda: len(front.front._conns) == 0, timeout=10, what="the connections to be gone")


def test_a_tls_client_that_stops_reading_is_closed(front, monkeypatch):
    from geniex.server import serving, tls
    monkeypatch.setattr(tls, "SEND_STALL", 1.0)
    monkeypatch.setattr(serving, "SEND_STALL", 600.0)      # the front's bound, not waitress's
    c = front.raw()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c = front.client_ctx.wrap_socket(c, server_hostname="127.0.0.1")
    c.sendall(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")
    until(lambda: len(front.front._conns) == 0, timeout=20, what="the front to close the connection")
    c.close()


def test_large_answers_and_bodies_pass_whole(front, cert):
    r = requests.get(front.url + "/big", verify=str(cert[0]), timeout=60)
    assert r.status_code == 200 and r.content == b"x" * (8 << 20)
    body = bytes(range(256)) * 12288                        # 3 MiB
    r = requests.post(front.url + "/echo", data=body, verify=str(cert[0]), timeout=60)
    assert r.status_code == 200 and r.content == body
