"""Server pieces in process, without a model: SSE bodies, the model cache's leases,
key and keepalive (with a stand-in session), request validation, and the order
in which a stop closes the event loop."""
import threading

import pytest

from awaiting import until
from geniex.server import sse
from geniex.server.cache import CacheKey, ModelCache
from geniex.server.validation import ApiError, as_api_error, field_path, validate

pytestmark = pytest.mark.fast   # needs no model: the fast tier


class FakeSession:
    def __init__(self, name):
        self.name = name
        self.speculative = False
        self.closed = False

    def close(self):
        self.closed = True


def key(model="m", nctx=4096, spec=()):
    return CacheKey(model, nctx, -1, ("CPU",), ("q8_0", "q8_0"), spec)


# -- SSE ---------------------------------------------------------------------------------


def test_event_stream_runs_on_close_once_and_ends_with_done():
    closed = []
    body = list(sse.EventStream(iter([{"a": 1}, {"b": "é"}]), lambda: closed.append(1), lambda e: {}))
    assert body == [b'data: {"a": 1}\n\n', 'data: {"b": "é"}\n\n'.encode(), b"data: [DONE]\n\n"]
    assert closed == [1]
    assert list(sse.iter_events(b"".join(body).decode().splitlines())) == [{"a": 1}, {"b": "é"}]


def test_event_stream_reports_a_failure_as_a_last_event():
    def events():
        yield {"n": 1}
        raise RuntimeError("boom")
    closed = []
    stream = sse.EventStream(events(), lambda: closed.append(1), lambda e: as_api_error(e).body())
    out = list(sse.iter_events(b"".join(stream).decode().splitlines()))
    assert out[0] == {"n": 1} and out[1]["error"]["message"] == "internal error: RuntimeError: boom"
    assert closed == [1]


def test_event_stream_closed_before_or_during_iteration_releases():
    closed = []
    sse.EventStream(iter([{"a": 1}]), lambda: closed.append("never iterated"), None).close()
    stream = sse.EventStream(iter([{"a": 1}, {"a": 2}]), lambda: closed.append("hung up"), None)
    it = iter(stream)
    next(it)
    stream.close()          # what the WSGI server does when the client goes away
    it.close()
    assert closed == ["never iterated", "hung up"]


# -- the model cache's leases and keys ---------------------------------------------------------


def test_leases_go_first_come_first_served_up_to_the_slots_and_a_reload_waits_for_the_drain():
    cache = ModelCache(keepalive=-1)
    try:
        made = []

        def load(name, slots):
            def make(previous):
                made.append(FakeSession(name))
                made[-1].slots = slots
                return made[-1]
            return make

        first = cache.lease(key("a"), load("a", 2))
        second = cache.lease(key("a"), load("never", 2))     # a second slot: at once, no load
        assert cache.in_use() == 2 and len(made) == 1
        order = []

        def waiter(i, k):
            with cache.lease(k, load(f"load-{i}", 2)) as lease:
                order.append((i, lease.session.name))

        threads = []
        # 0 wants model b (waits for both leases back), 1 wants a, but came after 0: it
        # does not overtake the reload, though a has a slot free once one comes back.
        for i, k in enumerate((key("b"), key("a"))):
            t = threading.Thread(target=waiter, args=(i, k))
            t.start()
            threads.append(t)
            until(lambda: cache.waiting() == i + 1, what=f"request {i} to queue")
        first.release()
        assert cache.waiting() == 2 and order == []          # b waits for the drain; a waits behind b
        second.release()
        for t in threads:
            t.join(5)
        assert order == [(0, "load-0"), (1, "load-1")] and cache.loads == 3
    finally:
        cache.close()


def test_cache_key():
    assert key().satisfied_by(key())
    assert not key().satisfied_by(None)
    assert not key(nctx=1024).satisfied_by(key())
    assert not key(spec=(("ngram-mod",),)).satisfied_by(key())
    assert CacheKey("m", 4096, -1, ("CPU",), ("q8_0", "q8_0"), None).satisfied_by(key(spec=(("ngram-mod",),)))   # completions
    # What a completion's load leaves resident is the plain setup: a plain chat reuses it.
    loaded = CacheKey("m", 4096, -1, ("CPU",), ("q8_0", "q8_0"), None, any_load=True).as_loaded()
    assert key(spec=()).satisfied_by(loaded) and not key(spec=(("ngram-mod",),)).satisfied_by(loaded)


def test_cache_reloads_on_a_new_key_handing_the_old_model_to_the_load():
    cache = ModelCache(keepalive=-1)
    try:
        made, handed = [], []

        def load(name, previous):
            handed.append(previous)         # the load frees it (or reuses its worker process)
            if previous is not None:
                previous.close()
            made.append(FakeSession(name))
            return made[-1]

        with cache.lease(key("a"), lambda previous: load("a", previous)) as lease:
            assert lease.session is made[0]
        with cache.lease(key("a"), lambda previous: load("again", previous)):
            pass
        assert len(made) == 1 and cache.loads == 1 and handed == [None]
        with cache.lease(key("b"), lambda previous: load("b", previous)):
            pass
        assert handed == [None, made[0]] and cache.status()["model"] == "b" and cache.loads == 2
    finally:
        cache.close()
    assert made[1].closed


def test_cache_keepalive():
    cache = ModelCache(keepalive=0.2)
    try:
        with cache.lease(key(), lambda _: FakeSession("m")) as lease:
            session = lease.session
            # Never freed while in use: the idle clock does not run during a lease.
            assert cache.status()["idle_seconds"] is None and cache._deadline() is None
        assert cache.status()["model"] == "m"
        until(lambda: session.closed, what="the keepalive to free the idle model")
        assert cache.status()["model"] is None
    finally:
        cache.close()

    zero = ModelCache(keepalive=0)
    with zero.lease(key(), lambda _: FakeSession("m")) as lease:
        pass
    assert lease.session.closed
    zero.close()


def test_use_resets_the_idle_clock():
    cache = ModelCache(keepalive=-1)
    try:
        with cache.lease(key(), lambda _: FakeSession("m")):
            pass
        idle = until(lambda: cache.status()["idle_seconds"], what="some idle time")
        with cache.lease(key(), lambda _: FakeSession("again")):
            pass
        assert cache.status()["idle_seconds"] < idle and cache.loads == 1
    finally:
        cache.close()


def test_cache_refuses_new_work_once_stopping():
    cache = ModelCache()
    cache.stop()
    with pytest.raises(ApiError) as e:
        cache.lease(key(), lambda _: FakeSession("m"))
    assert e.value.status == 503
    cache.close()


def test_a_failed_load_hands_the_turn_on():
    cache = ModelCache()

    def boom(_previous):
        raise RuntimeError("no")
    with pytest.raises(RuntimeError):
        cache.lease(key(), boom)
    with cache.lease(key(), lambda _: FakeSession("m")) as lease:
        assert lease.session.name == "m"
    cache.close()


# -- validation ----------------------------------------------------------------------------


def test_field_path():
    assert field_path(["messages", 0, "content", 1, "text"]) == "messages[0].content[1].text"
    assert field_path([]) == ""


def test_validation_accepts_a_full_request():
    validate({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5,
              "stop": "x", "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.5,
              "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": 0.1,
              "frequency_penalty": 0.1, "seed": 1, "nctx": 1024, "ngl": -1, "compute": "cpu",
              "spec_type": "draft-mtp", "spec_draft_model": "a/b:Q4_0", "spec_n_max": 3, "spec_n_min": 0,
              "spec_p_min": 0.5, "spec_ngram_n": 2, "spec_ngram_min": 1, "spec_ngram_max": 4},
             "chat_completions.request.json")


# -- stopping ----------------------------------------------------------------------------


def test_the_loop_s_trigger_closes_only_after_the_worker_threads_end(tmp_path, caplog):
    # A worker thread pulls the loop's trigger after its task; a stop that closed the
    # trigger with everything else made that write fail (EBADF, logged by waitress as a
    # traceback; once, in CI, on a clean SIGTERM). Here the stop runs at that moment:
    # the worker thread then waits 1 s for the loop to end, as it did when the trigger
    # closed first, before it pulls.
    import requests
    from geniex.server.serving import close_all
    from serverproc import AppServer

    with AppServer(tmp_path / "data") as s:
        pull, stops = s.server.pull_trigger, []

        def stop_then_pull():
            if threading.current_thread().name.startswith("waitress-") and not stops:
                stops.append(threading.Thread(target=close_all, args=(s.server,)))
                stops[0].start()
                s._thread.join(1.0)
            pull()

        s.server.pull_trigger = stop_then_pull
        with caplog.at_level("ERROR", logger="waitress"):
            assert requests.get(s.url + "/health", timeout=10).status_code == 200
            until(lambda: stops and not stops[0].is_alive(), what="the stop to end")
        assert not s._thread.is_alive()                 # the loop ended
        assert not [r for r in caplog.records if r.name.startswith("waitress")], caplog.text
