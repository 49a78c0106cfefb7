"""OpenAI's ``prediction`` through the real server: the answer is the one without it,
drafted from the prediction (counted in ``usage.completion_tokens_details``) even
though the request names no speculative method."""
import pytest

from geniex.config import physical_cores
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


def test_a_prediction_that_could_change_the_answer_is_refused(server):
    # An F16 cache on two threads splits one-row attention past 512 cells: drafted rows
    # would then not be the plain answer's bits.
    r = server.chat({**ASK, "max_tokens": 4, "cache_type_k": "f16", "cache_type_v": "f16",
                     "prediction": {"type": "content", "content": "Red: apple"}})
    if physical_cores() > 1:
        assert r.status_code == 400 and r.json()["error"]["param"] == "prediction", r.text
    else:                                       # one thread: one-row decodes never split
        assert r.status_code == 200, r.text
