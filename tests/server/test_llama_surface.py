"""Where llama-server's clients already are (issue #20): llama.cpp's routes, fields,
shapes and metrics on our engine, through real HTTP and, where one exists, the real
client (the OpenAI SDK for /v1/responses and embeddings, the Anthropic SDK for
/v1/messages, prometheus_client's parser for /metrics).

One in-process server (create_app on a loopback port) with ``--model`` set to the demo
model, ``--metrics`` on, and a store holding the demo model and a copy of it that
declares a pooling and FIM tokens (tests/support/demo_variants.py).
"""
import base64
import io
import json
import re
import struct

import pytest
import requests

from demo_variants import FIM, demo_with_pooling_and_fim
from geniex.store import Store
from serverproc import AppServer, DEMO, calibrate_as, check_shape, ok, seed_calibration

VARIANT = "test/demo-embed-fim:Q4_1"
REPEAT = "Repeat exactly: the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."
SPEC = {"spec_type": "ngram-mod", "spec_draft_policy": "fixed"}
# Both kinds of drafter in one setup: the n-gram drafts where the answer repeats, the
# draft model (the demo model itself) where it finds none.
CHAIN = {"spec_type": "ngram-mod,draft-simple", "spec_draft_model": DEMO, "spec_n_max": 4, "spec_n_min": 1,
         "spec_draft_policy": "fixed"}


@pytest.fixture(scope="module")
def variant(tmp_path_factory, demo_model):
    return demo_with_pooling_and_fim(demo_model, tmp_path_factory.mktemp("variant") / "demo-embed-fim.Q4_1.gguf")


@pytest.fixture(scope="module")
def server(tmp_path_factory, variant, demo_model, calibration_cache):
    data = tmp_path_factory.mktemp("llama-surface")
    stored = Store(data).pull(VARIANT, local_path=variant, out=io.StringIO(), interactive=False)
    # The stored variant has the demo model's curves (its tensors): its loads measure none.
    seed_calibration(data)
    calibrate_as(data / "calibration.json", stored.path, demo_model)
    with AppServer(data, nctx=1024, model=DEMO, metrics=True) as s:
        yield s


def error_of(r, status):
    assert r.status_code == status, r.text
    check_shape(r.json(), "Error")
    return r.json()["error"]


def native_stream(server, path, body):
    """llama.cpp's native stream: ``data:`` events and no ``[DONE]``."""
    with requests.post(server.url + path, json={**body, "stream": True}, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        lines = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert "data: [DONE]" not in lines
    return [json.loads(line[5:]) for line in lines if line.startswith("data:")]


# -- /completion, /completions (llama.cpp's native shape) -------------------------------------
def test_completion_native_shape_and_n_predict(server):
    body = ok(server.post("/completion", {"prompt": "The capital of France is", "n_predict": 6}))
    assert body["stop"] is True and body["tokens_predicted"] == 6 and body["stop_type"] == "limit"
    assert body["content"].startswith(" Paris") and body["tokens"] == []
    assert body["tokens_evaluated"] == body["timings"]["prompt_n"] + body["timings"]["cache_n"]
    assert body["model"] == DEMO and body["generation_settings"]["n_predict"] == 6
    same = ok(server.post("/completions", {"prompt": "The capital of France is", "n_predict": 6}))
    assert same["content"] == body["content"]


def test_completion_token_array_prompt_and_return_tokens(server):
    toks = ok(server.post("/tokenize", {"content": "The capital of France is"}))["tokens"]
    by_text = ok(server.post("/completion", {"prompt": "The capital of France is", "n_predict": 5,
                                             "return_tokens": True}))
    for prompt in (toks, [toks]):
        by_ids = ok(server.post("/completion", {"prompt": prompt, "n_predict": 5, "return_tokens": True}))
        assert by_ids["tokens"] == by_text["tokens"] and len(by_ids["tokens"]) == 5
    detok = ok(server.post("/detokenize", {"tokens": by_text["tokens"]}))
    assert detok["content"] == by_text["content"]
    err = error_of(server.post("/completion", {"prompt": [10 ** 7], "n_predict": 2}), 400)
    assert err["param"] == "prompt" and "not a token id" in err["message"]


def test_completion_several_prompts_give_a_list(server):
    toks = ok(server.post("/tokenize", {"content": "Once upon a time"}))["tokens"]
    one = ok(server.post("/completion", {"prompt": "Once upon a time", "n_predict": 4}))
    rows = ok(server.post("/completion", {"prompt": ["Once upon a time", toks], "n_predict": 4}))
    assert [r["index"] for r in rows] == [0, 1] and rows[0]["content"] == rows[1]["content"] == one["content"]
    err = error_of(server.post("/completion", {"prompt": ["a", "b"], "n_predict": 4, "stream": True}), 400)
    assert err["param"] == "prompt"


def test_completion_stream_is_native_and_matches(server):
    whole = ok(server.post("/completion", {"prompt": "Once upon a time", "n_predict": 8}))
    events = native_stream(server, "/completion", {"prompt": "Once upon a time", "n_predict": 8})
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["timings"]["predicted_n"] == 8


def test_v1_completions_honours_n_predict_and_token_prompts(server):
    body = ok(server.post("/v1/completions", {"model": DEMO, "prompt": "The capital of France is", "n_predict": 3}))
    assert body["usage"]["completion_tokens"] == 3
    toks = ok(server.post("/tokenize", {"content": "The capital of France is"}))["tokens"]
    by_ids = ok(server.post("/v1/completions", {"model": DEMO, "prompt": toks, "max_tokens": 3}))
    assert by_ids["choices"][0]["text"] == body["choices"][0]["text"]


# -- speculation on every decoding route: same tokens, acceptance reported -------------------
# Tokens per answer in the identity checks: the repeat prompt is drafted from its first
# tokens on (the n-gram finds it in the prompt), so 16 tokens hold several accepted drafts
# and still take fewer steps than plain decoding, and every sampler's answer parts from
# its answer with the sampler switched off (each test asserts both). 12 tokens passed here,
# but a sampler's switched-off answer can stay equal for a dozen tokens (dynatemp's did
# on a shorter prompt): 16 keeps a margin on other CPUs' numerics.
ANSWER = 16
# The routes' answers are as long: what they check is each route's way to the engine;
# 12 greedy tokens of the repeat take several accepted drafts and fewer steps, which
# each one must show.
ROUTE_ANSWER = 12
KEEP = {"GenieX-KeepCache": "true"}


REPEAT_CHAT = [{"role": "user", "content": REPEAT}]


def _decode(server, route, spec, raw):
    """(text, timings) of one answer of the repeat prompt on ``route``, of ROUTE_ANSWER
    tokens. The prompt stays in the KV cache for the next answer (``GenieX-KeepCache``):
    the two completion routes answer ``raw``, the chat prompt as the template renders it
    (REPEAT_CHAT, fetched from /apply-template), and the three chat routes render the same
    one, so a load decodes the demo model's prompt once instead of once per answer."""
    n, chat = ROUTE_ANSWER, REPEAT_CHAT
    post = lambda body: ok(server.post(route, {**body, **spec}, headers=KEEP))      # noqa: E731
    if route == "/completion":
        body = post({"prompt": raw, "n_predict": n})
        return body["content"], body["timings"]
    if route == "/v1/completions":
        body = post({"prompt": raw, "max_tokens": n})
        return body["choices"][0]["text"], body["timings"]
    if route == "/chat/completions":
        body = post({"messages": chat, "max_tokens": n})
        return body["choices"][0]["message"]["content"], body["timings"]
    if route == "/infill":
        body = post({"model": VARIANT, "input_prefix": REPEAT, "input_suffix": "", "prompt": REPEAT[16:40],
                     "n_predict": n})
        return body["content"], body["timings"]
    if route == "/v1/responses":
        body = post({"input": REPEAT, "max_output_tokens": n})
        return body["output"][0]["content"][0]["text"], body["timings"]
    body = post({"messages": chat, "max_tokens": n})
    return body["content"][0]["text"], body["timings"]


# /infill answers with the FIM variant; every change of model or settings reloads the
# model (in place, in its worker process).
ROUTES = ["/completion", "/v1/completions", "/chat/completions", "/v1/responses", "/v1/messages", "/infill"]
SAMPLINGS = {"greedy": {}, "seeded": {"temperature": 0.5, "top_k": 5, "seed": 23}}
# Tests that need a model or setting resident run grouped by it (tests/server/conftest.py):
# this one ends with the demo model drafting by SPEC, where the next group starts.
resident = pytest.mark.resident


@resident("every route")
def test_every_decoding_route_gives_the_same_tokens_with_speculation(server):
    """Greedy and seeded, every route: the plain answers first, then the speculative ones,
    in an order that loads each (model, setting) once: the demo model plain, the FIM
    variant plain, then drafting, the variant and the demo model (three loads, not two
    per route and sampling)."""
    demo_routes = [route for route in ROUTES if route != "/infill"]
    order = [(route, name) for route in demo_routes for name in SAMPLINGS] + \
        [("/infill", name) for name in SAMPLINGS]
    raw = ok(server.post("/apply-template", {"messages": REPEAT_CHAT}))["prompt"]
    plain = {(route, name): _decode(server, route, SAMPLINGS[name], raw) for route, name in order}
    for route, name in reversed(order):
        spec, timings = _decode(server, route, {**SPEC, **SAMPLINGS[name]}, raw)
        text, plain_timings = plain[route, name]
        assert spec == text, (route, name)
        assert plain_timings["draft_n"] == 0, (route, name)
        assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0, (route, name)
        assert timings["steps"] < plain_timings["steps"], (route, name)
        # each route's seeded answer came after its greedy one and reused its prompt
        assert name == "greedy" or plain_timings["cache_n"] > 0, (route, plain_timings)


# -- tokenize, detokenize, props, slots ----------------------------------------
def test_tokenize_special_and_pieces(server):
    plain = ok(server.post("/tokenize", {"content": "<|im_start|>hi"}))["tokens"]
    literal = ok(server.post("/tokenize", {"content": "<|im_start|>hi", "parse_special": False}))["tokens"]
    assert plain[0] == 1 and len(literal) > len(plain)            # <|im_start|> is token 1
    pieces = ok(server.post("/tokenize", {"content": "unicode 媽", "with_pieces": True}))["tokens"]
    assert all({"id", "piece"} <= set(p) for p in pieces)
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert joined.decode() == "unicode 媽"
    err = error_of(server.post("/detokenize", {"tokens": [10 ** 7]}), 400)
    assert err["param"] == "tokens"


def test_props_and_slots(server):
    ok(server.post("/completion", {"prompt": "hi", "n_predict": 1}))
    props = ok(server.get("/props"))
    assert props["model_path"].endswith(".gguf") and props["total_slots"] == 4   # --parallel's default
    assert props["default_generation_settings"]["n_ctx"] == 1024 and "<|im_start|>" in props["chat_template"]
    slots = ok(server.get("/slots"))
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 1024 and s["is_processing"] is False for s in slots)
    assert sum(s["answers"] for s in slots) >= 1 and "prompt_cache" in slots[0]
    assert "params" not in slots[0]


def test_slots_and_metrics_can_be_off(tmp_path):
    with AppServer(tmp_path, slots=False) as s:
        assert error_of(s.get("/slots"), 501)["type"] == "not_supported_error"
        assert error_of(s.get("/metrics"), 501)["type"] == "not_supported_error"


# -- /metrics -----------------------------------------------------------------------------------
@resident("demo ngram-mod")
def test_metrics_parse_and_count_speculation_per_method(server):
    from prometheus_client.parser import text_string_to_metric_families

    def scrape():
        r = server.get("/metrics")
        assert r.status_code == 200 and "Process-Start-Time-Unix" in r.headers
        return {s.name: s for f in text_string_to_metric_families(r.text) for s in f.samples
                if not s.labels or s.labels.get("method") == "ngram-mod" and "le" not in s.labels}

    before = scrape()
    body = ok(server.post("/completion", {"prompt": REPEAT + "\n" + REPEAT[16:], "n_predict": 16, **SPEC}))
    after = scrape()
    t = body["timings"]
    delta = lambda name: after[name].value - before.get(name, after[name]).value * (name in before)
    assert delta("llamacpp:tokens_predicted_total") == t["predicted_n"]
    assert delta("llamacpp:prompt_tokens_total") == t["prompt_n"]
    assert delta("llamacpp:spec_decode_num_draft_tokens_total") == t["draft_n"]
    assert delta("llamacpp:spec_decode_num_accepted_tokens_total") == t["draft_n_accepted"]
    assert delta("geniex:spec_decode_num_accepted_tokens_total") == t["draft_n_accepted"]
    assert delta("geniex:spec_decode_accepted_length_count") == sum(t["accept_hist"])
    assert after["llamacpp:requests_processing"].value == 0
    # Typed as llama-server types them: counters, n_tokens_max among them (no _total suffix).
    text = server.get("/metrics").text
    assert "# TYPE llamacpp:n_tokens_max counter" in text and "# TYPE llamacpp:prompt_tokens_total counter" in text
    assert after["llamacpp:n_tokens_max_total"].value >= t["prompt_n"]     # (the parser names a counter so)


@resident("demo ngram-mod,draft-simple")
def test_metrics_histogram_per_method_with_two_drafters(server):
    """Two drafting methods in one request: a sample set per method, whose counters add up
    to the llama.cpp totals, and an accepted-length histogram whose buckets are cumulative
    and end at its count (prometheus_client's parser reads all of it)."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape():
        return [s for f in text_string_to_metric_families(server.get("/metrics").text) for s in f.samples]

    def per_method(samples, name):
        return {s.labels["method"]: s.value for s in samples if s.name == name and "le" not in s.labels}

    def total(samples, name):
        return next(s.value for s in samples if s.name == name and not s.labels)

    both = {"n_predict": 24, **CHAIN}
    before = scrape()
    # the n-gram drafts a repeat; a new text has no n-gram to follow, so the draft model drafts
    t = {"draft_n": 0}
    for prompt in (REPEAT + "\n" + REPEAT[16:], "Write a short poem about the sea."):
        t["draft_n"] += ok(server.post("/completion", {"prompt": prompt, **both}))["timings"]["draft_n"]
    after = scrape()
    for name in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
        grown = {m: v - per_method(before, f"geniex:{name}_total").get(m, 0)
                 for m, v in per_method(after, f"geniex:{name}_total").items()}
        assert sum(grown.values()) == total(after, f"llamacpp:{name}_total") - total(before, f"llamacpp:{name}_total")
    assert sum(v - per_method(before, "geniex:spec_decode_num_draft_tokens_total").get(m, 0)
               for m, v in per_method(after, "geniex:spec_decode_num_draft_tokens_total").items()) == t["draft_n"]
    methods = set(per_method(after, "geniex:spec_decode_accepted_length_count"))
    assert methods == {"ngram-mod", "draft-simple"}
    for method in methods:
        buckets = sorted((float(s.labels["le"]), s.value) for s in after
                         if s.name == "geniex:spec_decode_accepted_length_bucket" and s.labels["method"] == method)
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and buckets[-1][0] == float("inf")
        assert buckets[-1][1] == per_method(after, "geniex:spec_decode_accepted_length_count")[method]


# -- /infill --------------------------------------------------------------------------------------
@resident("variant")
def test_infill_lays_out_the_models_fim_tokens(server):
    body = ok(server.post("/infill", {"model": VARIANT, "input_prefix": "def add(a, b):\n    return ",
                                      "input_suffix": "\n", "n_predict": 4}))
    pre = ok(server.post("/tokenize", {"model": VARIANT, "content": "def add(a, b):\n    return ",
                                       "parse_special": False}))["tokens"]
    suf = ok(server.post("/tokenize", {"model": VARIANT, "content": "\n", "parse_special": False}))["tokens"]
    # [FIM_PRE] prefix [FIM_SUF] suffix [FIM_MID]
    assert body["tokens_evaluated"] == len(pre) + len(suf) + len(FIM)
    assert body["tokens_predicted"] == 4


@resident("variant")
def test_infill_is_refused_for_a_model_without_fim_tokens(server):
    err = error_of(server.post("/infill", {"input_prefix": "def f(", "input_suffix": ")"}), 501)
    assert "fill-in-the-middle" in err["message"] and DEMO in err["message"]


# -- embeddings, rerank -----------------------------------------------------------------------------
@resident("variant")
def test_embeddings_through_the_openai_client(server):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    out = client.embeddings.create(model=VARIANT, input=["hello world", "hello world", "a cat"])
    vecs = [d.embedding for d in out.data]
    assert len(vecs) == 3 and len(vecs[0]) == 576
    assert abs(sum(x * x for x in vecs[0]) - 1) < 1e-4                # euclidean-normalised
    assert vecs[0] == vecs[1] and vecs[0] != vecs[2]
    assert out.usage.prompt_tokens > 0
    counted = [line for line in server.get("/metrics").text.splitlines()
               if line.startswith("llamacpp:prompt_tokens_total ")]
    assert float(counted[0].split()[1]) >= out.usage.prompt_tokens        # embeddings are counted too
    b64 = client.embeddings.create(model=VARIANT, input="hello world", encoding_format="base64")
    packed = base64.b64decode(b64.data[0].embedding)               # the SDK leaves base64 as sent
    assert struct.unpack(f"<{len(packed) // 4}f", packed) == pytest.approx(vecs[0], abs=1e-6)
    with pytest.raises(openai.APIStatusError) as e:
        client.embeddings.create(model=DEMO, input="hello")
    assert e.value.status_code == 501 and "declares no pooling" in str(e.value)


@resident("variant")
def test_llama_embeddings_shape(server):
    rows = ok(server.post("/embeddings", {"model": VARIANT, "content": "hello world"}))
    assert rows[0]["index"] == 0 and len(rows[0]["embedding"]) == 1 and len(rows[0]["embedding"][0]) == 576
    raw = ok(server.post("/embeddings", {"model": VARIANT, "content": "hello world", "embd_normalize": -1}))
    assert abs(sum(x * x for x in raw[0]["embedding"][0]) - 1) > 1e-3


@resident("variant")
def test_rerank_is_refused_without_a_reranking_model(server):
    for model in (DEMO, VARIANT):
        err = error_of(server.post("/rerank", {"model": model, "query": "a", "documents": ["b"]}), 501)
        assert "not a reranking model" in err["message"]
    tei = error_of(server.post("/v1/rerank", {"query": "a", "texts": ["b"]}), 501)      # TEI's field name
    assert "not a reranking model" in tei["message"]
    assert error_of(server.post("/rerank", {"query": "a"}), 400)["message"].startswith("body: expected documents")


# -- the chat prompt, /v1/responses, /v1/messages -------------------------------------------------------------
CHAT_Q = [{"role": "user", "content": "Name a colour."}]


def test_apply_template_is_the_chat_prompt(server):
    # CHAT_Q: its chat answer leaves the prompt in the KV cache for the Responses and
    # Messages tests after this one (they keep it; tests of one group run in file order)
    messages = CHAT_Q
    prompt = ok(server.post("/apply-template", {"messages": messages}))["prompt"]
    assert prompt.endswith("<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n")
    n = len(ok(server.post("/tokenize", {"content": prompt}))["tokens"])
    chat = ok(server.post("/chat/completions", {"messages": messages, "max_tokens": 1}))
    assert chat["usage"]["prompt_tokens"] == n
    bare = ok(server.post("/apply-template", {"messages": messages, "add_generation_prompt": False}))["prompt"]
    assert bare == prompt[:-len("<|im_start|>assistant\n")]


# The chat, Responses and Messages answers to CHAT_Q below keep the KV cache of the answer
# before (GenieX-KeepCache; the clients send it as a default header): the prompt renders
# the same on each route, so it is prefilled once, not once per answer (a continued
# prefix gives the tokens a fresh prefill does; what is checked is each route's shape).
def _chat_text(server, n):
    return ok(server.post("/chat/completions", {"messages": CHAT_Q, "max_tokens": n},
                          headers=KEEP))["choices"][0]["message"]["content"]


def test_responses_through_the_openai_client(server):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", default_headers=KEEP)
    want = _chat_text(server, 8)
    resp = client.responses.create(model=DEMO, input=CHAT_Q, max_output_tokens=8)
    assert resp.output_text == want and resp.status == "incomplete" and resp.id.startswith("resp_")
    assert resp.usage.output_tokens == 8
    events = list(client.responses.create(model=DEMO, input="Name a colour.", max_output_tokens=8, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
    bare = ok(server.post("/responses", {"input": CHAT_Q, "max_output_tokens": 8}, headers=KEEP))   # without /v1 too
    assert bare["output"][0]["content"][0]["text"] == want


def test_messages_through_the_anthropic_client(server):
    import anthropic
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", default_headers=KEEP)
    want = _chat_text(server, 8)
    msg = client.messages.create(model="claude-sonnet-4", max_tokens=8, messages=CHAT_Q)
    assert msg.content[0].text == want and msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 8
    assert msg.id.startswith("msg_")
    with client.messages.stream(model=DEMO, max_tokens=8, messages=CHAT_Q) as stream:
        assert "".join(stream.text_stream) == want
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    count = client.messages.count_tokens(model=DEMO, messages=CHAT_Q)
    assert count.input_tokens == ok(server.post("/chat/completions", {"messages": CHAT_Q, "max_tokens": 1},
                                                headers=KEEP))["usage"]["prompt_tokens"]


def test_trailing_assistant_messages(server):
    two = CHAT_Q + [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert "2 or more assistant" in error_of(server.post("/chat/completions", {"messages": two}), 400)["message"]
    both = {"messages": CHAT_Q + [{"role": "assistant", "content": "Blue"}], "continue_final_message": True,
            "add_generation_prompt": True}
    assert error_of(server.post("/chat/completions", both), 400)["param"] == "continue_final_message"
    # One trailing assistant message is continued (prefill): the answer goes on from it
    # (its prompt continues CHAT_Q's, kept in the KV cache from the Messages test before).
    prefill = ok(server.post("/chat/completions", {"messages": CHAT_Q + [{"role": "assistant", "content": "My"}],
                                                   "max_tokens": 4}, headers=KEEP))
    prompt = ok(server.post("/apply-template", {"messages": CHAT_Q + [{"role": "assistant", "content": "My"}]}))
    assert prompt["prompt"].endswith("<|im_start|>assistant\nMy")
    assert prefill["usage"]["completion_tokens"] == 4


# -- the default model ---------------------------------------------------------------------------------
@resident("variant")
def test_default_model_answers_without_a_name_or_with_a_hard_coded_one(server):
    none = ok(server.post("/v1/chat/completions", {"messages": CHAT_Q, "max_tokens": 3}))
    # the same model and prompt: the prompt stays in the KV cache
    assert none["model"] == DEMO and "warnings" not in none
    named = ok(server.post("/v1/chat/completions", {"model": "gpt-4o", "messages": CHAT_Q, "max_tokens": 3},
                           headers=KEEP))
    assert named["model"] == DEMO and "gpt-4o" in named["warnings"][0]
    assert named["choices"][0]["message"]["content"] == none["choices"][0]["message"]["content"]
    stored = ok(server.post("/v1/chat/completions", {"model": VARIANT, "messages": CHAT_Q, "max_tokens": 3}))
    assert stored["model"] == VARIANT and "warnings" not in stored
    models = ok(server.get("/models"))["data"]
    assert models[0]["id"] == DEMO and models[0]["default"] is True


# -- llama.cpp's fields -----------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("post_sampling_probs", True), ("n_probs", 101), ("mirostat", 3), ("xtc_probability", 1.5),
    ("mirostat_tau", -1), ("dry_sequence_breakers", ["\n", "###"]), ("dry_allowed_length", -1),
    ("top_n_sigma", "1"), ("dynatemp_exponent", -1), ("grammar", "root ::= nothing"),
    ("json_schema", {"type": "objectx"}),
    ("t_max_predict_ms", 100), ("n_predict", 0), ("id_slot", 3), ("samplers", ["top_p", "top_k"]),
    ("samplers", ["mystery"]), ("n_cmpl", 2), ("grammar_lazy", True),
    ("grammar_triggers", [{"type": 0, "value": "<tool_call>"}]),
])
def test_fields_we_cannot_honour_are_a_400_naming_them(server, field, value):
    for route, body in (("/completion", {"prompt": "hi"}), ("/chat/completions", {"messages": CHAT_Q})):
        err = error_of(server.post(route, {**body, "n_predict": 2, field: value}), 400)
        assert err["param"] == field and err["message"].startswith(f"{field}: "), err


def test_neutral_values_of_those_fields_are_accepted(server):
    neutral = {"typical_p": 1.0, "mirostat": 0, "xtc_probability": 0.0, "dry_multiplier": 0.0, "n_probs": 0,
               "top_n_sigma": -1.0, "id_slot": -1, "samplers": ["penalties", "dry", "top_k", "typ_p", "top_p",
                                                                 "min_p", "xtc", "temperature"]}
    plain = ok(server.post("/completion", {"prompt": "Once upon a time", "n_predict": 6}))
    same = ok(server.post("/completion", {"prompt": "Once upon a time", "n_predict": 6, **neutral}))
    assert same["content"] == plain["content"]


def test_samplers_left_out_are_switched_off(server):
    base = {"prompt": "Once upon a time", "n_predict": 12, "temperature": 1.0, "seed": 7}
    no_top_k = ok(server.post("/completion", {**base, "top_k": 0}))
    listed = ok(server.post("/completion", {**base, "top_k": 1, "samplers": ["top_p", "min_p", "temperature"]}))
    assert listed["content"] == no_top_k["content"]
    greedy = ok(server.post("/completion", {"prompt": "Once upon a time", "n_predict": 12}))
    top1 = ok(server.post("/completion", {**base, "top_k": 1}))
    assert top1["content"] == greedy["content"]                  # top_k 1 = greedy, so it did run before


def test_logit_bias_and_ignore_eos(server):
    first = ok(server.post("/completion", {"prompt": "The capital of France is", "n_predict": 1,
                                           "return_tokens": True}))["tokens"][0]
    for bias in ({str(first): -100}, [[first, False]]):
        banned = ok(server.post("/completion", {"prompt": "The capital of France is", "n_predict": 1,
                                                "return_tokens": True, "logit_bias": bias}))
        assert banned["tokens"][0] != first
    text_ban = ok(server.post("/completion", {"prompt": "The capital of France is", "n_predict": 1,
                                              "return_tokens": True, "logit_bias": [[" Paris", False]]}))
    assert text_ban["tokens"][0] != first
    short = {"messages": [{"role": "user", "content": "Is the sky blue? Answer yes or no."}], "max_tokens": 40}
    ends = ok(server.post("/chat/completions", short))
    assert ends["timings"]["stop_reason"] == "eos"
    n = ends["usage"]["completion_tokens"] + 5
    forced = ok(server.post("/chat/completions", {**short, "max_tokens": n, "ignore_eos": True}, headers=KEEP))
    assert forced["usage"]["completion_tokens"] == n and forced["timings"]["stop_reason"] == "length"
    # /completion reports the biases it sampled with: the end tokens at -inf (null in JSON)
    native = ok(server.post("/completion", {"prompt": "hi", "n_predict": 1, "ignore_eos": True}))
    assert native["generation_settings"]["logit_bias"] and \
        all(e["bias"] is None for e in native["generation_settings"]["logit_bias"])
    assert ok(server.post("/completion", {"prompt": "hi", "n_predict": 1}))["generation_settings"]["logit_bias"] == []


def test_repeat_penalty_is_repetition_penalty_and_cache_prompt_reuses(server):
    base = {"prompt": "one two one two one two", "n_predict": 8, "repeat_last_n": 64}
    a = ok(server.post("/completion", {**base, "repeat_penalty": 1.5}))
    b = ok(server.post("/completion", {**base, "repetition_penalty": 1.5}))
    c = ok(server.post("/completion", base))
    assert a["content"] == b["content"] != c["content"]
    again = ok(server.post("/completion", {**base, "cache_prompt": True}))
    assert again["timings"]["cache_n"] > 0


def test_context_overflow_is_llamacpps_error_with_counts(server):
    err = error_of(server.post("/completion", {"prompt": "word " * 1500, "n_predict": 2}), 400)
    assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 1024 and err["n_prompt_tokens"] > 1024


# -- chat validation and stream shapes -----------------------------------------------------------------------
def test_stream_first_delta_timings_per_token_and_progress(server):
    events = server.stream("/chat/completions", {"messages": CHAT_Q, "max_tokens": 4, "timings_per_token": True,
                                                  "return_progress": True})
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert progress[0]["processed"] == progress[0]["cache"] and progress[-1]["processed"] == progress[-1]["total"]
    texts = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert all(e["timings"]["predicted_n"] == i + 1 for i, e in enumerate(texts))


# -- security: key, hosts, origins -----------------------------------------------------------------------------
def test_api_key_by_bearer_or_x_api_key_and_without_a_default_model_a_name_is_needed(tmp_path):
    # One server (one model load) for two settings: an API key, and no --model.
    key = {"Authorization": "Bearer sk-test"}
    with AppServer(tmp_path, api_key="sk-test") as s:
        # Without a default model, a request must name one until a model is resident.
        err = error_of(s.post("/v1/chat/completions", {"messages": CHAT_Q}, headers=key), 400)
        assert err["param"] == "model" and "--model" in err["message"]
        assert error_of(s.post("/v1/chat/completions", {"model": "gpt-4o", "messages": CHAT_Q}, headers=key), 404)
        ok(s.post("/v1/chat/completions", {"model": DEMO, "messages": CHAT_Q, "max_tokens": 1}, headers=key))
        assert ok(s.post("/tokenize", {"content": "hi"}, headers=key))["tokens"]     # the resident model now
        # The key: by Bearer or X-Api-Key; without it (or a wrong one) an authentication_error.
        err = error_of(s.post("/completions", {"prompt": "hi", "n_predict": 1}), 401)
        assert err["type"] == "authentication_error"
        wrong = s.post("/completions", {"prompt": "hi", "n_predict": 1}, headers={"X-Api-Key": "nope"})
        assert error_of(wrong, 401)["type"] == "authentication_error"
        for header in (key, {"X-Api-Key": "sk-test"}):
            assert ok(s.post("/completions", {"prompt": "hi", "n_predict": 1}, headers=header))["content"] is not None
        assert s.get("/health").status_code == 200 and s.get("/metrics").status_code == 401


@pytest.mark.fast
def test_origins_accept_llamacpps_forms():
    from flask import Flask

    from geniex.server.app import ServerConfig
    from geniex.server.guard import Guard
    guard = Guard(ServerConfig(origins="localhost,web.example.fr,http://app.test:3000"))
    with Flask(__name__).test_request_context(headers={"Host": "127.0.0.1:1"}):
        for origin in ("http://localhost", "http://localhost:8080", "http://127.0.0.1:3000", "http://[::1]:3000",
                       "https://web.example.fr", "web.example.fr", "http://app.test:3000"):
            assert guard.origin_allowed(origin), origin
        for origin in ("http://evil.com", "http://notlocalhost", "http://localhost.evil.com", "http://app.test:3001"):
            assert not guard.origin_allowed(origin), origin


@pytest.mark.fast
def test_host_takes_several_addresses():
    from geniex.server.serving import parse_hosts
    assert parse_hosts("127.0.0.1,::1", 8080) == [("127.0.0.1", 8080), ("::1", 8080)]
    assert parse_hosts("127.0.0.1:9000,[::1]:9000") == [("127.0.0.1", 9000), ("::1", 9000)]
    assert parse_hosts("127.0.0.1,[::1]:9001") == [("127.0.0.1", 9001), ("::1", 9001)]


def test_serve_listens_on_every_address(data_dir):
    import socket
    # The IPv6 loopback where the machine has one (CI containers may not), else a second
    # IPv4 loopback address (Linux answers on all of 127.0.0.0/8).
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        second, shown = "::1", "[::1]"
    except OSError:
        second = shown = "127.0.0.2"
    from serverproc import Server
    with Server(data_dir, "--host", f"127.0.0.1,{second}", "--port", "0", "--model", "demo") as s:
        urls = re.findall(r"http://(?:\[[^\]]+\]|[^ :]+):\d+", s.first_line.split("(docs")[0])
        assert len(urls) == 2 and shown in urls[1], s.first_line
        for url in urls:
            assert requests.get(url + "/health", timeout=30).status_code == 200
    # SIGTERM stops both listeners cleanly (it crashed the shutdown thread, and the
    # server hung until killed, when the addresses were served by one loop's map).
    assert s.returncode == 0 and "Traceback" not in s.stderr, s.stderr


@pytest.mark.fast
def test_typical_keeps_the_tokens_nearest_the_entropy():
    import numpy as np

    from geniex.engine.sampling import typical
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    # entropy 1.14 nats; surprises 0.69, 1.20, 1.90, 3.00: the 0.3 token is nearest, then 0.5
    kept, ids = typical(logits, None, 0.2)
    assert list(ids) == [1]
    kept, ids = typical(logits, None, 0.6)
    assert list(ids) == [1, 0]
    kept, ids = typical(logits[[3, 0]], np.array([3, 0]), 0.99)
    assert sorted(ids) == [0, 3] and len(kept) == 2


@resident("demo ngram-mod")
def test_typical_p_samples_the_same_with_speculation(server):
    # one prompt, three answers: prefilled once (``cache_prompt``), after the metrics test's answer to it
    base = {"prompt": REPEAT + "\n" + REPEAT[16:], "n_predict": ANSWER, "temperature": 0.8, "seed": 11,
            "typical_p": 0.5, "return_tokens": True, "cache_prompt": True}
    plain = ok(server.post("/completion", base))
    spec = ok(server.post("/completion", {**base, **SPEC}))
    assert spec["tokens"] == plain["tokens"] and spec["timings"]["draft_n"] > 0
    other = ok(server.post("/completion", {**base, "typical_p": 1.0}))
    assert other["generation_settings"]["typical_p"] == 1.0 and plain["generation_settings"]["typical_p"] == 0.5


@pytest.mark.fast
def test_xtc_drops_the_top_choices_but_the_least_likely_of_them():
    import numpy as np

    from geniex.engine.sampling import xtc
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    always = np.random.Generator(np.random.PCG64(1))
    kept, ids = xtc(logits, None, 1.0, 0.1, always)
    assert sorted(ids) == [2, 3]                         # 0.5 and 0.3 go; 0.15 is the last above 0.1
    kept, ids = xtc(logits, None, 1.0, 0.6, always)      # none above: nothing changes
    assert ids is None and len(kept) == 4
    kept, ids = xtc(logits[[1, 3]], np.array([1, 3]), 1.0, 0.1, always)
    assert sorted(ids) == [3]
    rng = np.random.Generator(np.random.PCG64(2))
    draws = [xtc(logits, None, 0.5, 0.1, rng)[1] is None for _ in range(400)]
    assert 120 < sum(draws) < 280                        # it applies about half the time


@pytest.mark.fast
def test_dry_penalises_the_token_that_would_continue_a_repeat():
    import numpy as np

    from geniex.engine.dry import Dry
    row = lambda d, n: d.apply(np.zeros(n, dtype=np.float32))
    assert list(row(Dry(1.0, 2.0, 2, 100, frozenset(), [1, 2, 3, 1, 2]), 5)) == [0, 0, 0, -1, 0]   # "1 2" -> 3
    assert list(row(Dry(1.0, 2.0, 2, 100, frozenset(), [1, 2, 3, 4, 1, 2, 3]), 6)) == [0, 0, 0, 0, -2, 0]
    # a breaker one token back bounds every repeat below the allowed length: nothing is penalised
    assert not row(Dry(1.0, 2.0, 2, 100, frozenset([2]), [1, 2, 3, 4, 1, 2, 3]), 6).any()
    # the window: the earlier occurrence lies outside the last 4 tokens
    assert not row(Dry(1.0, 2.0, 2, 4, frozenset(), [1, 2, 3, 9, 1, 2]), 10).any()
    # a breaker token is never penalised itself
    assert not row(Dry(1.0, 2.0, 2, 100, frozenset([3]), [1, 2, 3, 1, 2]), 5).any()
    d = Dry(1.0, 2.0, 2, 100, frozenset(), [1, 2, 3, 1])
    assert not row(d, 5).any()
    d.accept(2)                                          # history moves with accepted tokens
    assert row(d, 5)[3] == -1


@pytest.mark.fast
def test_mirostat_truncates_by_surprise_and_steers_mu():
    import numpy as np

    from geniex.engine.sampling import Sampler, SamplingParams
    logits = np.log(np.array([0.6, 0.2, 0.1, 0.05, 0.05], dtype=np.float32))
    for version in (1, 2):
        s = Sampler(SamplingParams(temperature=1.0, seed=5, mirostat=version, mirostat_tau=0.1, mirostat_eta=0.1), 5)
        s.mu = 0.5                                       # only the top token's surprise (0.74 bits) is near it
        assert s.sample(logits) == 0 and s.mu == pytest.approx(0.5 - 0.1 * (0.0 - 0.1))
        wide = Sampler(SamplingParams(temperature=1.0, seed=5, mirostat=version, mirostat_tau=8.0), 5)
        picks = {wide.sample(logits) for _ in range(200)}
        assert len(picks) >= 3                           # a large mu keeps the tail
    greedy = Sampler(SamplingParams(mirostat=2), 5)
    assert greedy.sample(logits) == 0


SAMPLERS = {
    "mirostat1": {"mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.2},
    "mirostat2": {"mirostat": 2, "mirostat_tau": 3.0},
    "xtc": {"xtc_probability": 0.5, "xtc_threshold": 0.1, "top_k": 20},
    "xtc-greedy": {"xtc_probability": 1.0, "xtc_threshold": 0.05, "temperature": 0.0},
    "dry": {"dry_multiplier": 0.8},
    "dry-greedy": {"dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 1, "temperature": 0.0},
    "top-n-sigma": {"top_n_sigma": 0.5, "temperature": 1.5},
    "dynatemp": {"dynatemp_range": 0.6, "dynatemp_exponent": 0.5},
}


def _drafted_by_method(server):
    """{method: (draft tokens, accepted tokens)} so far, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    samples = [s for f in text_string_to_metric_families(server.get("/metrics").text) for s in f.samples
               if s.labels.get("method") and "le" not in s.labels]
    count = lambda name, method: next((s.value for s in samples if s.name == name and s.labels["method"] == method), 0)
    return {m: (count("geniex:spec_decode_num_draft_tokens_total", m),
                count("geniex:spec_decode_num_accepted_tokens_total", m)) for m in ("ngram-mod", "draft-simple")}


@resident("demo ngram-mod,draft-simple")
def test_every_sampler_samples_the_same_with_speculation(server):
    """Every sampler's plain answer first, then every one speculatively on the setup the
    histogram test loads (no load of its own; a plain /completion takes any resident
    setup): both kinds of drafter in one chain, so each answer verifies drafts of either
    kind, and over the samplers both kinds draft and get tokens accepted (the verify step
    that samples is the same whoever drafted). The prompt stays in the KV cache between
    the answers (``cache_prompt``): decoded once per load, not once per answer."""
    bases = {name: {"prompt": REPEAT + "\n" + REPEAT[16:], "n_predict": ANSWER, "temperature": 0.8, "seed": 11,
                    "return_tokens": True, "cache_prompt": True, **fields} for name, fields in SAMPLERS.items()}
    plain = {name: ok(server.post("/completion", body)) for name, body in bases.items()}
    for name, fields in SAMPLERS.items():
        for field, value in fields.items():
            assert plain[name]["generation_settings"][field] == value, name
        for switch in ("xtc_probability", "dry_multiplier", "top_n_sigma", "dynatemp_range"):
            if switch in fields:                         # it did run: without it the answer differs
                off = ok(server.post("/completion", {**bases[name], switch: 0.0}))
                assert off["tokens"] != plain[name]["tokens"], name
    before = _drafted_by_method(server)
    for name, body in bases.items():
        same = ok(server.post("/completion", {**body, **CHAIN}))
        assert same["tokens"] == plain[name]["tokens"], name
        assert same["timings"]["draft_n"] > 0 and same["timings"]["draft_n_accepted"] > 0, name
    after = _drafted_by_method(server)
    for method in after:
        drafted, accepted = (a - b for a, b in zip(after[method], before[method]))
        assert drafted > 0 and accepted > 0, (method, before, after)


def test_serve_refuses_a_default_model_it_cannot_find(cli):
    proc = cli("serve", "--host", "127.0.0.1:0", "--model", "nobody/nothing:Q4_0")
    assert proc.returncode != 0 and "nobody/nothing" in proc.stderr and "geniex pull" in proc.stderr
