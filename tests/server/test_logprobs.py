"""Token log-probabilities through the server (issue #17): OpenAI's chat ``logprobs`` /
``top_logprobs`` (the official SDK too), the legacy completions ``logprobs``, llama.cpp's
``n_probs`` on ``/completion``, streamed and not, their bounds, and the promise that
speculation does not change them (greedy and seeded, n-gram, draft-simple and the tiny
MTP pair)."""
import json
import math

import pytest
import requests

from serverproc import AppServer, DEMO, chat_body, check_shape, ok

# The SDKs are imported in the tests that use them: importing them takes seconds,
# paid at collection by every pytest-xdist worker otherwise.

REPEAT = "Repeat exactly: the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."
LOOP = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."
TOL = 1e-4                      # verify rows and one-row decodes agree to float tolerance


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("logprobs-data"), allow_paths=True) as s:     # tiny models by path
        yield s


def content_of(body):
    return body["choices"][0]["logprobs"]["content"]


def check_entries(entries, top, greedy):
    """Each entry: a log-probability, ``top`` alternatives most likely first, the chosen
    token's own value among them where it is listed (greedy: it is the first)."""
    for e in entries:
        assert e["logprob"] <= 0 and bytes(e["bytes"]).decode("utf-8", "ignore") == e["token"]
        alts = e["top_logprobs"]
        assert len(alts) == top
        values = [a["logprob"] for a in alts]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5
        listed = {a["id"]: a["logprob"] for a in alts}
        if e["id"] in listed:
            assert listed[e["id"]] == pytest.approx(e["logprob"], abs=1e-6)
        if greedy and top:
            assert alts[0]["id"] == e["id"]


def same_values(a, b):
    assert [e["id"] for e in a] == [e["id"] for e in b]
    for x, y in zip(a, b):
        assert x["logprob"] == pytest.approx(y["logprob"], abs=TOL)
        assert [t["id"] for t in x["top_logprobs"]] == [t["id"] for t in y["top_logprobs"]]
        assert [t["logprob"] for t in x["top_logprobs"]] == pytest.approx([t["logprob"] for t in y["top_logprobs"]],
                                                                         abs=TOL)


def test_chat_logprobs_shape_and_consistency(server):
    body = ok(server.chat(chat_body("Name three colours.", max_tokens=12, logprobs=True, top_logprobs=5)))
    check_shape(body, "ChatCompletion")
    entries = content_of(body)
    assert len(entries) == body["usage"]["completion_tokens"] == 12
    assert "".join(e["token"] for e in entries) == body["choices"][0]["message"]["content"]
    check_entries(entries, 5, greedy=True)
    # logprobs without top_logprobs: the chosen tokens only, the same values
    bare = content_of(ok(server.chat(chat_body("Name three colours.", max_tokens=12, logprobs=True))))
    assert [e["id"] for e in bare] == [e["id"] for e in entries]
    assert all(e["top_logprobs"] == [] for e in bare)
    assert [e["logprob"] for e in bare] == pytest.approx([e["logprob"] for e in entries], abs=1e-6)
    # not asked: null, as before
    assert ok(server.chat(chat_body("Name three colours.", max_tokens=3)))["choices"][0]["logprobs"] is None


def test_chat_logprobs_streamed_equal_the_whole_answer(server):
    body = chat_body("Name three colours.", max_tokens=12, logprobs=True, top_logprobs=3)
    whole = content_of(ok(server.chat(body)))
    events = server.stream("/v1/chat/completions", body)
    for e in events:
        check_shape(e, "ChatCompletionChunk")
    streamed = [t for e in events if e["choices"] and e["choices"][0]["logprobs"]
                for t in e["choices"][0]["logprobs"]["content"]]
    same_values(streamed, whole)


def test_openai_sdk_reads_logprobs(server):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    r = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=6, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 6 and all(len(c.top_logprobs) == 2 for c in content)
    assert "".join(c.token for c in content) == r.choices[0].message.content
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob
    legacy = client.completions.create(model=DEMO, prompt="The capital of France is", max_tokens=4, logprobs=2)
    assert len(legacy.choices[0].logprobs.tokens) == 4


SAMPLINGS = {"greedy": {}, "seeded": {"temperature": 0.9, "seed": 13, "top_k": 40}}
# ngram-mod last: test_completions_legacy_logprobs runs next (the same resident group,
# tests/server/conftest.py) and drafts with the same setup, so it loads nothing.
SPECS = {"draft-simple": {"spec_type": "draft-simple", "spec_draft_model": DEMO},
         "ngram-mod": {"spec_type": "ngram-mod"}}
NGRAM = {**SPECS["ngram-mod"], "spec_draft_policy": "fixed"}


@pytest.mark.resident("speculative")
def test_speculation_does_not_change_logprobs(server):
    """Each drafting method, greedy and seeded: the plain answers first (on the demo model
    the plain tests left resident), then each method's (two model loads, not two per
    method and sampling)."""
    # 24 tokens: the repeat is drafted from its first tokens on, so every method's drafts
    # are accepted (checked below) well within them.
    bodies = {name: chat_body(REPEAT, max_tokens=24, logprobs=True, top_logprobs=4, **sampling)
              for name, sampling in SAMPLINGS.items()}
    plain = {name: ok(server.chat(body)) for name, body in bodies.items()}
    for method, spec in SPECS.items():
        for name, body in bodies.items():
            spec_body = ok(server.chat({**body, "spec_draft_policy": "fixed", **spec}))
            assert spec_body["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0, (method, name)
            assert spec_body["choices"][0]["message"]["content"] == plain[name]["choices"][0]["message"]["content"], \
                (method, name)
            same_values(content_of(spec_body), content_of(plain[name]))
    for name in SAMPLINGS:
        check_entries(content_of(plain[name]), 4, greedy=name == "greedy")


@pytest.mark.resident("tiny")
def test_speculation_does_not_change_logprobs_with_draft_mtp(server, tiny):
    target, assistant = tiny["aligned"]
    body = {"model": str(target), "messages": [{"role": "user", "content": "The capital of France is"}],
            "max_completion_tokens": 24, "logprobs": True, "top_logprobs": 3}
    plain = ok(server.chat(body))
    spec = ok(server.chat({**body, "spec_type": "draft-mtp", "spec_draft_model": str(assistant), "spec_n_max": 3,
                           "spec_draft_policy": "fixed"}))
    assert spec["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    same_values(content_of(spec), content_of(plain))


@pytest.mark.resident("speculative")
def test_completions_legacy_logprobs(server):
    # Right after the speculation test: a completion that asks for no drafting takes the
    # resident n-gram session as it is, and the drafted one below has its setup (NGRAM).
    body = {"model": DEMO, "prompt": "The capital of France is", "max_tokens": 8, "logprobs": 3}
    r = ok(server.post("/v1/completions", body))
    check_shape(r, "Completion")
    lp, text = r["choices"][0]["logprobs"], r["choices"][0]["text"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 8
    for tok, off, value, top in zip(lp["tokens"], lp["text_offset"], lp["token_logprobs"], lp["top_logprobs"]):
        assert text[off:off + len(tok)] == tok
        assert 0 < len(top) <= 3 and max(top.values()) == pytest.approx(value, abs=1e-6)    # greedy: the likeliest
    events = server.stream("/v1/completions", body)
    parts = [e["choices"][0]["logprobs"] for e in events if e["choices"] and e["choices"][0]["logprobs"]]
    assert sum((p["tokens"] for p in parts), []) == lp["tokens"]
    assert sum((p["text_offset"] for p in parts), []) == lp["text_offset"]
    assert sum((p["token_logprobs"] for p in parts), []) == pytest.approx(lp["token_logprobs"], abs=TOL)
    # A raw prompt the model continues by repeating it, so the n-gram drafts are accepted
    # (and one rejected) within 16 tokens; REPEAT's continuation here is not a repeat
    # (one draft, none accepted in 30 tokens).
    spec = ok(server.post("/v1/completions", {**body, "prompt": LOOP, "max_tokens": 16, **NGRAM}))
    plain = ok(server.post("/v1/completions", {**body, "prompt": LOOP, "max_tokens": 16}))
    assert spec["usage"]["timings"]["draft_n_accepted"] > 0 == plain["usage"]["timings"]["draft_n"]
    assert spec["choices"][0]["logprobs"]["tokens"] == plain["choices"][0]["logprobs"]["tokens"]
    assert spec["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
        plain["choices"][0]["logprobs"]["token_logprobs"], abs=TOL)


def test_native_n_probs(server):
    body = {"model": DEMO, "prompt": "The capital of France is", "n_predict": 6, "n_probs": 4}
    r = ok(server.post("/completion", body))
    probs = r["completion_probabilities"]
    assert len(probs) == 6 and r["generation_settings"]["n_probs"] == 4
    assert "".join(p["token"] for p in probs) == r["content"]
    check_entries(probs, 4, greedy=True)
    with requests.post(server.url + "/completion", json={**body, "stream": True}, stream=True, timeout=120) as s:
        assert s.status_code == 200, s.text
        events = [json.loads(line[5:]) for line in s.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert events[-1]["stop"] is True and "completion_probabilities" not in events[-1]
    streamed = [p for e in events for p in e.get("completion_probabilities", [])]
    same_values(streamed, probs)
    assert "completion_probabilities" not in ok(server.post("/completion", {**body, "n_probs": 0}))


def test_values_are_the_raw_logits_not_the_biased_ones(server):
    """A logit bias that makes the second likeliest token win changes the answer, not the
    reported log-probabilities: they are the raw logits' (llama.cpp's n_probs without
    post_sampling_probs)."""
    body = {"model": DEMO, "prompt": "The capital of France is", "n_predict": 1, "n_probs": 2}
    plain = ok(server.post("/completion", body))["completion_probabilities"][0]
    first, second = plain["top_logprobs"]
    biased = ok(server.post("/completion", {**body, "logit_bias": [[second["id"], 50]]}))["completion_probabilities"][0]
    assert biased["id"] == second["id"]
    assert biased["logprob"] == pytest.approx(second["logprob"], abs=1e-6) and biased["logprob"] < first["logprob"]
    assert [t["id"] for t in biased["top_logprobs"]] == [first["id"], second["id"]]


@pytest.mark.parametrize("route, body, param", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/completion", {"n_probs": 101}, "n_probs"),
    ("/completion", {"n_probs": -1}, "n_probs"),
    ("/completion", {"n_probs": 2, "post_sampling_probs": True}, "post_sampling_probs"),
    ("/v1/responses", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/responses", {"include": ["message.output_text.logprobs"]}, "include"),
    ("/v1/responses", {"n_probs": 3}, "n_probs"),
    ("/v1/messages", {"n_probs": 3}, "n_probs"),
    ("/v1/messages", {"logprobs": True}, "logprobs"),
])
def test_logprob_bounds_are_400s(server, route, body, param):
    base = {"model": DEMO, "max_tokens": 2}
    if "chat" in route or "messages" in route:
        base["messages"] = [{"role": "user", "content": "hi"}]
    elif "responses" in route:
        base["input"] = "hi"
    else:
        base["prompt"] = "hi"
    r = server.post(route, {**base, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
