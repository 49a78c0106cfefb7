"""What geniex.server.serving changes in waitress, each change checked by what it does
(not by the server merely starting), on a small WSGI app served by ``make_server``
without a model. serving.py overrides or reaches waitress internals (its module doc
lists them; setup.cfg pins waitress to the versions they were written against): a
waitress that changes them fails here, by name.

- ``HTTPChannel.error_task_class`` / ``ErrorTask.execute``: waitress's own refusals in
  OpenAI's JSON error shape;
- ``HTTPChannel.received`` and the server's ``maintenance``: a request that takes too
  long to arrive is closed, on every listening address;
- ``HTTPChannel.service``: a pipelined request whose client does not read waits
  without a worker thread, and goes on once the client reads;
- ``HTTPChannel.write_soon`` / ``_flush_outbufs_below_high_watermark``: a write to a
  client that stopped reading gives up after ``SEND_STALL`` and the connection is reset;
- the loop's map, trigger, listeners and task dispatcher (``_Stopper``, ``close_all``):
  a stop ends the loop after the answer in flight reached its client;
- ``waitress.client_disconnected`` (public, with ``channel_request_lookahead``): a
  request sees its client leave (the server's cancel)."""
import json
import re
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from awaiting import until
from geniex.server import serving

pytestmark = pytest.mark.fast

# Over what the kernel buffers for a loopback connection that is not read (a few MiB)
# plus serving.OUTPUT_HELD (1 MiB).
BIG = b"x" * (8 << 20)
CHUNK = b"y" * (64 << 10)
STREAM_CHUNKS = 1024


class App:
    """A WSGI app: ``/big`` (8 MiB at once), ``/stream`` (64 MiB in 64 KiB chunks: more
    than the kernel's buffers of a loopback connection hold),
    ``/hold`` (until its client leaves), ``/slow`` (1 s), anything else ``ok``."""

    def __init__(self):
        self.holding = threading.Event()
        self.saw_leave = threading.Event()

    def __call__(self, environ, start_response):
        path = environ["PATH_INFO"]
        if path == "/big":
            start_response("200 OK", [("Content-Length", str(len(BIG)))])
            return [BIG]
        if path == "/stream":
            start_response("200 OK", [("Content-Type", "application/octet-stream")])
            return (CHUNK for _ in range(STREAM_CHUNKS))
        if path == "/hold":
            self.holding.set()
            gone = environ["waitress.client_disconnected"]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if gone():
                    self.saw_leave.set()
                    break
                time.sleep(0.02)
        if path == "/slow":
            time.sleep(1.0)
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]


class Served:
    def __init__(self, also=()):
        self.app = App()
        config = SimpleNamespace(max_queue=2, max_body=1 << 16)
        self.server = serving.make_server(self.app, "127.0.0.1", 0, config, also)
        self.addresses = [url.rsplit("//", 1)[1] for url in serving.addresses_of(self.server)]
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def connect(self, index=0):
        host, port = self.addresses[index].rsplit(":", 1)
        return socket.create_connection((host.strip("[]"), int(port)), timeout=10)

    def get(self, path, index=0):
        """A whole answer to ``GET path`` on a new connection: (head, body)."""
        with self.connect(index) as c:
            c.sendall(b"GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" % path.encode())
            data = _read_all(c)
        head, _, body = data.partition(b"\r\n\r\n")
        return head.decode("latin-1"), body

    def channels(self):
        return list(self.server.active_channels.values()) if hasattr(self.server, "active_channels") else \
            [ch for ch in self.server.map.values() if isinstance(ch, serving.HTTPChannel)]

    def close(self):
        serving.close_all(self.server)
        self.thread.join(30)
        assert not self.thread.is_alive()


def _read_all(c):
    parts = []
    while True:
        data = c.recv(1 << 20)
        if not data:
            return b"".join(parts)
        parts.append(data)


def _closed_by_server(c, timeout):
    """True once the server closed (or reset) ``c`` within ``timeout`` seconds."""
    c.settimeout(timeout)
    try:
        return c.recv(1000) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


@pytest.fixture
def fast_bounds(monkeypatch):
    """Bounds of a second instead of 30 (set before the server is made: the idle bound
    and the check's interval are waitress settings)."""
    for name in ("IDLE_TIMEOUT", "READ_TIMEOUT", "SEND_STALL"):
        monkeypatch.setattr(serving, name, 1.0)
    monkeypatch.setattr(serving, "CLEANUP_INTERVAL", 0.2)


@pytest.fixture
def served(fast_bounds):
    s = Served()
    yield s
    s.close()


# -- error_task_class ------------------------------------------------------------------------
def test_waitress_s_own_refusals_are_json_errors(served):
    with served.connect() as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: nope\r\n\r\n")
        head, _, body = _read_all(c).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"Content-Type: application/json" in head
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "bad_request"
    with served.connect() as c:                         # over waitress's body limit (2 x max_body + 64 KiB)
        c.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % (1 << 20))
        head, _, body = _read_all(c).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert json.loads(body)["error"]["code"] == "request_entity_too_large"


# -- received + maintenance ------------------------------------------------------------------
def _trickle(c, seconds):
    """Send a request's headers one byte at a time (never idle); True when the server
    closed the connection before ``seconds`` passed."""
    c.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\n")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            c.sendall(b"X")
        except OSError:
            return True
        if _closed_by_server(c, 0.1):
            return True
    return False


def test_a_request_that_takes_too_long_to_arrive_is_closed_though_never_idle(served):
    with served.connect() as c:
        started = time.monotonic()
        assert _trickle(c, 15)
        assert 1.0 <= time.monotonic() - started < 10
    with served.connect() as c:                         # an idle connection: its own bound
        assert _closed_by_server(c, 10)


def test_every_listening_address_gets_the_channel_and_its_bounds(fast_bounds):
    s = Served(also=[("127.0.0.1", 0)])
    try:
        assert len(s.addresses) == 2
        for index in (0, 1):
            with s.connect(index) as c:
                until(lambda: len(s.channels()) == 1, timeout=10, what="the connection to be accepted")
                assert all(isinstance(ch, serving._Channel) for ch in s.channels())
                assert _trickle(c, 15)
            until(lambda: not s.channels(), timeout=10, what="the connection to be gone")
    finally:
        s.close()


# -- service: pipelined requests of a client that does not read --------------------------------
def test_clients_that_pipeline_and_never_read_hold_no_thread_and_resume_when_they_read(served, monkeypatch):
    monkeypatch.setattr(serving, "SEND_STALL", 60.0)   # the clients below do not read for a while
    threads = served.server.adj.threads
    socks = []
    try:
        for _ in range(threads + 2):
            c = served.connect()
            c.sendall(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n" * 3)
            socks.append(c)
        until(lambda: sum(getattr(ch, "paused", False) for ch in served.channels()) == len(socks), timeout=30,
              what="every pipelining connection to wait for its client")
        until(lambda: served.server.task_dispatcher.active_count == 0, timeout=10, what="no thread held")
        head, body = served.get("/")
        assert head.startswith("HTTP/1.1 200") and body == b"ok"
        # One client reads now: its next answers follow, whole.
        c = socks[0]
        c.settimeout(30)
        got = b""

        def bodies():
            heads = re.findall(rb"HTTP/1\.1 200 OK\r\n.*?\r\n\r\n", got, re.S)
            return len(heads), len(got) - sum(map(len, heads))

        while bodies() < (3, 3 * len(BIG)):
            data = c.recv(1 << 20)
            assert data, "the connection ended before its three answers"
            got += data
        assert bodies() == (3, 3 * len(BIG))
    finally:
        for c in socks:
            c.close()


# -- write_soon / _flush_outbufs_below_high_watermark: a client that stops reading --------------
def test_a_write_to_a_client_that_stopped_reading_gives_up_and_resets_the_connection(served, caplog):
    with caplog.at_level("INFO", logger="geniex.server"):
        c = served.connect()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.sendall(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
        until(lambda: "it read nothing for 1 s" in caplog.text, timeout=30, what="the write to give up")
    until(lambda: served.server.task_dispatcher.active_count == 0, timeout=10, what="the thread to be free")
    until(lambda: not served.channels(), timeout=10, what="the connection to be closed")
    c.settimeout(10)
    got = 0
    with pytest.raises(ConnectionResetError):          # a reset, its unsent output dropped
        while True:
            data = c.recv(1 << 20)
            if not data:
                break
            got += len(data)
    c.close()
    assert 0 < got < STREAM_CHUNKS * len(CHUNK)


# -- waitress.client_disconnected ---------------------------------------------------------------
def test_a_request_sees_its_client_leave(served):
    c = served.connect()
    c.sendall(b"GET /hold HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert served.app.holding.wait(10)
    c.close()
    assert served.app.saw_leave.wait(10)


# -- the loop's internals: stopping ----------------------------------------------------------
def test_a_stop_ends_the_loop_after_the_answer_in_flight_reached_its_client(fast_bounds):
    s = Served()
    cache = SimpleNamespace(busy=False, stop=lambda: None)
    stopper = serving._Stopper(s.server, cache)
    idle = s.connect()
    box = []
    slow = threading.Thread(target=lambda: box.append(s.get("/slow")))
    slow.start()
    until(lambda: s.server.task_dispatcher.active_count == 1, timeout=10, what="the answer to start")
    stopper.signal(15, None)
    until(lambda: not stopper._listeners(), timeout=10, what="the listener to close")
    with pytest.raises(OSError):
        s.connect()                                     # no new connections
    slow.join(30)
    head, body = box[0]
    assert head.startswith("HTTP/1.1 200") and body == b"ok"
    s.thread.join(30)
    assert not s.thread.is_alive()                      # the loop ended
    assert _closed_by_server(idle, 10)
    idle.close()
