"""One conversation core for the chat, Responses and Messages APIs
(geniex.server.conversation): the same conversation gives the same prompt tokens, text,
stop reason and usage on all three, ``count_tokens`` counts the prompt an answer reads;
a failure mid-stream ends every streamed API with its own error event; several API
keys keep their cached prompts apart; and ``--fixed-load`` refuses requests that would
reload the model for everyone, with reloads counted in /metrics."""
import json
import os
import signal

import pytest
import requests

from geniex.server.placement import Defaults
from serverproc import ANSWER_TIMEOUT, DEMO, AppServer, chat_body

KEYS = ("key-a", "key-b")
A = {"Authorization": f"Bearer {KEYS[0]}"}
B = {"X-Api-Key": KEYS[1]}
KEEP = {"GenieX-KeepCache": "true"}
SYSTEM = "You are a terse assistant."
QUESTION = "Name three colours of the rainbow."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("core-data"), nctx=2048, metrics=True, api_key=",".join(KEYS)) as s:
        yield s


def post(server, path, body, headers=A):
    r = requests.post(server.url + path, json=body, headers=headers, timeout=ANSWER_TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def three_apis(server, max_tokens, prefill=None, question=QUESTION):
    """The same conversation asked on the three APIs: (chat, responses, messages) answers."""
    turns = [{"role": "user", "content": question}] + ([{"role": "assistant", "content": prefill}] if prefill else [])
    chat = post(server, "/v1/chat/completions", {"model": DEMO, "messages": [{"role": "system", "content": SYSTEM}]
                                                 + turns, "max_completion_tokens": max_tokens})
    resp = post(server, "/v1/responses", {"model": DEMO, "instructions": SYSTEM, "input": turns,
                                          "max_output_tokens": max_tokens})
    msg = post(server, "/v1/messages", {"model": DEMO, "system": SYSTEM, "messages": turns, "max_tokens": max_tokens})
    counted = post(server, "/v1/messages/count_tokens", {"model": DEMO, "system": SYSTEM, "messages": turns})
    return chat, resp, msg, counted


@pytest.mark.parametrize("prefill", [None, "The three colours are"])
def test_one_conversation_gives_the_same_prompt_answer_stop_and_usage_on_all_three_apis(server, prefill):
    chat, resp, msg, counted = three_apis(server, 6, prefill)
    prompt = chat["usage"]["prompt_tokens"]
    # The same prompt tokens, counted the same way (Anthropic's input_tokens leave out
    # what the cache held); count_tokens sees the prompt an answer reads, continuation included.
    assert resp["usage"]["input_tokens"] == prompt
    assert msg["usage"]["input_tokens"] + msg["usage"]["cache_read_input_tokens"] == prompt
    assert counted["input_tokens"] == prompt
    # The same answer (greedy), cut at the same length, with each API's name for it.
    text = chat["choices"][0]["message"]["content"]
    assert resp["output"][0]["content"][0]["text"] == text
    assert msg["content"][0]["text"] == text
    assert chat["usage"]["completion_tokens"] == resp["usage"]["output_tokens"] == msg["usage"]["output_tokens"] == 6
    assert chat["choices"][0]["finish_reason"] == "length"
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert msg["stop_reason"] == "max_tokens"


def test_an_answer_that_ends_gives_each_apis_end_of_turn(server):
    # A question the demo model answers in one short sentence ("The capital of France is
    # Paris.", 7 tokens): the rainbow's answer ran 111 tokens before its end, three times.
    chat, resp, msg, _ = three_apis(server, 400, question="What is the capital of France?")
    assert chat["usage"]["completion_tokens"] < 400            # the model ended its answer itself
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert resp["status"] == "completed" and resp["incomplete_details"] is None
    assert msg["stop_reason"] == "end_turn"
    assert chat["usage"]["completion_tokens"] == resp["usage"]["output_tokens"] == msg["usage"]["output_tokens"]


def test_one_keys_cached_prompt_never_answers_another(server):
    body = chat_body("Write one sentence about the sea.", max_tokens=4)
    first = post(server, "/v1/chat/completions", body, {**A, **KEEP})["usage"]["prompt_tokens"]
    again = {**body, "messages": body["messages"] + [{"role": "assistant", "content": "Waves."},
                                                     {"role": "user", "content": "And the sky?"}]}
    # Key B asks for the kept cache right after key A's answer: it gets none of it.
    other = post(server, "/v1/chat/completions", again, {**B, **KEEP})
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # B's own next turn reuses B's prompt; then A's (after B's answer) reuses at most
    # its own first prompt (kept for it in host memory), none of B's longer one.
    assert post(server, "/v1/chat/completions", again, {**B, **KEEP})["usage"]["prompt_tokens_details"][
        "cached_tokens"] > first
    assert post(server, "/v1/chat/completions", again, {**A, **KEEP})["usage"]["prompt_tokens_details"][
        "cached_tokens"] <= first
    assert post(server, "/v1/chat/completions", again, {**A, **KEEP})["usage"]["prompt_tokens_details"][
        "cached_tokens"] > 0


# -- a failure mid-stream ---------------------------------------------------------------------
LONG = [{"role": "user", "content": "Tell me a very long story about a dragon."}]
STREAMS = {
    "/v1/chat/completions": {"messages": LONG, "max_completion_tokens": 1000},
    "/completion": {"prompt": "Once upon a time, a dragon", "n_predict": 1000},
    "/v1/responses": {"input": LONG, "max_output_tokens": 1000},
    "/v1/messages": {"messages": LONG, "max_tokens": 1000},
}


def events_after_a_kill(server, path, body):
    """The stream's events (name, data) after the model's worker was killed in its middle."""
    post(server, "/v1/chat/completions", chat_body(max_tokens=1))        # the model is resident
    pid = server.health()["worker_pid"]
    with requests.post(server.url + path, json={"model": DEMO, **body, "stream": True}, headers=A, stream=True,
                       timeout=ANSWER_TIMEOUT) as r:
        assert r.status_code == 200, r.text
        lines = r.iter_lines(decode_unicode=True)
        seen = 0
        for line in lines:
            seen += line.startswith("data:")
            if seen >= 4:
                break
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line]
    events, name = [], None
    for line in rest:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            events.append((name, line[5:].strip()))
            name = None
    return events


@pytest.mark.parametrize("path", list(STREAMS))
def test_a_worker_killed_mid_stream_ends_each_api_with_its_error_event(server, path):
    events = events_after_a_kill(server, path, STREAMS[path])
    if path == "/v1/chat/completions":
        assert events[-1] == (None, "[DONE]")
        error = json.loads(events[-2][1])["error"]
    elif path == "/completion":
        error = json.loads(events[-1][1])["error"]                  # llama.cpp's native stream has no [DONE]
    elif path == "/v1/responses":
        name, data = events[-1]
        error = json.loads(data)
        assert name == "error" and error["type"] == "error" and isinstance(error["sequence_number"], int)
        assert error["sequence_number"] == json.loads(events[-2][1])["sequence_number"] + 1
    else:
        name, data = events[-1]
        outer = json.loads(data)
        assert name == "error" and outer["type"] == "error" and outer["error"]["type"] == "api_error"
        error = outer["error"]
    assert DEMO in error["message"] and "SIGKILL" in error["message"]
    if path in ("/v1/chat/completions", "/completion", "/v1/responses"):
        assert error["code"] == "model_crashed"
    # The server answers the next request with a new worker.
    assert post(server, "/v1/chat/completions", chat_body(max_tokens=2))["usage"]["completion_tokens"] == 2


# -- fixed load settings ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("fixed-data"), metrics=True,
                   defaults=Defaults(nctx=1024, fixed_load=True)) as s:
        yield s


def reloads(server):
    text = requests.get(server.url + "/metrics", headers=A, timeout=60).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("geniex:model_reloads")))


@pytest.mark.parametrize("field, value", [("nctx", 2048), ("cache_type_k", "f16"), ("ngl", 0),
                                          ("spec_type", "draft-simple")])
def test_a_fixed_server_refuses_other_load_settings_naming_the_field(fixed, field, value):
    r = fixed.chat(chat_body(max_tokens=2, **{field: value}))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["code"] in ("load_settings_fixed", "invalid_value"), error
    assert "--fixed-load" in error["message"]


def test_a_fixed_server_answers_its_own_settings_and_never_reloads(fixed):
    assert fixed.chat(chat_body(max_tokens=2)).status_code == 200
    before = fixed.health()["loads"]
    # n-gram drafting and draft settings need no draft model: an answer's own, no reload.
    for extra in ({"nctx": 1024}, {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}, {"ngl": -1}, {},
                  {"spec_type": "ngram-mod", "spec_ngram_max": 4}, {"spec_type": "ngram-simple"}):
        assert fixed.chat(chat_body(max_tokens=2, **extra)).status_code == 200, extra
    assert requests.post(fixed.url + "/v1/completions", json={"model": DEMO, "prompt": "Hi", "max_tokens": 2},
                         timeout=ANSWER_TIMEOUT).status_code == 200
    assert fixed.health()["loads"] == before and reloads(fixed) == 0


def test_reloads_are_counted_in_metrics(server):
    post(server, "/v1/chat/completions", chat_body(max_tokens=1))
    before = reloads(server)
    post(server, "/v1/chat/completions", chat_body(max_tokens=1, nctx=1024))      # another load setting
    post(server, "/v1/chat/completions", chat_body(max_tokens=1))                 # and back
    assert reloads(server) == before + 2
