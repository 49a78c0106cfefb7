"""Tool use through the agents' APIs, with their own SDKs: OpenAI's Responses API
(``function_call`` / ``function_call_output`` items) and Anthropic's Messages API
(``tool_use`` / ``tool_result`` blocks), both on the chat path.

The model is the demo model with qwen3's tool template (tests/support/tool_templates.py),
asked to repeat two calls (greedy, so it answers the same every run). Each API must
return the calls the chat route returns for the same conversation, streamed or whole,
and a conversation that sends them back with their results must make the same prompt
as its chat form (same prompt tokens, same answer).
"""
import json

import pytest

from serverproc import AppServer, ok

# The SDKs are imported in the tests that use them: importing them takes seconds,
# paid at collection by every pytest-xdist worker otherwise.

MODEL = None            # the qwen3 tool model's path, set by the server fixture (requests name the file)
SYSTEM = "You repeat the user's text exactly, nothing else."
ASK = ("Repeat the following text exactly, with nothing before it:\n"
       '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
       '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
CALLS = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": PARAMS}}]
OPENAI_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": PARAMS}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather of a city", "input_schema": PARAMS}]
RESULTS = ["18 C, sunny", "21 C, cloudy"]


# Every request keeps the KV cache of the one before: they share the system turn, the
# tools and the ask (whole and streamed answers to the same prompt), so each decodes only
# what its prompt adds. A continued prefix gives the tokens a fresh prefill does (a batch
# row's logits are a one-row decode's with the default q8_0 cache); these tests are
# about how the APIs carry the calls.
KEEP = {"GenieX-KeepCache": "true"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tool_models):
    global MODEL
    MODEL = str(tool_models["qwen3"])
    with AppServer(tmp_path_factory.mktemp("agent-tools"), nctx=2048, allow_paths=True) as s:
        yield s


@pytest.fixture(scope="module")
def followup(server):
    """The chat route's first answer token and prompt size for the conversation after
    the two calls (their results sent back)."""
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": name, "arguments": json.dumps(args)}} for i, (name, args) in enumerate(CALLS)]
    messages = ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK},
                 {"role": "assistant", "content": "", "tool_calls": calls}]
                + [{"role": "tool", "tool_call_id": f"call_{i}", "content": r} for i, r in enumerate(RESULTS)])
    answer = ok(server.chat({"model": MODEL, "messages": messages, "tools": CHAT_TOOLS, "max_tokens": 1}, headers=KEEP))
    assert answer["choices"][0]["message"]["content"]
    return answer["choices"][0]["message"]["content"], answer["usage"]["prompt_tokens"]


def test_responses_api_returns_and_takes_function_calls(server, followup):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", default_headers=KEEP)
    resp = client.responses.create(model=MODEL, instructions=SYSTEM, input=ASK, tools=OPENAI_TOOLS,
                                   max_output_tokens=80)
    calls = [o for o in resp.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS and resp.status == "completed"
    assert [o.type for o in resp.output] == ["function_call"] * 2 and resp.output_text == ""
    assert all(c.call_id.startswith("call_") and c.id.startswith("fc_") for c in calls)
    assert resp.tools[0].name == "get_weather"

    events = list(client.responses.create(model=MODEL, instructions=SYSTEM, input=ASK, tools=OPENAI_TOOLS,
                                          max_output_tokens=80, stream=True))
    done = [(e.name, json.loads(e.arguments)) for e in events if e.type == "response.function_call_arguments.done"]
    final = events[-1].response
    assert done == CALLS and events[-1].type == "response.completed"
    assert [(o.name, json.loads(o.arguments)) for o in final.output] == CALLS

    # The calls and their results sent back: the prompt is the chat form's.
    items = ([{"type": "function_call", "call_id": f"call_{i}", "name": name, "arguments": json.dumps(args)}
              for i, (name, args) in enumerate(CALLS)]
             + [{"type": "function_call_output", "call_id": f"call_{i}", "output": r} for i, r in enumerate(RESULTS)])
    after = client.responses.create(model=MODEL, instructions=SYSTEM, tools=OPENAI_TOOLS, max_output_tokens=1,
                                    input=[{"role": "user", "content": ASK}, *items])
    assert (after.output_text, after.usage.input_tokens) == followup


def test_messages_api_returns_and_takes_tool_use(server, followup):
    import anthropic
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", default_headers=KEEP)
    msg = client.messages.create(model=MODEL, system=SYSTEM, max_tokens=80, tools=ANTHROPIC_TOOLS,
                                 messages=[{"role": "user", "content": ASK}])
    assert [(b.name, b.input) for b in msg.content if b.type == "tool_use"] == CALLS
    assert [b.type for b in msg.content] == ["tool_use"] * 2 and msg.stop_reason == "tool_use"

    with client.messages.stream(model=MODEL, system=SYSTEM, max_tokens=80, tools=ANTHROPIC_TOOLS,
                                messages=[{"role": "user", "content": ASK}]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content] == CALLS and final.stop_reason == "tool_use"
    assert kinds.count("content_block_start") == 2

    turns = [{"role": "user", "content": ASK},
             {"role": "assistant", "content": [{"type": "tool_use", "id": f"call_{i}", "name": name, "input": args}
                                               for i, (name, args) in enumerate(CALLS)]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"call_{i}", "content": r}
                                          for i, r in enumerate(RESULTS)]}]
    after = client.messages.create(model=MODEL, system=SYSTEM, max_tokens=1, tools=ANTHROPIC_TOOLS, messages=turns)
    assert (after.content[0].text, after.usage.input_tokens + after.usage.cache_read_input_tokens) == followup
    count = client.messages.count_tokens(model=MODEL, system=SYSTEM, tools=ANTHROPIC_TOOLS, messages=turns)
    assert count.input_tokens == followup[1]


def test_what_this_server_cannot_honour_is_refused_by_name(server):
    import anthropic
    import openai
    openai_client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    with pytest.raises(openai.BadRequestError, match=r"tools\[1\]\.type: 'web_search'"):
        openai_client.responses.create(model=MODEL, input="hi", tools=[*OPENAI_TOOLS, {"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match=r"input\[1\]\.type: 'reasoning'"):
        openai_client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"},
                                                           {"type": "reasoning", "summary": []}])
    with pytest.raises(openai.BadRequestError, match=r"reasoning: reasoning effort"):
        openai_client.responses.create(model=MODEL, input="hi", reasoning={"effort": "high"})
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    with pytest.raises(anthropic.BadRequestError, match=r"thinking: extended thinking cannot be combined"):
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                               tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"},
                               thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.type: 'web_search_20250305'"):
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\]\.type: 'tool_use'"):
        client.messages.create(model=MODEL, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "get_weather", "input": {}}]}])
