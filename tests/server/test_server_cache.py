"""The server's resident model: cache-key reloads, keepalive, one request at a time,
the KV cache between requests, client disconnects (in process, ``create_app()``) and
shutdown by signal (``geniex serve``)."""
import concurrent.futures as futures
import io
import json
import os
import re
import signal

import pytest
import requests

import tiny_gemma4
from awaiting import queued, until
from geniex.store import Store
from serverproc import DEMO, AppServer, Server, chat_body

# A chat turn the demo model answers at length (it never ends before max tokens).
LONG = {"model": DEMO, "messages": [{"role": "user", "content": "Tell me a very long story about a dragon."}],
        "max_completion_tokens": 2000}


# Any model shows which fields key the resident model: the cache-key test reloads a tiny
# generated one (eight loads of a 0.4 MB model instead of the demo model's 100 MB).
TINY = "test/tiny-gemma4:F32"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("cache-data")
    tiny = tiny_gemma4.write_target(tmp_path_factory.mktemp("tiny-key") / "tiny-gemma4.gguf", context_length=4096)
    Store(data).pull(TINY, local_path=tiny, out=io.StringIO(), interactive=False)
    with AppServer(data, nctx=2048, parallel=1) as s:     # one slot: one request at a time
        yield s


def started_stream(server, body):
    """A streamed answer that has sent its first event (it holds the model until its
    last event, or until its client leaves): use as a context manager."""
    r = requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=120)
    lines = r.iter_lines()
    next(lines)
    return r, lines


def test_cache_key_is_model_load_and_spec_fields(server):
    warm = {"model": TINY, "messages": []}
    assert server.chat(warm).json() is None
    loads = server.health()["loads"]
    # Same key: no reload, whatever the sampling or other fields.
    server.chat({**warm, "temperature": 0.7, "nctx": 2048})
    server.chat(chat_body(model=TINY, max_tokens=2))
    # Devices compare as resolved: "cpu" is what an unset compute chooses here.
    server.chat({**warm, "compute": "cpu"})
    server.chat({**warm, "compute": "CPU", "cache_type_k": "q8_0"})
    assert server.health()["loads"] == loads
    pid = server.health()["worker_pid"]
    greedy = chat_body("Name three colours.", model=TINY, max_tokens=12, temperature=0)
    before = server.chat(greedy).json()["choices"][0]["message"]["content"]
    assert before                                        # an answer to compare after the reloads
    # Each of these is a different key: one reload each, in place, in the same worker
    # process (docs/isolation.md), with the old model freed first.
    drafted = {"spec_type": "draft-simple", "spec_draft_model": TINY}
    for change in ({"nctx": 1024}, {"ngl": 0}, {"cache_type_k": "f16"},
                   {"spec_type": "draft-simple", "spec_draft_model": DEMO}, drafted):
        server.chat({**warm, **change})
        loads += 1
        assert server.health()["loads"] == loads, change
        assert server.health()["worker_pid"] == pid, change
        server.chat({**warm, **change})                 # and it stays resident
        assert server.health()["loads"] == loads, change
    assert server.stderr.count(f"loaded in worker process {pid} (reloaded in place)") == 5
    # Only a draft model is part of the key: the other spec_* fields (n-gram methods,
    # lengths, policy, no drafting) are one answer's own (geniex.speculative.per_answer).
    for own in ({"spec_type": "ngram-mod"}, {"spec_type": "ngram-mod", "spec_ngram_max": 5},
                {"spec_type": "ngram-mod", "spec_ngram_max": 5, "spec_draft_policy": "fixed"},
                {**drafted, "spec_n_max": 9, "spec_n_min": 1, "spec_p_min": 0.5},
                {"spec_type": ""}):
        server.chat({**warm, **own})
        assert server.health()["loads"] == loads, own
    # Completions never draft: they reuse the resident model whatever its spec setup.
    assert server.health()["speculative"]
    server.post("/v1/completions", {"model": TINY, "prompt": "Hi", "max_tokens": 1})
    assert server.health()["loads"] == loads
    # A model reloaded in place (the worker's sixth), answering a plain chat on its
    # draft model's load without drafting, answers as in a new process.
    assert server.chat(greedy).json()["choices"][0]["message"]["content"] == before
    assert server.health()["loads"] == loads and server.health()["worker_pid"] == pid


def test_a_model_loaded_for_a_completion_serves_a_plain_chat(server):
    # A completion (which accepts any drafter) loads the model without one: the plain
    # setup, which a plain chat then reuses instead of loading the same model again.
    server.chat({"model": DEMO, "messages": [], "nctx": 1280})          # another setting resident first
    loads = server.health()["loads"]
    assert server.post("/v1/completions", {"model": DEMO, "prompt": "Hi", "max_tokens": 1,
                                           "nctx": 1536}).status_code == 200
    assert server.health()["loads"] == loads + 1 and not server.health()["speculative"]
    assert server.chat(chat_body(max_tokens=1, nctx=1536)).status_code == 200
    assert server.health()["loads"] == loads + 1
    # n-gram drafting is an answer's own; a draft model is loaded with the model.
    server.chat({"model": DEMO, "messages": [], "nctx": 1536, "spec_type": "ngram-mod"})
    assert server.health()["loads"] == loads + 1
    server.chat({"model": DEMO, "messages": [], "nctx": 1536, "spec_type": "draft-simple", "spec_draft_model": DEMO})
    assert server.health()["loads"] == loads + 2


def test_keep_cache_header_reuses_the_conversation(server):
    first = chat_body("My name is Ada.", max_tokens=6)
    reply = server.chat(first, headers={"GenieX-KeepCache": "true"}).json()
    follow = {**first, "messages": first["messages"] + [
        {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
        {"role": "user", "content": "What is my name?"}]}
    kept = server.chat(follow, headers={"GenieX-KeepCache": "true"}).json()["usage"]
    assert kept["prompt_tokens_details"]["cached_tokens"] > 10
    assert kept["timings"]["cache_n"] + kept["timings"]["prompt_n"] == kept["prompt_tokens"]
    fresh = server.chat(follow, headers={"GenieX-KeepCache": "false"}).json()["usage"]     # starts clean
    assert fresh["prompt_tokens_details"]["cached_tokens"] == 0
    assert fresh["timings"]["prompt_n"] == fresh["prompt_tokens"]
    # Without the header the cached prefix is reused (as llama.cpp's cache_prompt), since
    # with the default q8_0 cache that cannot change the answer; cache_prompt false opts out.
    default = server.chat(follow).json()["usage"]
    assert default["prompt_tokens_details"]["cached_tokens"] > 10
    assert server.chat({**follow, "cache_prompt": False}).json()["usage"]["prompt_tokens_details"][
        "cached_tokens"] == 0


def test_queued_requests_are_all_answered_one_at_a_time(server):
    r, _ = started_stream(server, LONG)                 # holds the model
    with r, futures.ThreadPoolExecutor(5) as pool:
        answers = [pool.submit(server.chat, chat_body(f"Say a word about the number {i}.", max_tokens=8))
                   for i in range(5)]
        queued(server.cache, 5)                         # all five wait for the turn, none runs beside it
        assert not any(a.done() for a in answers)
        r.close()                                       # the first leaves: they are answered in turn
        results = [a.result() for a in answers]
    assert [a.status_code for a in results] == [200] * 5
    assert all(a.json()["usage"]["completion_tokens"] >= 1 for a in results)


def test_a_request_waits_while_a_stream_is_being_answered(server):
    r, lines = started_stream(server, {**LONG, "max_completion_tokens": 40})
    with r, futures.ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(server.chat, chat_body(max_tokens=2))
        queued(server.cache, 1)                         # waiting for its turn
        rest = [line for line in lines if line]
        assert rest[-1] == b"data: [DONE]"              # the stream ran to its end meanwhile
        assert waiter.result().status_code == 200


def test_client_disconnect_mid_stream_stops_the_answer(server):
    r = requests.post(server.url + "/v1/chat/completions", json={**LONG, "stream": True}, stream=True, timeout=60)
    chunks = 0
    for line in r.iter_lines():
        if line.startswith(b"data:"):
            chunks += 1
        if chunks >= 4:
            break
    r.close()                                            # hang up mid-answer
    # The answer (up to 2000 tokens) stops at its next step: the model is free again
    # with only the prompt and the first few tokens in its KV cache.
    until(lambda: not server.cache.busy, what="the model to be free")
    # The model runs in a worker process: the answer's logged profile says how far it got.
    left = re.findall(r"• (\d+) tok • .*\(stop: (\w+); the answer was left by its client\)", server.stderr)
    assert left and int(left[-1][0]) < 200, server.stderr
    ok = server.chat(chat_body(max_tokens=3))
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_keepalive_frees_an_idle_model(server):
    assert server.chat({"model": DEMO, "messages": []}).json() is None
    loads = server.health()["loads"]
    pid = server.health()["worker_pid"]
    keepalive = server.cache.keepalive
    try:
        server.cache.keepalive = 0.25                   # as `geniex serve --keepalive 0.25`
        server.cache._wake.set()                        # the idle clock reads it anew
        until(lambda: server.health()["model"] is None, what="the keepalive to free the model")
    finally:
        server.cache.keepalive = keepalive
    assert "freeing demo/SmolLM2-135M-Instruct:Q4_1 (idle for 0.25 s)" in server.stderr
    assert until(lambda: not _running(pid), what="the freed model's worker process to end")
    # Asked again, it is loaded again (in a new worker: the freed one gave its memory back).
    assert server.chat(chat_body(max_tokens=1)).status_code == 200
    assert server.health()["loads"] == loads + 1 and server.health()["worker_pid"] != pid


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _signalled_during_an_answer(tmp_path, *signals):
    """A `geniex serve` process sent ``signals`` once its long streamed answer has sent
    its first event; returns it and the answer's further events, read until its end."""
    s = Server(tmp_path)
    rest = []
    with requests.post(s.url + "/v1/chat/completions", json={**LONG, "stream": True}, stream=True, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)
        for sig in signals:
            s.proc.send_signal(sig)
        try:
            rest.extend(line for line in lines if line)
        except requests.exceptions.RequestException:
            pass                                        # a reset connection is one way to end
    return s, rest


def test_sigterm_ends_the_answer_in_flight_and_exits_cleanly(tmp_path):
    s, rest = _signalled_during_an_answer(tmp_path, signal.SIGTERM)
    assert rest[-1] == b"data: [DONE]"
    finish = json.loads(rest[-2][5:])
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["timings"]["stop_reason"] == "user"
    assert finish["timings"]["predicted_n"] < 2000      # ended early, not run to its length
    assert s.stop() == 0
    assert "freeing demo/SmolLM2-135M-Instruct:Q4_1 (the server is stopping)" in s.stderr
    assert "Traceback" not in s.stderr, s.stderr[s.stderr.find("Traceback") - 300:][:4000]


def test_a_second_signal_stops_at_once_and_cleanly(tmp_path):
    # The second signal kills the model's worker and closes every connection without
    # waiting for the answer in flight (the order of that close is test_server_units').
    s, _ = _signalled_during_an_answer(tmp_path, signal.SIGTERM, signal.SIGINT)
    assert s.stop() == 0
    assert "stopping now: closing every connection" in s.stderr
    assert "did not end within" not in s.stderr        # the first signal's wait ended with the second
    assert "Traceback" not in s.stderr, s.stderr[s.stderr.find("Traceback") - 300:][:4000]


def test_keepalive_from_the_environment_and_ctrl_c_stops_an_idle_server(tmp_path):
    # Two checks of `geniex serve` as a process, on one process start.
    s = Server(tmp_path, env={"GENIEX_KEEPALIVE": "42"})
    try:
        assert s.health()["keepalive"] == 42
        assert s.chat(chat_body(max_tokens=1)).status_code == 200
    finally:
        code = s.stop(signal.SIGINT)
    assert code == 0
    assert "Traceback" not in s.stderr
