"""A model load is bounded and cancellable (geniex.server.worker.WorkerSession.open): a
load that hangs has its worker killed after its bound and the request gets a 504
naming the model and the wait; a request cancelled during a load (its client left, the
server stops) stops waiting at once, its load going on for the next request of the
same model; and the server answers the next request normally.

The hang is a real one: the model's worker process is stopped (SIGSTOP), and a request
for another load setting reloads in place in it, so the load is sent to a process that
does nothing at all, as one stuck in a read or a driver call."""
import json
import os
import signal
import socket
import threading
import time

import pytest

from awaiting import until
from geniex.server import worker
from serverproc import DEMO, AppServer, Server, chat_body, check_shape

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="stops the worker with SIGSTOP")

RELOAD = {"nctx": 1024}         # another load setting than the server's (512): a reload in place


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("load-data"), nctx=512) as s:
        yield s


def _stopped_worker(server):
    """Load the server's default setup and stop its worker; returns the worker's pid."""
    assert server.chat(chat_body(max_tokens=1)).status_code == 200
    pid = server.health()["worker_pid"]
    os.kill(pid, signal.SIGSTOP)
    return pid


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_load_that_hangs_is_a_504_naming_the_model_and_the_wait_and_the_next_request_is_answered(server,
                                                                                                monkeypatch):
    pid = _stopped_worker(server)
    # --load-timeout 1: the worker is stopped, so the load never ends; the test waits it out.
    monkeypatch.setattr(server.app.extensions["geniex.answerer"], "load_timeout", 1.0)
    started = time.monotonic()
    r = server.chat(chat_body(max_tokens=1, **RELOAD))
    waited = time.monotonic() - started
    assert r.status_code == 504, r.text
    check_shape(r.json(), "Error")
    error = r.json()["error"]
    assert error["code"] == "load_timeout"
    assert DEMO in error["message"] and "within 1 s" in error["message"] and "--load-timeout" in error["message"]
    assert 1.0 <= waited < 30
    assert server.app.extensions["geniex.answerer"].metrics.load_timeouts == 1
    until(lambda: _gone(pid), what="the hung worker to be killed and reaped")
    assert server.health()["model"] is None
    monkeypatch.undo()
    ok = server.chat(chat_body(max_tokens=2, **RELOAD))
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 2
    assert server.health()["worker_pid"] not in (None, pid)


def _send_and_leave(server, body):
    """POST ``body`` on a raw connection; returns the socket (closing it is the client
    going away)."""
    host, port = server.host.rsplit(":", 1)
    c = socket.create_connection((host, int(port)), timeout=30)
    data = json.dumps(body).encode()
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return c


def test_a_client_that_leaves_during_a_load_frees_the_server_and_its_retry_picks_the_load_up(server):
    pid = _stopped_worker(server)
    loads = server.stderr.count(f"loading {DEMO}")
    c = _send_and_leave(server, chat_body(max_tokens=1, **RELOAD))
    until(lambda: server.stderr.count(f"loading {DEMO}") > loads, what="the load to start")
    c.close()
    # The request stops waiting at once, though the worker has not loaded anything.
    until(lambda: "the request was cancelled while the model loaded" in server.stderr, timeout=20,
          what="the request to stop waiting")
    until(lambda: not server.cache.busy, timeout=20, what="the turn to be given back")
    assert server.health()["status"] == "ok"
    assert not _gone(pid)                               # the load goes on (here: once the worker runs)
    os.kill(pid, signal.SIGCONT)
    r = server.chat(chat_body(max_tokens=2, **RELOAD))  # the client asks again
    assert r.status_code == 200, r.text
    assert "picking up its load left by a cancelled request" in server.stderr
    assert server.health()["worker_pid"] == pid         # the same load, not a new one


def test_a_load_left_by_its_client_ends_when_another_model_setting_is_asked_for(server):
    pid = _stopped_worker(server)
    loads = server.stderr.count(f"loading {DEMO}")
    c = _send_and_leave(server, chat_body(max_tokens=1, **RELOAD))
    until(lambda: server.stderr.count(f"loading {DEMO}") > loads, what="the load to start")
    c.close()
    until(lambda: not server.cache.busy and "the request was cancelled while the model loaded" in server.stderr,
          timeout=20, what="the request to stop waiting")
    r = server.chat(chat_body(max_tokens=2))            # the server's own setting: not the load left behind
    assert r.status_code == 200, r.text
    assert "ending the load left by a cancelled request: another load was asked for" in server.stderr
    until(lambda: _gone(pid), what="the stopped worker to be killed")
    assert server.health()["worker_pid"] != pid


def test_sigterm_during_a_load_that_hangs_stops_at_once_and_the_client_gets_an_answer(tmp_path):
    s = Server(tmp_path, "--nctx", 512)
    try:
        pid = _stopped_worker(s)
        box = []
        t = threading.Thread(target=lambda: box.append(s.chat(chat_body(max_tokens=1, **RELOAD))))
        t.start()
        until(lambda: "replacing" in s.stderr and f"loading {DEMO}" in s.stderr.split("replacing", 1)[1],
              what="the load to start")
        started = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        t.join(60)
        code = s.proc.wait(60)
        stopped_in = time.monotonic() - started
    finally:
        s.stop()
    assert code == 0, s.stderr[-2000:]
    assert stopped_in < 20                              # not the 30 s a stop waits for answers in flight
    r = box[0]
    assert r.status_code == 503 and r.json()["error"]["code"] == "request_cancelled", r.text
    assert "Traceback" not in s.stderr, s.stderr[-3000:]
    until(lambda: _gone(pid), what="the stopped worker to be killed with the server")


@pytest.mark.fast
def test_the_default_bound_grows_with_the_files_a_load_reads(tmp_path):
    from geniex.engine.session import LoadOptions
    from geniex.speculative.options import SpecOptions
    from geniex.store.resolved import ResolvedModel
    model, draft = tmp_path / "m.gguf", tmp_path / "d.gguf"
    for path, size in ((model, 50_000_000), (draft, 25_000_000)):
        with open(path, "wb") as f:
            f.truncate(size)
    target = ResolvedModel(name="org/m:Q4_0", path=model, precision="Q4_0", runtime="llama.cpp", type="llm",
                           files=[model])
    plain = worker.load_bound(target, LoadOptions())
    assert plain == pytest.approx(worker.LOAD_MIN + 50_000_000 / worker.LOAD_RATE)
    spec = LoadOptions(spec=SpecOptions(types=("draft",), draft_path=draft))
    assert worker.load_bound(target, spec) == pytest.approx(plain + 25_000_000 / worker.LOAD_RATE)


@pytest.mark.fast
def test_the_load_timeout_flag_is_checked(cli):
    p = cli("serve", "--load-timeout", "-1")
    assert p.returncode == 2 and "--load-timeout" in p.stderr
