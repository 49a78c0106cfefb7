"""OpenAI's ``prediction`` through the real server: the answer is the one without it,
drafted from the prediction (counted in ``usage.completion_tokens_details``) even
though the request names no speculative method."""
import dataclasses

import pytest

from serverproc import AppServer, DEMO, ok

# An f16 cache's split attention on every core (tests/support/parallel.py).
pytestmark = pytest.mark.all_cores

ASK = {"model": DEMO, "max_tokens": 40,
       "messages": [{"role": "user", "content": "Name five colours, one per line, with a fruit of that colour."}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("prediction"), nctx=512) as s:
        yield s


def test_a_prediction_drafts_the_answer_without_changing_it(server):
    plain = ok(server.chat(ASK))
    text = plain["choices"][0]["message"]["content"]
    assert "completion_tokens_details" not in plain["usage"]              # nothing drafted without it
    predicted = ok(server.chat({**ASK, "prediction": {"type": "content", "content": [{"type": "text", "text": text}]}}))
    assert predicted["choices"][0]["message"]["content"] == text
    details = predicted["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] >= plain["usage"]["completion_tokens"] // 2


@pytest.mark.parametrize("threads", [2, 1])
def test_a_prediction_is_refused_only_where_it_could_change_the_answer(tmp_path, monkeypatch, threads):
    # An F16 cache on two threads splits one-row attention past 512 cells: drafted rows
    # would then not be the plain answer's bits; on one thread they are. ``geniex serve``
    # loads on every core the process may use (no flag sets it), so the test sets the
    # thread count where the server opens the model: both cases run on any runner.
    from geniex.server.worker import WorkerSession
    opened = WorkerSession.open.__func__

    def open_on_threads(cls, target, options, previous=None, **kw):
        return opened(cls, target, dataclasses.replace(options, threads=threads, threads_batch=threads), previous,
                      **kw)

    monkeypatch.setattr(WorkerSession, "open", classmethod(open_on_threads))
    # A fixed draft policy (set at load, by the first request): the prediction is
    # drafted as long as it goes, whatever this machine's verify costs.
    f16 = {**ASK, "cache_type_k": "f16", "cache_type_v": "f16", "spec_draft_policy": "fixed"}
    # One slot: a load with slots measures the verify costs of its setting (an f16 cache on
    # these threads: none the suite has measured), 2.5 s that neither case uses.
    with AppServer(tmp_path, nctx=512, parallel=1) as s:
        if threads > 1:
            r = s.chat({**f16, "max_tokens": 4, "prediction": {"type": "content", "content": "Red: apple"}})
            assert r.status_code == 400 and r.json()["error"]["param"] == "prediction", r.text
            assert f"f16/f16 KV cache on {threads} threads" in r.json()["error"]["message"]
        else:
            plain = ok(s.chat(f16))
            text = plain["choices"][0]["message"]["content"]
            predicted = ok(s.chat({**f16, "prediction": {"type": "content", "content": text}}))
            assert predicted["choices"][0]["message"]["content"] == text
            details = predicted["usage"]["completion_tokens_details"]
            assert details["accepted_prediction_tokens"] >= plain["usage"]["completion_tokens"] // 2
