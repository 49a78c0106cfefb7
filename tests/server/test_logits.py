"""GenieX's ``POST /v1/logits`` through the real server: one prefill-only pass over
``input_ids``, the last position (default) or every one, ``top_n`` (default 20), checked
against the token probabilities the decoding loop reports, and its bounds."""
import pytest

from serverproc import AppServer, DEMO, chat_body, check_shape, ok

NCTX = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("logits-data"), nctx=NCTX, model=DEMO) as s:
        yield s


@pytest.fixture(scope="module")
def ids(server):
    r = server.post("/tokenize", {"content": "The capital of France is Paris, and the capital of Italy is"})
    return r.json()["tokens"]


def test_last_position_by_default(server, ids):
    body = ok(server.post("/v1/logits", {"input_ids": ids}))
    check_shape(body, "Logits")
    assert body["model"] == DEMO and body["last_only"] is True and body["top_n"] == 20
    assert body["n_tokens"] == len(ids) and body["usage"]["prompt_tokens"] == len(ids)
    (row,) = body["data"]
    assert row["index"] == len(ids) - 1 and row["token_id"] == ids[-1] and row["next_token_logprob"] is None
    top = row["top"]
    assert len(top) == 20
    assert [t["logit"] for t in top] == sorted((t["logit"] for t in top), reverse=True)
    # log-softmax of the same row: logit differences equal logprob differences
    for t in top:
        assert t["logit"] - top[0]["logit"] == pytest.approx(t["logprob"] - top[0]["logprob"], abs=1e-4)
    assert top[0]["logprob"] < 0


def test_agrees_with_the_decoding_loop(server, ids):
    """The loop's first answer token comes from the same position: the same top tokens and
    log-probabilities (n_probs on /completion with the same token ids)."""
    top = ok(server.post("/v1/logits", {"input_ids": ids, "top_n": 5}))["data"][0]["top"]
    first = ok(server.post("/completion", {"prompt": ids, "n_predict": 1, "n_probs": 5}))["completion_probabilities"][0]
    assert [t["token_id"] for t in top] == [t["id"] for t in first["top_logprobs"]]
    assert [t["logprob"] for t in top] == pytest.approx([t["logprob"] for t in first["top_logprobs"]], abs=1e-3)
    assert first["id"] == top[0]["token_id"]                  # greedy takes the largest logit


def test_every_position(server, ids):
    body = ok(server.post("/v1/logits", {"input_ids": ids, "last_only": False, "top_n": 50}))
    rows = body["data"]
    assert [r["index"] for r in rows] == list(range(len(ids))) and [r["token_id"] for r in rows] == ids
    for r, nxt in zip(rows, ids[1:]):
        listed = {t["token_id"]: t["logprob"] for t in r["top"]}
        assert r["next_token_logprob"] < 0
        if nxt in listed:
            assert listed[nxt] == pytest.approx(r["next_token_logprob"], abs=1e-6)
    assert rows[-1]["next_token_logprob"] is None
    last = ok(server.post("/v1/logits", {"input_ids": ids, "top_n": 50}))["data"][0]
    assert [t["token_id"] for t in last["top"]] == [t["token_id"] for t in rows[-1]["top"]]
    # a continuation the model finds likely scores higher than a scrambled one
    assert sum(r["next_token_logprob"] for r in rows[:-1]) > sum(
        r["next_token_logprob"] for r in ok(server.post("/v1/logits", {"input_ids": ids[::-1], "last_only": False,
                                                                       "top_n": 1}))["data"][:-1])


def test_leaves_no_state_behind(server, ids):
    before = ok(server.chat(chat_body("Say hello.", max_tokens=8)))["choices"][0]["message"]["content"]
    ok(server.post("/v1/logits", {"input_ids": ids}))
    after = ok(server.chat(chat_body("Say hello.", max_tokens=8), headers={"GenieX-KeepCache": "true"}))
    assert after["choices"][0]["message"]["content"] == before


@pytest.mark.parametrize("body, param", [
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": "The capital"}, "input_ids"),
    ({"input_ids": [1, 10 ** 7]}, "input_ids"),
    ({"input_ids": [1, 2], "prompt": "The capital"}, "prompt"),
    ({"input_ids": [1, 2], "top_n": 0}, "top_n"),
    ({"input_ids": [1, 2], "top_n": 1001}, "top_n"),
    ({"input_ids": [1] * 200, "last_only": False, "top_n": 1000}, "top_n"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = server.post("/v1/logits", body)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == param, r.text


def test_input_longer_than_the_context(server):
    r = server.post("/v1/logits", {"input_ids": [1] * (NCTX + 1)})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error" and err["n_prompt_tokens"] == NCTX + 1 and err["n_ctx"] == NCTX
