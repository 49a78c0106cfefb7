"""Tool calls and reasoning through the real server, per chat-template family.

Each family's model is the demo model with that family's template written in
(tests/support/tool_templates.py). The model is asked to repeat a call in its family's
format (greedy, so it answers the same every run); the server's answer must be exactly
what the family's parser makes of the raw text the model wrote for the same prompt
(``/apply-template`` then ``/v1/completions``), and hold the call that was asked for.
"""
import json

import pytest

from geniex.engine import toolcalls
from serverproc import AppServer, check_shape, ok

# The SDKs are imported in the tests that use them: importing them takes seconds,
# paid at collection by every pytest-xdist worker otherwise.

# The tools carry no description (optional in OpenAI's shape): every prompt renders them,
# and nothing here reads one; each token of them is a prefilled row in every family.
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
TWO_TOOLS = TOOLS + [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]
SYSTEM = "You repeat the user's text exactly, nothing else."
ASK = "Repeat the following text exactly, with nothing before it:\n"

# family -> (what the model is asked to repeat, the calls expected: (name, arguments))
CASES = {
    "qwen3": ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
              '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>',
              [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    "llama3": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
               [("get_weather", {"city": "Paris"})]),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_weather", "arguments": {"city": "Rome"}}]',
                [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    "gemma4": ('OK <|tool_call>call:get_weather{city:"Paris"}', [("get_weather", {"city": "Paris"})]),
    "generic": ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}',
                [("get_weather", {"city": "Paris"})]),
}
FAMILY_OF = {"qwen3": "hermes", "llama3": "llama3", "mistral": "mistral", "gemma4": "gemma4", "generic": "generic"}


# Each family is a model of its own: the tests run grouped by the model they need loaded
# (tests/server/conftest.py), one load per family instead of one per test.
resident = pytest.mark.resident
BY_FAMILY = [pytest.param(family, marks=resident(family)) for family in sorted(CASES)]


MODELS = {}         # family -> the model's path (requests name the files: no store copies to hash)


def name(family):
    return MODELS[family]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tool_models):
    MODELS.update({family: str(path) for family, path in tool_models.items()})
    with AppServer(tmp_path_factory.mktemp("tool-calls"), nctx=2048, allow_paths=True) as s:
        yield s


# The requests of one family share their system turn, tools and often the whole prompt
# (raw, whole and streamed answers to it): each reuses the KV cache's prefix of the one
# before (``cache_prompt``, as llama.cpp's server does by default) instead of decoding
# the prompt again. A continued prefix gives the tokens a fresh prefill does (a batch
# row's logits are a one-row decode's, with the default q8_0 cache: what speculative
# identity rests on); these tests are about what the parsers make of the answer.
CACHE = {"cache_prompt": True}


def body(family, text, **extra):
    return {"model": name(family), "max_tokens": 80, "tools": TWO_TOOLS, **CACHE,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK + text}], **extra}


def raw_answer(server, request):
    """What the model writes for ``request``'s prompt, unparsed: the template's prompt
    (with the tools) continued as a raw completion."""
    prompt = ok(server.post("/apply-template", request))["prompt"]
    return ok(server.post("/v1/completions", {"model": request["model"], "prompt": prompt, **CACHE,
                                               "max_tokens": request["max_tokens"]}))["choices"][0]["text"]


def calls_of(message):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


def streamed(events):
    """A streamed chat answer put back together: (content, reasoning, calls, finish)."""
    content, reasoning, calls, finish = "", "", {}, None
    for e in events:
        check_shape(e, "ChatCompletionChunk")
        if not e["choices"]:
            continue
        choice = e["choices"][0]
        delta = choice["delta"]
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        for part in delta.get("tool_calls") or ():
            i = part["index"]
            if i not in calls:
                # The first delta of a call: its id, name and empty arguments.
                assert part["id"].startswith("call_") and part["type"] == "function", part
                assert part["function"]["arguments"] == ""
                calls[i] = {"id": part["id"], "name": part["function"]["name"], "arguments": ""}
            else:
                assert "id" not in part and "name" not in part.get("function", {})
                calls[i]["arguments"] += part["function"]["arguments"]
        finish = choice["finish_reason"] or finish
    assert sorted(calls) == list(range(len(calls)))
    return content, reasoning, [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())], finish


@pytest.fixture(scope="module")
def streamed_calls(server):
    """family -> the events of the streamed chat answer to its CASES text, made once: the
    family test puts them back together, and gemma4's also shows the order of its text
    and call (test_text_before_a_call_streams_before_the_call), one answer for both."""
    events = {}

    def answer(family):
        if family not in events:
            events[family] = server.stream("/v1/chat/completions", body(family, CASES[family][0]))
        return events[family]
    return answer


@pytest.mark.parametrize("family", BY_FAMILY)
def test_each_family_s_calls_are_parsed_from_the_answer(server, streamed_calls, family):
    text, expected = CASES[family]
    request = body(family, text)
    raw = raw_answer(server, request)
    content, _, calls = toolcalls.parse(raw, toolcalls.FAMILIES[FAMILY_OF[family]]())
    assert [(c.name, json.loads(c.arguments)) for c in calls] == expected, raw

    answer = ok(server.chat(request))
    check_shape(answer, "ChatCompletion")
    message, finish = answer["choices"][0]["message"], answer["choices"][0]["finish_reason"]
    assert calls_of(message) == expected
    assert finish == "tool_calls"
    assert message["content"] == (content if content.strip() else None)
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"])
    assert len({c["id"] for c in message["tool_calls"]}) == len(expected)

    s_content, _, s_calls, s_finish = streamed(streamed_calls(family))
    assert (s_content, s_calls, s_finish) == (content, expected, "tool_calls")


# The official OpenAI SDK, on the family test's qwen3 prompt: it runs right after that test
# (the file's order inside the qwen3 group), so the prompt is still in the KV cache.
@resident("qwen3")
def test_openai_sdk_gets_tool_calls(server):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    text, expected = CASES["qwen3"]
    request = body("qwen3", text)
    completion = client.chat.completions.create(model=request["model"], messages=request["messages"],
                                                tools=request["tools"], max_tokens=80, extra_body=CACHE)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == expected

    calls = {}
    finish = None
    with client.chat.completions.stream(model=request["model"], messages=request["messages"], tools=request["tools"],
                                        max_tokens=80, extra_body=CACHE) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                calls[event.index] = (event.name, json.loads(event.arguments))
        final = stream.get_final_completion()
        finish = final.choices[0].finish_reason
    assert [calls[i] for i in sorted(calls)] == expected and finish == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in final.choices[0].message.tool_calls] == expected


@resident("gemma4")
def test_text_before_a_call_streams_before_the_call(streamed_calls):
    events = streamed_calls("gemma4")
    kinds = [("content" if e["choices"][0]["delta"].get("content") else "call")
             for e in events if e["choices"] and (e["choices"][0]["delta"].get("content")
                                                  or e["choices"][0]["delta"].get("tool_calls"))]
    assert kinds[0] == "content" and "call" in kinds and kinds.index("call") > 0
    assert streamed(events)[0] == "OK "


@resident("mistral")
def test_parallel_tool_calls_false_keeps_the_first_call(server):
    answer = ok(server.chat(body("mistral", CASES["mistral"][0], parallel_tool_calls=False)))["choices"][0]
    assert calls_of(answer["message"]) == CASES["mistral"][1][:1]


@resident("generic")
def test_text_that_is_not_a_call_is_content(server):
    # The generic family reads a JSON answer as a call only in its call shapes.
    request = body("generic", '{"weather": "sunny"}')
    raw = raw_answer(server, request)
    answer = ok(server.chat(request))["choices"][0]
    assert answer["message"]["content"] == raw and "tool_calls" not in answer["message"]
    assert answer["finish_reason"] == "stop"


@resident("qwen3")
def test_a_conversation_with_calls_and_results_renders(server):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    # After the system turn and tools of body(), kept in the KV cache from the tests before.
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "Ask the tool."},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    request = {"model": name("qwen3"), "messages": messages, "tools": TWO_TOOLS, "max_tokens": 8, **CACHE}
    prompt = ok(server.post("/apply-template", request))["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt and "<think>Ask the tool.</think>" in prompt
    answer = ok(server.chat(request))
    check_shape(answer, "ChatCompletion")


# -- tool_choice required / named: the answer constrained to calls ----------------------------
# The system turn and tools of body(): the template renders them first, so this prompt
# continues the family test's from the KV cache instead of prefilling them again. These
# tests stand before those whose prompts show no tools (tool_choice none, reasoning): the
# cache holds the last prompt only, and a family's tests run in the file's order.
QUESTION = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the weather in Paris?"}]


REQUIRED = {"max_tokens": 60, "tools": TWO_TOOLS, "messages": QUESTION, "parallel_tool_calls": False,
            "tool_choice": "required", **CACHE}


@pytest.fixture(scope="module")
def required_answers(server):
    """family -> the whole answer to REQUIRED (plain decoding), each made once: the
    enforcement test checks it and the speculation test compares with qwen3's, which is
    then made while the plain qwen3 model is resident (not one reload more)."""
    answers = {}

    def answer(family):
        if family not in answers:
            answers[family] = ok(server.chat({**REQUIRED, "model": name(family)}))
        return answers[family]
    return answer


@pytest.mark.parametrize("family", BY_FAMILY)
def test_required_and_named_choices_are_enforced(server, required_answers, family):
    """``required`` answered whole, the named choice streamed: each choice is enforced by
    the family's grammar in the worker, the same for either delivery (a stream's calls
    are put back together by the same parser as a whole answer's, which
    test_each_family_s_calls_are_parsed_from_the_answer checks per family), so one
    answer per choice checks both choices and both deliveries."""
    answer = required_answers(family)["choices"][0]
    assert answer["finish_reason"] == "tool_calls", answer
    required = calls_of(answer["message"])
    named = {"type": "function", "function": {"name": "get_time"}}
    _, _, forced, s_finish = streamed(server.stream("/v1/chat/completions",
                                                    {**REQUIRED, "model": name(family), "tool_choice": named}))
    assert s_finish == "tool_calls"
    for calls, names in ((required, {"get_weather", "get_time"}), (forced, {"get_time"})):
        assert len(calls) == 1 and calls[0][0] in names, calls
        key = "city" if calls[0][0] == "get_weather" else "zone"
        assert set(calls[0][1]) == {key} and isinstance(calls[0][1][key], str)     # the tool's schema, nothing else


@resident("qwen3")
def test_tool_choice_none_shows_no_tools_and_parses_nothing(server):
    request = body("qwen3", CASES["qwen3"][0])
    with_tools = ok(server.post("/apply-template", request))["prompt"]
    without = ok(server.post("/apply-template", {**request, "tool_choice": "none"}))["prompt"]
    assert "get_weather" in with_tools.split("Repeat")[0] and without.split("Repeat")[0].count("get_weather") == 0
    answer = ok(server.chat({**request, "tool_choice": "none"}))["choices"][0]
    assert "tool_calls" not in answer["message"] and answer["finish_reason"] != "tool_calls"


@resident("think")
def test_a_template_without_tools_gets_them_described(server, demo_model):
    # The think template renders no tools: they reach the model in a system message,
    # in the generic format, as llama.cpp's server polyfills them.
    request = body("think", "hello")
    prompt = ok(server.post("/apply-template", request))["prompt"]
    assert "get_weather" in prompt and '"tool_call"' in prompt


# -- reasoning ----------------------------------------------------------------------------
THINK = "<think>weather</think>sunny"


@resident("qwen3")
def test_reasoning_formats(server):
    request = body("qwen3", THINK)
    del request["tools"]
    raw = raw_answer(server, request)
    assert raw.startswith("<think>"), raw
    thought, rest = raw[len("<think>"):].split("</think>", 1)
    for fmt, content, reasoning in (("none", raw, None), ("deepseek", rest.lstrip(), thought),
                                    ("auto", rest.lstrip(), thought), (None, rest.lstrip(), thought),
                                    ("deepseek-legacy", raw, thought)):
        extra = {} if fmt is None else {"reasoning_format": fmt}
        message = ok(server.chat({**request, **extra}))["choices"][0]["message"]
        assert message["content"] == content and message.get("reasoning_content") == reasoning, fmt
        s_content, s_reasoning, _, _ = streamed(server.stream("/v1/chat/completions", {**request, **extra}))
        if fmt == "deepseek-legacy":
            assert (s_content, s_reasoning) == (raw, "")        # streamed: in content only
        else:
            assert (s_content, s_reasoning or None) == (content, reasoning), fmt


@resident("think")
def test_a_block_the_prompt_opened_is_reasoning(server):
    request = {"model": name("think"), "max_tokens": 12, "messages": [{"role": "user", "content": "Hi"}], **CACHE}
    prompt = ok(server.post("/apply-template", request))["prompt"]
    assert prompt.endswith("<think>\n")
    raw = raw_answer(server, request)
    message = ok(server.chat(request))["choices"][0]["message"]
    if "</think>" in raw:
        thought, rest = raw.split("</think>", 1)
        assert (message.get("reasoning_content"), message["content"]) == (thought, rest.lstrip())
    else:
        assert (message.get("reasoning_content"), message["content"]) == (raw, "")
    assert ok(server.chat({**request, "reasoning_format": "none"}))["choices"][0]["message"]["content"] == raw


@resident("qwen3")
def test_enable_think_reaches_the_template(server):
    request = {"model": name("qwen3"), "messages": [{"role": "user", "content": "Hi"}]}
    off = ok(server.post("/apply-template", {**request, "enable_think": False}))["prompt"]
    assert off.endswith("<think>\n\n</think>\n\n")
    kwargs = ok(server.post("/apply-template", {**request, "chat_template_kwargs": {"enable_thinking": False}}))
    assert kwargs["prompt"] == off
    assert not ok(server.post("/apply-template", {**request, "enable_think": True}))["prompt"].endswith("</think>\n\n")


@pytest.mark.parametrize("field,value", [
    ("reasoning_format", "deepseek2"), ("reasoning_format", 1), ("enable_think", "yes"),
    ("tool_choice", "sometimes"), ("tool_choice", {"type": "function", "function": {"name": "nope"}}),
    ("tool_choice", {"type": "function"}),
    ("tools", [{"type": "retrieval"}]), ("tools", [{"type": "function", "function": {}}]),
    ("parallel_tool_calls", "no"), ("chat_template_kwargs", [1]),
])
def test_invalid_values_are_400s_naming_the_field(server, field, value):
    request = body("qwen3", "hi", **{field: value})
    r = server.chat(request)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(field) and field in error["message"]


def test_required_with_no_tools_or_with_a_grammar_is_a_400(server):
    r = server.chat({**body("qwen3", "hi", tool_choice="required"), "tools": None})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = server.chat(body("qwen3", "hi", tool_choice="required", response_format={"type": "json_object"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


@resident("qwen3 ngram-mod")
def test_enforced_calls_are_the_same_with_speculation(server, required_answers):
    # The grammar constrains every verify row: drafting changes nothing in the answer.
    # The plain answer is the enforcement test's (made while plain qwen3 was resident).
    plain = required_answers("qwen3")
    drafted = ok(server.chat({**REQUIRED, "model": name("qwen3"), "spec_type": "ngram-mod",
                              "spec_draft_policy": "fixed"}))
    assert calls_of(drafted["choices"][0]["message"]) == calls_of(plain["choices"][0]["message"])
    assert drafted["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert drafted["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0     # it did draft


def test_enable_think_and_kwargs_that_disagree_are_a_400(server):
    r = server.chat(body("qwen3", "hi", enable_think=True, chat_template_kwargs={"enable_thinking": False}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "enable_think"
