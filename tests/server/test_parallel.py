"""Several clients at once over HTTP (``geniex serve --parallel``): a request is answered
while another streams, a client that leaves frees its slot at the next step, /slots,
/health and /metrics show the slots, and answers given together equal the same requests
answered alone (the engine's exactness across methods: tests/speculative/test_slots_identity.py)."""
import concurrent.futures as futures
import json
import time

import pytest
import requests

from awaiting import until
from serverproc import DEMO, AppServer, chat_body

LONG = {"model": DEMO, "messages": [{"role": "user", "content": "Tell me a very long story about a dragon."}],
        "max_completion_tokens": 1500, "stream": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("parallel-data"), nctx=2048, parallel=2, metrics=True) as s:
        yield s


def stream(server, body):
    """A streamed answer that has sent text: (response, its lines iterator)."""
    r = requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=120)
    lines = r.iter_lines()
    for line in lines:
        if line.startswith(b"data:") and b'"content"' in line:
            break
    return r, lines


def busy_slots(server):
    return sum(s["is_processing"] for s in server.get("/slots").json())


def test_a_request_is_answered_while_another_streams_and_slots_show_it(server):
    r, lines = stream(server, LONG)
    try:
        assert busy_slots(server) == 1
        health = server.get("/health").json()
        assert health["slots"] == 2 and health["slots_busy"] == 1 and health["waiting"] == 0
        assert [s["id"] for s in health["slot_states"]] == [0, 1] and "prompt_cache" in health
        t0 = time.monotonic()
        short = server.chat(chat_body("Say hi.", max_tokens=4))
        assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 4
        assert time.monotonic() - t0 < 60
        # The long answer was streaming all along: it has not ended.
        more = [next(lines) for _ in range(5)]
        assert all(b"[DONE]" not in line for line in more)
        metrics = server.get("/metrics").text
        assert "llamacpp:requests_processing 1.0" in metrics
        per_decode = float(next(line.split()[-1] for line in metrics.splitlines()
                                if line.startswith("llamacpp:n_busy_slots_per_decode ")))
        assert per_decode > 1.0             # some decodes carried both answers
    finally:
        r.close()
    until(lambda: busy_slots(server) == 0, what="the left stream's slot to be free")


def test_a_client_that_leaves_frees_its_slot_for_the_next_request(server):
    first, _ = stream(server, LONG)
    second, _ = stream(server, LONG)
    try:
        assert busy_slots(server) == 2
        with futures.ThreadPoolExecutor(1) as pool:
            third = pool.submit(server.chat, chat_body("Say a word.", max_tokens=3))
            until(lambda: server.cache.waiting() == 1, what="the third request to wait for a slot")
            first.close()                       # hang up: its slot is free at its next step
            answer = third.result(timeout=120)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    finally:
        first.close()
        second.close()
    until(lambda: busy_slots(server) == 0, what="the slots to be free")


def test_answers_given_together_equal_the_same_requests_answered_alone(server):
    bodies = [chat_body(f"Write two sentences about the number {n}.", max_tokens=40, temperature=t, seed=9)
              for n, t in ((3, 0.0), (7, 0.8))]
    alone = []
    for body in bodies:
        r = server.chat({**body, "cache_prompt": False})
        assert r.status_code == 200
        alone.append(r.json()["choices"][0]["message"]["content"])
    with futures.ThreadPoolExecutor(2) as pool:
        together = [f.result() for f in [pool.submit(server.chat, body) for body in bodies]]
    assert [r.json()["choices"][0]["message"]["content"] for r in together] == alone
    report = server.get("/slots").json()
    assert sum(s["answers"] for s in report) >= 4 and json.dumps(report)
