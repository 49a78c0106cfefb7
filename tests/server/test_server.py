"""``geniex serve`` over HTTP: chat and completions (streamed and not), usage, errors,
schema checks, models, CORS. One real server (create_app served on a free loopback
port in this process) for the whole module, with a store holding the demo model, a
copy registered as multimodal, and a QAIRT bundle."""
import io

import pytest
import requests

from fakehub import FakeHub
from geniex.store import Store
from geniex.store.hub import Hub
from serverproc import DEMO, AppServer, calibrate_as, chat_body, check_shape, ok, seed_calibration

VLM = "test/vision-demo:Q4_1"
QAIRT = "qualcomm/Bundle:DEFAULT"


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_model, calibration_cache):
    data = tmp_path_factory.mktemp("serve-data")
    with FakeHub() as hub:
        hub.add_repo("qualcomm/Bundle", {"genie_config.json": b"{}", "model.bin": b"\0" * 5000})
        store = Store(data, hub=Hub(endpoint=hub.url, token=""))
        store.pull("qualcomm/Bundle", out=io.StringIO())
        vlm = store.pull(VLM, local_path=demo_model, model_type="vlm", out=io.StringIO(), interactive=False)
    # VLM is the demo model under another path: its load reads the demo's curves, not measures them.
    seed_calibration(data)
    calibrate_as(data / "calibration.json", vlm.path, demo_model)
    # Paths and any origin are opt-in (tests/server/test_hardening_server.py checks the defaults).
    with AppServer(data, nctx=1024, allow_paths=True, origins="*") as s:
        yield s


# -- models, health ---------------------------------------------------------------------


def test_models_lists_one_id_per_precision_owned_by_org(server):
    r = server.get("/v1/models")
    assert r.status_code == 200
    check_shape(r.json(), "ModelList")
    by_id = {m["id"]: m for m in r.json()["data"]}
    assert by_id[DEMO]["owned_by"] == "demo" and by_id[DEMO]["runtime"] == "llama_cpp"
    assert by_id[VLM]["owned_by"] == "test" and by_id[VLM]["type"] == "vlm"
    assert by_id[QAIRT]["runtime"] == "qairt"


def test_get_model_by_any_name_the_store_resolves(server):
    for name in (DEMO, "demo/SmolLM2-135M-Instruct", "demo/smollm2-135m-instruct:q4_1"):
        r = server.get(f"/v1/models/{name}")
        assert r.status_code == 200, r.text
        check_shape(r.json(), "Model")
        assert r.json()["id"] == DEMO
    r = server.get("/v1/models/nobody/nothing:Q4_0")
    assert r.status_code == 404
    check_shape(r.json(), "Error")
    assert "geniex pull nobody/nothing:Q4_0" in r.json()["error"]["message"]


def test_get_model_by_absolute_path(server, demo_model):
    r = server.get(f"/v1/models/{demo_model}")
    assert r.status_code == 200 and r.json()["id"] == str(demo_model)


def test_health(server):
    r = server.get("/health")
    assert r.status_code == 200
    check_shape(r.json(), "Health")


# -- chat ---------------------------------------------------------------------------------


def test_chat_non_streamed(server):
    r = server.chat(chat_body("What is the capital of France?", max_tokens=6))
    assert r.status_code == 200, r.text
    body = r.json()
    check_shape(body, "ChatCompletion")
    choice = body["choices"][0]
    assert body["model"] == DEMO and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 6 and usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6
    assert "completion_tokens_details" not in usage      # no drafts were made
    assert usage["timings"]["predicted_n"] == 6 and usage["timings"]["draft_n"] == 0
    assert usage["timings"]["predicted_per_second"] > 0


def test_chat_streamed_matches_non_streamed(server):
    body = chat_body("Name three colors.", max_tokens=12)
    reply = server.chat(body).json()
    whole = reply["choices"][0]["message"]["content"]
    events = server.stream("/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    for e in events:
        check_shape(e, "ChatCompletionChunk")
        assert e["object"] == "chat.completion.chunk"
    assert len({e["id"] for e in events}) == 1
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == whole                                     # greedy: same answer either way
    finish, usage = events[-2], events[-1]
    n = reply["usage"]["completion_tokens"]
    assert finish["choices"][0]["finish_reason"] == reply["choices"][0]["finish_reason"]
    assert finish["timings"]["predicted_n"] == n
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == n
    assert all(e["usage"] is None for e in events[:-1])


def test_chat_streamed_without_usage_has_no_usage_chunk(server):
    events = server.stream("/v1/chat/completions", chat_body(max_tokens=3))
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e for e in events)


def test_stop_sequence_ends_the_answer_and_is_not_returned(server):
    base = chat_body("Tell me about the Moon.", max_tokens=30)
    full = server.chat(base).json()["choices"][0]["message"]["content"]
    stop = " " + full.split()[4]                # a word well inside the answer
    r = server.chat({**base, "stop": ["never-seen", stop]}).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == full[:full.index(stop)]
    assert r["usage"]["timings"]["stop_reason"] == "stop_sequence"


def test_eos_gives_finish_reason_stop(server):
    r = server.chat(chat_body("Hi", max_tokens=200)).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["timings"]["stop_reason"] == "eos"


def test_seeded_sampling_is_reproducible_and_the_seed_decides_the_sample(server):
    def answer(**fields):
        body = chat_body("Write a word.", max_tokens=8, **fields)
        return ok(server.chat(body))["choices"][0]["message"]["content"]

    hot = {"temperature": 1.5, "top_k": 40}
    first = answer(seed=7, **hot)
    assert answer(seed=7, **hot) == first                       # the same seed, the same sample
    # At temperature 1.5 over 8 tokens another seed draws another answer (near certain;
    # fixed for a given model and build), and a sample is not the greedy answer.
    others = {answer(seed=seed, **hot) for seed in (8, 9)}
    assert others - {first}, (first, others)
    assert first != answer()


def test_developer_role_and_content_parts(server):
    plain = server.chat({"model": DEMO, "max_tokens": 5, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}).json()
    parts = server.chat({"model": DEMO, "max_tokens": 5, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}).json()
    assert parts["choices"][0]["message"] == plain["choices"][0]["message"]
    assert "warnings" not in parts


@pytest.mark.resident("vlm")
def test_image_parts_are_dropped_with_a_warning(server):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, image]}]
    # The demo model first: the one the unmarked tests leave loaded (a change reloads it;
    # tests/server/conftest.py runs the tests that need another model or setting last).
    r = server.chat({"model": DEMO, "messages": messages, "max_tokens": 3}).json()
    assert "text-only model: dropped 1" in r["warnings"][0]
    # A fixed draft policy: a check of the warning alone (VLM is a hard link of the demo
    # model, another path: the server fixture gave it the demo's curves).
    r = server.chat({"model": VLM, "messages": messages, "max_tokens": 3, "spec_type": "ngram-mod",
                     "spec_draft_policy": "fixed"}).json()
    assert r["warnings"] == ["speculative decoding is text-only: dropped 1 image/audio content part(s)"]
    events = server.stream("/v1/chat/completions", {"model": VLM, "messages": messages, "max_tokens": 3})
    assert "no multimodal projector" in events[0]["warnings"][0]


@pytest.mark.resident("nctx 512")
def test_warm_up_loads_and_answers_null(server):
    r = server.chat({"model": DEMO, "messages": [], "nctx": 512})
    assert r.status_code == 200 and r.json() is None
    assert server.health()["model"] == DEMO


# -- completions --------------------------------------------------------------------------


def test_completions_raw_prompt_defaults_to_16_tokens(server):
    r = server.post("/v1/completions", {"model": DEMO, "prompt": "The capital of France is"})
    assert r.status_code == 200, r.text
    body = r.json()
    check_shape(body, "Completion")
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"].startswith(" Paris")
    assert body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == 5              # the raw text only: no chat template


def test_completions_streamed(server):
    body = {"model": DEMO, "prompt": ["The capital of France is"], "max_tokens": 5}
    whole = server.post("/v1/completions", body).json()["choices"][0]["text"]
    events = server.stream("/v1/completions", {**body, "stream_options": {"include_usage": True}})
    for e in events:
        check_shape(e, "Completion")
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == whole
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 5


@pytest.mark.resident("nctx 256")
def test_running_out_of_context_mid_answer_is_length(server):
    prompt = ", ".join(str(i) for i in range(1, 60)) + ","      # 226 tokens
    r = server.post("/v1/completions", {"model": DEMO, "prompt": prompt, "max_tokens": 1000, "nctx": 256}).json()
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["timings"]["stop_reason"] == "context_length"
    assert r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - 1 == 256


# -- errors --------------------------------------------------------------------------------


def error_of(r, status):
    assert r.status_code == status, r.text
    check_shape(r.json(), "Error")
    return r.json()["error"]


def test_unknown_model_is_404_and_says_to_pull(server):
    err = error_of(server.chat(chat_body(model="someone/Missing-GGUF:Q4_0")), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "geniex pull someone/Missing-GGUF:Q4_0" in err["message"] and "never downloads" in err["message"]
    err = error_of(server.post("/v1/completions", {"model": "someone/Missing-GGUF", "prompt": "x"}), 404)
    assert "geniex pull" in err["message"]


def test_draft_model_not_in_store(server):
    r = server.chat(chat_body(spec_type="draft-mtp", spec_draft_model="RachidAR/assistant-gguf:Q4_0"))
    err = error_of(r, 404)
    assert err["param"] == "spec_draft_model"
    assert err["message"].startswith("resolve draft model RachidAR/assistant-gguf:Q4_0: not found; "
                                     "run `geniex pull RachidAR/assistant-gguf:Q4_0`")
    err = error_of(server.chat(chat_body(spec_type="draft-simple", spec_draft_model="/nowhere/d.gguf")), 404)
    assert err["message"].startswith("resolve draft model /nowhere/d.gguf: ")


def test_qairt_model_is_refused(server):
    err = error_of(server.chat(chat_body(model=QAIRT)), 400)
    assert err["code"] == "unsupported_model" and "qairt" in err["message"]


@pytest.mark.resident("nctx 256")
def test_prompt_longer_than_the_context(server):
    long = "word " * 600
    err = error_of(server.chat(chat_body(long, nctx=256)), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "the context holds 256" in err["message"] and "--nctx" not in err["message"]
    err = error_of(server.post("/v1/completions", {"model": DEMO, "prompt": long, "nctx": 256}), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    # The server is fine afterwards.
    assert server.chat(chat_body(max_tokens=2)).status_code == 200


@pytest.mark.parametrize("body, param, expect", [
    ({"model": 3, "messages": []}, "model", "expected string or null"),
    ({"model": DEMO}, "messages", "required"),
    ({"model": DEMO, "messages": "hi"}, "messages", "expected array"),
    ({"model": DEMO, "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "expected one of"),
    ({"model": DEMO, "messages": [{"content": "x"}]}, "messages[0].role", "required"),
    ({"model": DEMO, "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "content parts"),
    ({"model": DEMO, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text", "required"),
    ({"model": DEMO, "messages": [], "temperature": "hot"}, "temperature", "expected number or null, got string"),
    ({"model": DEMO, "messages": [], "top_p": 1.5}, "top_p", "maximum"),
    ({"model": DEMO, "messages": [], "max_completion_tokens": 0}, "max_completion_tokens", "minimum"),
    ({"model": DEMO, "messages": [], "nctx": 0}, "nctx", "minimum"),
    ({"model": DEMO, "messages": [], "ngl": "all"}, "ngl", "expected integer"),
    ({"model": DEMO, "messages": [], "stop": 5}, "stop", "non-empty string"),
    ({"model": DEMO, "messages": [], "stop": [""]}, "stop[0]", "non-empty"),
    ({"model": DEMO, "messages": [], "n": 2}, "n", "only n = 1"),
    ({"model": DEMO, "messages": [], "stream": "yes"}, "stream", "expected boolean"),
    ({"model": DEMO, "messages": [], "spec_n_max": 0}, "spec_n_max", "minimum"),
    ({"model": DEMO, "messages": [], "spec_p_min": 2}, "spec_p_min", "maximum"),
    ({"model": DEMO, "messages": [], "spec_draft_tokens": 3}, "spec_draft_tokens", "unknown speculative field"),
])
def test_chat_schema_rejections(server, body, param, expect):
    err = error_of(server.chat(body), 400)
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert err["message"].startswith(f"{param}: ") and expect in err["message"], err["message"]


@pytest.mark.parametrize("body, param, expect", [
    ({"model": DEMO}, "prompt", "required"),
    ({"model": DEMO, "prompt": 5}, "prompt", "a string, a list of token ids, or a list of one of them"),
    ({"model": DEMO, "prompt": ["a", "b"]}, "prompt", "a list of one of them"),
    ({"model": DEMO, "prompt": "x", "spec_typo": "ngram-mod"}, "spec_typo", "unknown speculative field"),
    ({"model": DEMO, "prompt": "x", "max_tokens": -1}, "max_tokens", "minimum"),
])
def test_completions_schema_rejections(server, body, param, expect):
    err = error_of(server.post("/v1/completions", body), 400)
    assert err["param"] == param and expect in err["message"], err["message"]


# What OpenAI's clients send for "not set" (several send every field they know).
UNSET = dict(user="me", logprobs=False, top_logprobs=None, logit_bias={}, n=1, response_format={"type": "text"},
             tools=[], tool_choice="none", parallel_tool_calls=False, store=False, metadata={}, service_tier="auto",
             frequency_penalty=None, presence_penalty=0, stream=False, stream_options=None, stop=None, seed=None,
             temperature=None, max_tokens=None)
MOON = chat_body("Tell me about the Moon.", max_tokens=8)


def test_fields_openai_clients_send_unset_change_nothing(server):
    bare = ok(server.chat(MOON))
    r = server.chat({**MOON, **UNSET})
    assert r.headers["Content-Type"].startswith("application/json")           # stream: false
    sent = ok(r)
    assert sent["choices"] == bare["choices"] and len(sent["choices"]) == 1        # n: 1, the same greedy answer
    choice = sent["choices"][0]
    assert choice["finish_reason"] == "length" and sent["usage"]["completion_tokens"] == 8
    assert choice["logprobs"] is None and "tool_calls" not in choice["message"]
    assert "warnings" not in sent


def test_fields_openai_clients_send_take_effect(server):
    bare = ok(server.chat(MOON))["choices"][0]["message"]["content"]
    body = {**UNSET, "model": DEMO, "messages": MOON["messages"], "max_tokens": 4, "logprobs": True, "top_logprobs": 2}
    r = ok(server.chat(body))
    choice = r["choices"][0]
    # max_tokens (no max_completion_tokens): four tokens, cut by the length; the greedy
    # answer's first four.
    assert r["usage"]["completion_tokens"] == 4 and choice["finish_reason"] == "length"
    assert bare.startswith(choice["message"]["content"])
    # logprobs and top_logprobs: one entry per token, the chosen (greedy) token first of two.
    entries = choice["logprobs"]["content"]
    assert len(entries) == 4 and "".join(e["token"] for e in entries) == choice["message"]["content"]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["id"] == e["id"] for e in entries)
    # logit_bias: the first token banned, the answer starts with the runner-up.
    first, runner_up = entries[0]["top_logprobs"]
    biased = ok(server.chat({**body, "logit_bias": {str(first["id"]): -100}}))["choices"][0]
    assert biased["logprobs"]["content"][0]["id"] == runner_up["id"]
    assert biased["message"]["content"].startswith(runner_up["token"])
    # stop: the answer ends before the stop string, with finish_reason "stop".
    stop = " " + bare.split()[3]
    stopped = ok(server.chat({**MOON, **UNSET, "stop": [stop]}))
    assert stopped["choices"][0]["message"]["content"] == bare[:bare.index(stop)]
    assert stopped["choices"][0]["finish_reason"] == "stop"


def test_not_json_and_wrong_routes(server):
    r = requests.post(server.url + "/v1/chat/completions", data="{nope", headers={"Content-Type": "application/json"})
    assert error_of(r, 400)["code"] == "invalid_json"
    err = error_of(server.post("/v1/chat/completions", [1, 2]), 400)
    assert "JSON object" in err["message"]
    error_of(server.get("/v1/nothing"), 404)
    assert error_of(server.get("/v1/chat/completions"), 405)["type"] == "invalid_request_error"


def test_cors(server):
    r = requests.options(server.url + "/v1/chat/completions", headers={
        "Origin": "http://example.test", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, genix-keepcache"})
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert "GenieX-KeepCache" in r.headers["Access-Control-Allow-Headers"]
    assert server.get("/v1/models").headers["Access-Control-Allow-Origin"] == "*"


@pytest.mark.resident("demo ngram-mod")
def test_the_openai_python_client(server):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    assert DEMO in [m.id for m in client.models.list()]
    # Plain requests first, on the model the other tests leave loaded; the speculative
    # one last (a settings change reloads the model).
    stream = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens <= 5
    text = client.completions.create(model=DEMO, prompt="The capital of France is", max_tokens=3)
    assert text.choices[0].text.startswith(" Paris")
    reply = client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "Hi"}],
                                           max_completion_tokens=5, extra_body={"spec_type": "ngram-mod"})
    assert reply.choices[0].message.content and reply.usage.completion_tokens <= 5
    with pytest.raises(openai.NotFoundError, match="geniex pull"):
        client.chat.completions.create(model="nobody/nothing", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=DEMO, messages=[{"role": "user", "content": "x"}], temperature=-1)
