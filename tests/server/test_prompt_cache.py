"""Cached prompts (docs/server.md, "Cached prompts"): a request reuses its cached prefix
by default without changing its answer; a conversation that left the context is kept in
host memory (--cache-ram) and put back when its client returns; API keys keep both apart."""
import pytest
import requests

from geniex.server.placement import Defaults
from serverproc import ANSWER_TIMEOUT, DEMO, AppServer

KEYS = ("key-a", "key-b")
# Two agents' files, 130 and 121 tokens: every restore, refusal and cold prefill below is
# as telling at that length (a saved conversation needs 32 tokens, prompt_cache.MIN_TOKENS),
# and each prompt is decoded two to four times.
FILES = {"a": "def add(a, b):\n    return a + b\n" * 10, "b": "SELECT name FROM users WHERE id = 1;\n" * 11}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("pc-data"), nctx=2048, parallel=1, metrics=True, api_key=",".join(KEYS)) as s:
        yield s


def ask(server, messages, key=KEYS[0], **extra):
    body = {"model": DEMO, "messages": messages, "max_completion_tokens": 12, **extra}
    r = requests.post(server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=ANSWER_TIMEOUT)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["message"]["content"], out["usage"]["prompt_tokens_details"]["cached_tokens"], \
        out["usage"]["prompt_tokens"]


def agent(name):
    return [{"role": "system", "content": f"You review this file:\n{FILES[name]}"},
            {"role": "user", "content": "What does it do?"}]


def metric(server, name):
    text = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=60).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


def test_an_agent_returning_after_another_spoke_pays_only_for_its_new_tokens(server):
    a = agent("a")
    answer, _, first = ask(server, a)
    ask(server, agent("b"))                              # the other agent takes the context
    restored = metric(server, "geniex:prompt_cache_restored")
    a2 = a + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And its bugs?"}]
    text, cached, total = ask(server, a2)
    assert cached >= first - 1 and total - cached < 40, (cached, total)
    assert metric(server, "geniex:prompt_cache_restored") == restored + 1
    assert metric(server, "geniex:prompt_cache_entries") >= 1
    # The answer is the one a clean cache gives (the cache held other things before).
    cold, none, _ = ask(server, a2, cache_prompt=False)
    assert none == 0 and cold == text


def test_one_keys_kept_conversation_never_answers_another(server):
    b = agent("b")
    ask(server, b, key=KEYS[0])                          # key A's conversation about file b
    ask(server, agent("a"), key=KEYS[0])                 # ... moved to host memory
    _, cached, _ = ask(server, b, key=KEYS[1])           # key B asks the same: nothing of A's
    assert cached == 0
    _, cached, total = ask(server, b, key=KEYS[0])       # key A gets its own back
    assert cached >= total - 1


def test_a_server_without_a_prompt_cache_decodes_the_returning_prompt_again(tmp_path):
    with AppServer(tmp_path, defaults=Defaults(nctx=2048, cache_ram=0, parallel=1)) as s:
        a = agent("a")
        answer, _, first = ask(s, a)
        ask(s, agent("b"))
        _, cached, _ = ask(s, a + [{"role": "assistant", "content": answer}, {"role": "user", "content": "More?"}])
        assert cached < first / 2


def test_cache_prompt_must_be_a_boolean(server):
    r = requests.post(server.url + "/v1/chat/completions", json={"model": DEMO, "messages": agent("a"),
                                                                 "cache_prompt": "yes"},
                      headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=ANSWER_TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_prompt"


def test_load_settings_only_the_server_start_sets_are_a_400_naming_them(server):
    for field, value in (("prompt_kv", "none"), ("threads", 1)):
        r = requests.post(server.url + "/v1/chat/completions", json={"model": DEMO, "messages": agent("a"),
                                                                     "max_tokens": 1, field: value},
                          headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=ANSWER_TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    # The server's own way of reading prompts may be named.
    ask(server, agent("a"), prompt_kv="f16")
