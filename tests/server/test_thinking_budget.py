"""The reasoning budget through the real server: ``thinking_budget_tokens`` on chat
completions, ``--reasoning-budget`` (``Defaults``) as the default, and the Messages API's
extended thinking (``thinking.budget_tokens``, a ``thinking`` block).

The model is the demo model with a template whose generation prompt opens ``<think>``
(tests/support/tool_templates.py, ``think``), so every answer starts inside the block.
What a held answer must be is built from the plain one: its first N tokens are the
thoughts, then the closing run (the message and ``</think>``) is forced, and the rest is
what the model writes after those tokens (``/completion`` on the token ids).
"""
import pytest

from geniex.server.placement import Defaults
from serverproc import AppServer, check_shape, ok

# The SDKs are imported in the tests that use them: importing them takes seconds,
# paid at collection by every pytest-xdist worker otherwise.

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
MAX = 20
MESSAGE = " (enough)"          # the server's --reasoning-budget-message
DEFAULT_BUDGET = 7             # the server's --reasoning-budget


@pytest.fixture(scope="module")
def server(tmp_path_factory, tool_models):
    # The model by path: a store pull would hash its 98 MB for nothing. Prompts decode on
    # the answer's cache (--prompt-kv none): what a held answer must be is built as a
    # /completion of a prompt holding the answer's first tokens, the same cells only when
    # a prompt's cells are what the answer's decodes write (read in F16 they are rounded
    # otherwise; geniex.engine.prompt_reader).
    with AppServer(tmp_path_factory.mktemp("think-budget"), allow_paths=True,
                   defaults=Defaults(nctx=1024, reasoning_budget=DEFAULT_BUDGET, prompt_kv="none",
                                     reasoning_budget_message=MESSAGE)) as s:
        s.model = str(tool_models["think"])
        yield s


@pytest.fixture(scope="module")
def plain(server):
    """The unheld answer's prompt and tokens: (prompt token ids, answer token ids)."""
    prompt = ok(server.post("/apply-template", {"model": server.model, "messages": MESSAGES}))["prompt"]
    assert prompt.endswith("<think>\n")
    ids = ok(server.post("/tokenize", {"model": server.model, "content": prompt, "add_special": True}))["tokens"]
    answer = ok(server.post("/completion", {"model": server.model, "prompt": ids, "n_predict": MAX, "temperature": 0,
                                            "return_tokens": True}))
    assert len(answer["tokens"]) == MAX and "</think>" not in answer["content"]   # never closed by itself
    return ids, answer["tokens"]


def held(server, plain, budget, message=""):
    """(reasoning, content) the answer held to ``budget`` thought tokens must be."""
    ids, tokens = plain
    closing = ok(server.post("/tokenize", {"model": server.model, "content": message + "</think>"}))["tokens"]
    thought = ok(server.post("/detokenize", {"model": server.model, "tokens": tokens[:budget]}))["content"]
    rest = ok(server.post("/completion", {"model": server.model, "prompt": ids + tokens[:budget] + closing,
                                          "n_predict": MAX - budget - len(closing), "temperature": 0}))
    return thought + message, rest["content"].lstrip()


def chat(server, **extra):
    out = ok(server.chat({"model": server.model, "messages": MESSAGES, "max_tokens": MAX, "temperature": 0, **extra}))
    message = out["choices"][0]["message"]
    return message.get("reasoning_content") or "", message["content"], out


def test_a_budget_closes_the_block_after_its_tokens_and_the_model_answers(server, plain):
    for budget in (4, 0):
        reasoning, content, out = chat(server, thinking_budget_tokens=budget)
        assert (reasoning, content) == held(server, plain, budget, MESSAGE), budget
        assert out["usage"]["completion_tokens"] == MAX
    # The server's default holds a request that sets none; -1 lifts it.
    assert chat(server)[:2] == held(server, plain, DEFAULT_BUDGET, MESSAGE)
    free = chat(server, thinking_budget_tokens=-1)
    text = ok(server.post("/detokenize", {"model": server.model, "tokens": plain[1]}))["content"]
    assert free[:2] == (text, "")


@pytest.mark.parametrize("method", ["ngram-mod", "draft-simple"])
def test_a_held_answer_is_the_same_with_speculation(server, plain, method):
    spec = {"spec_type": method, **({"spec_ngram_n": 2, "spec_ngram_min": 1} if method == "ngram-mod"
                                    else {"spec_draft_model": server.model})}
    want = held(server, plain, 5, MESSAGE)
    reasoning, content, out = chat(server, thinking_budget_tokens=5, spec_draft_policy="fixed", **spec)
    assert (reasoning, content) == want
    assert out["timings"]["draft_n_accepted"] > 0          # the closing run was drafted and taken
    if method != "ngram-mod":
        return                                              # streamed once: the pieces are the method's
    events = server.stream("/v1/chat/completions", {"model": server.model, "messages": MESSAGES, "max_tokens": MAX,
                                                    "temperature": 0, "thinking_budget_tokens": 5,
                                                    "spec_draft_policy": "fixed", **spec})
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert ("".join(d.get("reasoning_content") or "" for d in deltas),
            "".join(d.get("content") or "" for d in deltas)) == want


def test_a_budget_with_a_grammar_is_refused_by_name(server):
    r = server.chat({"model": server.model, "messages": MESSAGES, "max_tokens": 4, "thinking_budget_tokens": 3,
                     "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_budget_tokens", r.text
    r = server.chat({"model": server.model, "messages": MESSAGES, "max_tokens": 4, "thinking_budget_tokens": -2})
    assert r.status_code == 400 and "thinking_budget_tokens" in r.text, r.text
    # The server's default budget does not hold a constrained answer: its grammar does.
    out = ok(server.chat({"model": server.model, "messages": MESSAGES, "max_tokens": 12, "reasoning_format": "none",
                          "response_format": {"type": "json_object"}}))
    assert out["choices"][0]["message"]["content"].lstrip().startswith("{")


def test_extended_thinking_on_the_messages_api(server, plain):
    import anthropic
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    reasoning, content = held(server, plain, 6, MESSAGE)
    ask = dict(model=server.model, max_tokens=MAX, messages=MESSAGES, extra_body={"temperature": 0},
               thinking={"type": "enabled", "budget_tokens": 6})
    whole = client.messages.create(**ask)
    check_shape(whole.model_dump(exclude_none=True), "AnthropicMessage")
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert (whole.content[0].thinking, whole.content[1].text) == (reasoning, content)
    with client.messages.stream(**ask) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert (final.content[0].thinking, final.content[1].text) == (reasoning, content)
    assert "thinking" in kinds and "text" in kinds
    # Without extended thinking the text is as the model wrote it, thoughts and all (held
    # by the server's default budget, so closed).
    raw = client.messages.create(model=server.model, max_tokens=MAX, messages=MESSAGES, extra_body={"temperature": 0})
    assert [b.type for b in raw.content] == ["text"] and "</think>" in raw.content[0].text
