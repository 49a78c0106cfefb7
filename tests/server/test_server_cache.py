"""The server's resident model: cache-key reloads, keepalive, one request at a time,
the KV cache between requests, client disconnects and shutdown."""
import json
import signal
import threading
import time

import pytest
import requests

from serverproc import DEMO, Server, chat_body

# A chat turn the demo model answers at length (it never ends before max tokens).
LONG = {"model": DEMO, "messages": [{"role": "user", "content": "Tell me a very long story about a dragon."}],
        "max_completion_tokens": 2000}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("cache-data"), "--nctx", 2048) as s:
        yield s


def wait_for(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_cache_key_is_model_load_and_spec_fields(server):
    warm = {"model": DEMO, "messages": []}
    assert server.chat(warm).json() is None
    loads = server.health()["loads"]
    # Same key: no reload, whatever the sampling or other fields.
    server.chat({**warm, "temperature": 0.7, "nctx": 2048})
    server.chat(chat_body(max_tokens=2))
    # Devices compare as resolved: "cpu" is what an unset compute chooses here.
    server.chat({**warm, "compute": "cpu"})
    server.chat({**warm, "compute": "CPU", "cache_type_k": "q8_0"})
    assert server.health()["loads"] == loads
    # Each of these is a different key: one reload each.
    for change in ({"nctx": 1024}, {"ngl": 0}, {"cache_type_k": "f16"}, {"spec_type": "ngram-mod"},
                   {"spec_type": "ngram-mod", "spec_ngram_max": 5},
                   {"spec_type": "ngram-mod", "spec_ngram_max": 5, "spec_draft_policy": "fixed"}):
        server.chat({**warm, **change})
        loads += 1
        assert server.health()["loads"] == loads, change
        server.chat({**warm, **change})                 # and it stays resident
        assert server.health()["loads"] == loads, change
    # Settings the chosen method does not read are not part of the key (issue 9).
    server.chat({**warm, "spec_type": "ngram-mod", "spec_ngram_max": 5, "spec_draft_policy": "fixed",
                 "spec_n_max": 9, "spec_n_min": 1, "spec_p_min": 0.5})
    assert server.health()["loads"] == loads
    # Completions never draft: they reuse the resident model whatever its spec setup.
    assert server.health()["speculative"]
    server.post("/v1/completions", {"model": DEMO, "prompt": "Hi", "max_tokens": 1})
    assert server.health()["loads"] == loads


def test_keep_cache_header_reuses_the_conversation(server):
    first = chat_body("My name is Ada.", max_tokens=6)
    reply = server.chat(first, headers={"GenieX-KeepCache": "true"}).json()
    follow = {**first, "messages": first["messages"] + [
        {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
        {"role": "user", "content": "What is my name?"}]}
    kept = server.chat(follow, headers={"GenieX-KeepCache": "true"}).json()["usage"]
    assert kept["prompt_tokens_details"]["cached_tokens"] > 10
    assert kept["timings"]["cache_n"] + kept["timings"]["prompt_n"] == kept["prompt_tokens"]
    fresh = server.chat(follow).json()["usage"]             # no header: starts clean
    assert fresh["prompt_tokens_details"]["cached_tokens"] == 0
    assert fresh["timings"]["prompt_n"] == fresh["prompt_tokens"]


def test_queued_requests_are_all_answered_one_at_a_time(server):
    results, spans = [], []

    def ask(i):
        t0 = time.monotonic()
        r = server.chat(chat_body(f"Say a word about the number {i}.", max_tokens=8))
        spans.append((t0, time.monotonic()))
        results.append((r.status_code, r.json()))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [code for code, _ in results] == [200] * 5
    assert all(body["usage"]["completion_tokens"] >= 1 for _, body in results)
    # Answered one at a time: the engine's own decode times never overlap, so the
    # batch takes at least the sum of their totals.
    busy = sum(body["usage"]["timings"]["total_ms"] for _, body in results) / 1000
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    assert wall >= busy * 0.95


def test_a_request_waits_while_a_stream_is_being_answered(server):
    with requests.post(server.url + "/v1/chat/completions", json={**LONG, "stream": True, "max_completion_tokens": 40},
                       stream=True, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)                                      # the stream has started
        box = []
        waiter = threading.Thread(target=lambda: box.append(server.chat(chat_body(max_tokens=2))))
        waiter.start()
        time.sleep(0.3)
        assert not box                                   # waiting for its turn
        rest = [line for line in lines if line]
    waiter.join(60)
    assert rest[-1] == b"data: [DONE]"
    assert box and box[0].status_code == 200


def test_client_disconnect_mid_stream_stops_the_answer(server):
    r = requests.post(server.url + "/v1/chat/completions", json={**LONG, "stream": True}, stream=True, timeout=60)
    chunks = 0
    for line in r.iter_lines():
        if line.startswith(b"data:"):
            chunks += 1
        if chunks >= 4:
            break
    r.close()                                            # hang up mid-answer
    t0 = time.monotonic()
    # The answer (up to 2000 tokens) stops within a step or two: the model is idle again.
    wait_for(lambda: server.health()["idle_seconds"] is not None, timeout=10)
    assert time.monotonic() - t0 < 5
    ok = server.chat(chat_body(max_tokens=3))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_keepalive_frees_an_idle_model(tmp_path):
    with Server(tmp_path, "--keepalive", "1") as s:
        assert s.chat({"model": DEMO, "messages": []}).json() is None
        assert s.health()["model"] == DEMO
        time.sleep(0.5)
        s.chat(chat_body(max_tokens=1))                  # use resets the idle clock
        assert s.health()["model"] == DEMO
        wait_for(lambda: s.health()["model"] is None, timeout=5)
        # The log line is on its way through the stderr pipe's reader thread.
        wait_for(lambda: "freeing demo/SmolLM2-135M-Instruct:Q4_1 (idle for 1 s)" in s.stderr, timeout=5)
        # Asked again, it is loaded again.
        assert s.chat(chat_body(max_tokens=1)).status_code == 200
        assert s.health()["loads"] == 2


def test_keepalive_from_the_environment(tmp_path):
    with Server(tmp_path, env={"GENIEX_KEEPALIVE": "42"}) as s:
        assert s.health()["keepalive"] == 42


def test_sigterm_ends_the_answer_in_flight_and_exits_cleanly(tmp_path):
    s = Server(tmp_path)
    with requests.post(s.url + "/v1/chat/completions", json={**LONG, "stream": True}, stream=True, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    assert rest[-1] == b"data: [DONE]"
    finish = json.loads(rest[-2][5:])
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["timings"]["stop_reason"] == "user"
    assert s.stop() == 0
    assert time.monotonic() - t0 < 10
    assert "freeing demo/SmolLM2-135M-Instruct:Q4_1 (the server is stopping)" in s.stderr
    assert "Traceback" not in s.stderr


def test_ctrl_c_stops_an_idle_server(tmp_path):
    s = Server(tmp_path)
    assert s.chat(chat_body(max_tokens=1)).status_code == 200
    assert s.stop(signal.SIGINT) == 0
    assert "Traceback" not in s.stderr
