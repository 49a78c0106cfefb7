"""Per-request speculative decoding through the server: ``spec_*`` fields on the demo
model (n-gram and draft-simple) and on the tiny Gemma-4 MTP pair, acceptance in
``usage``, output identical to plain decoding, and setup failures that fall back."""
import pytest

from serverproc import DEMO, AppServer, chat_body

REPEAT = chat_body("Repeat exactly: the cat sat on the mat. the cat sat on the mat. "
                   "the cat sat on the mat.", max_tokens=40)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("spec-data"), allow_paths=True) as s:     # tiny models by path
        yield s


@pytest.fixture(scope="module")
def plain(server):
    """The greedy answer without speculation (speculation must not change it)."""
    return server.chat(REPEAT).json()


def answer(r):
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def acceptance(usage):
    """(drafted, accepted), checked to agree between OpenAI's and llama.cpp's fields."""
    timings = usage["timings"]
    details = usage.get("completion_tokens_details")
    if timings["draft_n"]:
        assert details["accepted_prediction_tokens"] == timings["draft_n_accepted"]
        assert details["rejected_prediction_tokens"] == timings["draft_n"] - timings["draft_n_accepted"]
    else:
        assert details is None
    return timings["draft_n"], timings["draft_n_accepted"]


def test_plain_has_no_acceptance_fields(plain):
    assert acceptance(plain["usage"]) == (0, 0)


# The tests run in an order that reloads the model least: the same speculative setup
# (the model cache's key) in a row (each test still sets everything it relies on).
def test_streamed_speculation_reports_acceptance_in_the_usage_chunk(server, plain):
    body = {**REPEAT, "spec_type": "ngram-mod", "spec_draft_policy": "fixed", "stream_options": {"include_usage": True}}
    events = server.stream("/v1/chat/completions", body)
    text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    usage = events[-1]["usage"]
    assert acceptance(usage)[0] > 0
    assert events[-2]["timings"]["draft_n"] == usage["timings"]["draft_n"]


def test_ngram_memory_lasts_across_requests_until_reset(server):
    """An agent that sends the same request again gets the earlier answer as drafts (the
    n-gram memory lives with the loaded model); POST /v1/spec/reset forgets it; the
    answer never changes."""
    body = {**chat_body("Write a short poem about the sea.", max_tokens=24),
            "spec_type": "ngram-mod", "spec_draft_policy": "fixed"}
    server.post("/v1/spec/reset", {})
    first = server.chat(body).json()
    again = server.chat(body).json()
    assert server.post("/v1/spec/reset", {}).json() == {
        "object": "spec.reset", "model": DEMO, "reset": True}
    fresh = server.chat(body).json()
    texts = {r["choices"][0]["message"]["content"] for r in (first, again, fresh)}
    assert len(texts) == 1
    remembered = again["usage"]["timings"]["draft_n_accepted"]
    assert remembered > fresh["usage"]["timings"]["draft_n_accepted"]
    assert remembered >= again["usage"]["completion_tokens"] // 2


def test_completions_never_draft_even_on_a_speculative_model(server):
    server.chat({"model": DEMO, "messages": [], "spec_type": "ngram-mod", "spec_draft_policy": "fixed"})
    loads = server.health()["loads"]
    r = server.post("/v1/completions", {"model": DEMO, "prompt": "a b a b a b a b a b", "max_tokens": 12}).json()
    assert r["usage"]["timings"]["draft_n"] == 0 and "completion_tokens_details" not in r["usage"]
    assert server.health()["loads"] == loads


@pytest.mark.parametrize("spec", [
    {"spec_type": "ngram-mod"},
    {"spec_type": "ngram-simple", "spec_n_max": 5},
    {"spec_type": "ngram-mod,draft-simple", "spec_draft_model": DEMO, "spec_n_max": 4, "spec_n_min": 1},
    {"spec_type": "draft-simple", "spec_draft_model": DEMO},        # as the next test: no reload between
])
def test_speculation_on_the_demo_model(server, plain, spec):
    # Fixed draft lengths: these tests are about the spec fields reaching the drafters and
    # acceptance being reported; the auto policy may rightly choose not to draft.
    r = server.chat({**REPEAT, "spec_draft_policy": "fixed", **spec})
    assert answer(r) == plain["choices"][0]["message"]["content"]
    drafted, accepted = acceptance(r.json()["usage"])
    assert drafted > 0 and accepted > 0
    assert r.json()["usage"]["timings"]["steps"] < plain["usage"]["timings"]["steps"]
    # Only a draft model is loaded with the model; n-gram drafting is the answer's own.
    assert server.health()["speculative"] == ("draft-simple" in spec["spec_type"])


def test_spec_fields_that_need_no_draft_model_are_the_answers_own_and_never_reload(server, plain):
    """With draft-simple loaded, n-gram methods, other draft lengths and policies, and no
    speculation at all are settings of one answer: the model stays loaded, and each
    answer is the plain one, drafted as its own fields say."""
    loaded = {"spec_type": "draft-simple", "spec_draft_model": DEMO, "spec_draft_policy": "fixed"}
    server.chat({**REPEAT, **loaded, "max_tokens": 1})
    loads, want = server.health()["loads"], plain["choices"][0]["message"]["content"]
    usage = {}
    for name, spec in {"ngram": {"spec_type": "ngram-simple", "spec_draft_policy": "fixed"},
                       "none": {"spec_type": ""},
                       "short": {**loaded, "spec_n_max": 1},
                       "long": {**loaded, "spec_n_max": 6},
                       "auto": {**loaded, "spec_n_max": 6, "spec_draft_policy": "auto"},
                       "again": loaded}.items():
        r = server.chat({**REPEAT, **spec})
        assert answer(r) == want, name
        usage[name] = r.json()["usage"]["timings"]
    assert server.health()["loads"] == loads and server.health()["speculative"]
    assert usage["ngram"]["draft_n"] > 0 and usage["none"]["draft_n"] == 0
    # At most one draft token per step, up to six, then the loaded three again: each
    # answer drafts by its own spec_n_max.
    assert usage["short"]["draft_n"] <= usage["short"]["steps"] and usage["short"]["steps"] > usage["again"]["steps"]
    assert usage["long"]["draft_n"] > 3 * usage["long"]["steps"] and usage["long"]["steps"] < usage["again"]["steps"]
    assert 0 < usage["again"]["draft_n"] <= 3 * usage["again"]["steps"]


def test_draft_simple_with_itself_accepts_nearly_everything(server):
    # The target reads the prompt in F16 (geniex.engine.prompt_reader) and the draft model
    # decodes it on its own cache: their cells differ by rounding, so a self-draft may
    # part from the target at a near-tie; elsewhere it proposes the target's tokens.
    usage = server.chat({**REPEAT, "spec_type": "draft-simple", "spec_draft_model": DEMO,
                         "spec_draft_policy": "fixed"}).json()["usage"]
    drafted, accepted = acceptance(usage)
    assert drafted > 0 and accepted >= 0.8 * drafted


def test_setup_failure_falls_back_to_plain_decoding(server, plain):
    for spec in ({"spec_type": "bogus"}, {"spec_type": "draft-mtp", "spec_draft_model": DEMO}):
        r = server.chat({**REPEAT, **spec})
        assert answer(r) == plain["choices"][0]["message"]["content"]
        assert acceptance(r.json()["usage"]) == (0, 0)
    assert not server.health()["speculative"]       # (the MTP setup was a load; bogus was not)
    assert "speculative decoding setup failed; falling back to plain decoding" in server.stderr


def test_draft_mtp_on_the_tiny_gemma4_pair(server, tiny):
    for target, assistant in (tiny["pair"], tiny["aligned"]):
        body = {"model": str(target), "messages": [{"role": "user", "content": "The capital of France is"}],
                "max_completion_tokens": 24}
        base = server.chat(body)
        # Fixed lengths: on the tiny pair a draft costs as much as a target decode, so the
        # auto policy (rightly) stops drafting; this test is about the MTP path itself.
        r = server.chat({**body, "spec_type": "draft-mtp", "spec_draft_model": str(assistant), "spec_n_max": 3,
                         "spec_draft_policy": "fixed"})
        assert answer(r) == answer(base)
        assert server.health()["speculative"]
        drafted, accepted = acceptance(r.json()["usage"])
        assert drafted > 0
    assert accepted > 0          # the aligned pair's draft agrees with its target


def test_mismatched_mtp_pair_falls_back_without_crashing(server, tiny):
    target, draft, _reason = tiny["mismatched"]["width"]
    body = {"model": str(target), "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 4,
            "spec_type": "draft-mtp", "spec_draft_model": str(draft)}
    r = server.chat(body)
    assert r.status_code == 200 and not server.health()["speculative"]
    # The server lives on: it loads and answers another model (the tiny pair's target,
    # a 0.4 MB load where the demo model's is 100 MB).
    other = {"model": str(tiny["pair"][0]), "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 2}
    loads = server.health()["loads"]
    assert server.chat(other).status_code == 200 and server.health()["loads"] == loads + 1
