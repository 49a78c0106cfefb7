"""How the agents' APIs map tool use onto the chat path (no model): Responses items and
Anthropic blocks to chat messages, their tools and tool choices to chat's, and a whole
answer's calls back to their output items (tests/server/test_agent_tools.py runs them
through the real server and SDKs)."""
import json

import pytest

from geniex.engine.stats import Stats
from geniex.server.routes import messages, responses
from geniex.server.validation import ApiError

pytestmark = pytest.mark.fast

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def refused(convert, body):
    with pytest.raises(ApiError) as e:
        convert(body)
    return e.value.param


def test_responses_items_become_chat_turns():
    chat = responses.chat_body({"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "21 C"}]},
        {"type": "function_call", "call_id": "call_3", "name": "get_weather", "arguments": "{}"}]})
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant"]
    # The calls after an assistant message join it, as chat holds text and calls in one turn.
    assert [c["id"] for c in chat["messages"][2]["tool_calls"]] == ["call_1", "call_2"]
    assert chat["messages"][2]["content"] == [{"type": "text", "text": "Looking."}]
    assert [(m["tool_call_id"], m["content"]) for m in chat["messages"][3:5]] == [("call_1", "18 C"), ("call_2", "21 C")]
    assert chat["messages"][5] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}


def test_responses_tools_and_tool_choice_become_chat_s():
    body = {"input": "hi", "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS,
                                      "strict": True}],
            "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": False}
    chat = responses.chat_body(body)
    assert chat["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS,
                                                               "strict": True}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["parallel_tool_calls"] is False
    assert responses.chat_body({**body, "tool_choice": "required"})["tool_choice"] == "required"
    assert responses.chat_body({"input": "hi"})["tools"] is None
    assert refused(responses.chat_body, {**body, "tools": [*body["tools"], {"type": "file_search"}]}) == "tools[1].type"
    assert refused(responses.chat_body, {**body, "tool_choice": {"type": "web_search_preview"}}) == "tool_choice"
    assert refused(responses.chat_body, {"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}) \
        == "input[0].name"
    assert refused(responses.chat_body, {"input": [{"type": "function_call_output", "call_id": "c"}]}) == "input[0]"
    assert refused(responses.chat_body, {"input": [{"type": "reasoning"}]}) == "input[0].type"
    # reasoning: accepted without an effort or summary, a 400 with one (nothing would honour it)
    assert responses.chat_body({"input": "hi", "reasoning": {"effort": None, "summary": None}})["messages"]
    assert refused(responses.chat_body, {"input": "hi", "reasoning": {"effort": "medium"}}) == "reasoning"
    assert refused(responses.chat_body, {"input": "hi", "reasoning": {"summary": "auto"}}) == "reasoning"


def test_responses_output_items_of_a_whole_answer():
    resp = responses._Response({"input": "hi"}, "m")
    items = resp.output("  ", [CALL])
    assert items == [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                      "arguments": '{"city": "Paris"}', "status": "completed"}]
    assert [i["type"] for i in resp.output("Sure.", [CALL])] == ["message", "function_call"]
    assert resp.output("", [])[0]["content"][0]["text"] == ""          # an empty answer is an empty message


def test_messages_blocks_become_chat_turns():
    chat = messages.chat_body({"max_tokens": 8, "system": "Be brief.", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "18 C"}]},
                                     {"type": "text", "text": "And tomorrow?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                                           "input": {"city": "Paris", "day": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "no data",
                                      "is_error": True}]}]})
    got = [(m["role"], m["content"], m.get("tool_call_id")) for m in chat["messages"]]
    assert got == [("system", "Be brief.", None), ("user", "Weather in Paris?", None), ("assistant", "Looking.", None),
                   ("tool", "18 C", "toolu_1"), ("user", "And tomorrow?", None), ("assistant", "", None),
                   ("tool", "Error: no data", "toolu_2")]
    call = chat["messages"][2]["tool_calls"][0]
    assert call["id"] == "toolu_1" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_messages_tools_and_tool_choice_become_chat_s():
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": PARAMS},
             {"type": "custom", "name": "now", "input_schema": {"type": "object"}}]
    base = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    chat = messages.chat_body(base)
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS, "description": "Weather"}},
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]
    assert (chat["tool_choice"], chat["parallel_tool_calls"]) == (None, None)
    expect = {"auto": "auto", "any": "required", "none": "none"}
    for kind, want in expect.items():
        assert messages.chat_body({**base, "tool_choice": {"type": kind}})["tool_choice"] == want
    named = messages.chat_body({**base, "tool_choice": {"type": "tool", "name": "now",
                                                        "disable_parallel_tool_use": True}})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "now"}}
    assert named["parallel_tool_calls"] is False
    assert refused(messages.chat_body, {**base, "tools": [{"type": "bash_20250124", "name": "bash"}]}) \
        == "tools[0].type"
    assert refused(messages.chat_body, {**base, "tool_choice": {"type": "some"}}) == "tool_choice.type"
    user_use = {"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "now", "input": {}}]}
    assert refused(messages.chat_body, {**base, "messages": [user_use]}) == "messages[0].content[0].type"
    assert messages.chat_body({**base, "thinking": {"type": "disabled"}})["enable_think"] is False
    assert "enable_think" not in messages.chat_body(base)
    # extended thinking: the switch on, the budget held, the thoughts split out (a thinking block)
    enabled = messages.chat_body({**base, "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert (enabled["enable_think"], enabled["thinking_budget_tokens"], enabled["reasoning_format"]) == \
        (True, 1024, "deepseek")
    assert messages.chat_body({**base, "thinking": {"type": "adaptive"}})["thinking_budget_tokens"] == -1
    assert messages.chat_body(base)["reasoning_format"] == "none"
    for bad in ({"type": "enabled"}, {"type": "enabled", "budget_tokens": -2}, {"type": "on"}):
        assert refused(messages.chat_body, {**base, "thinking": bad}) == "thinking"
    assert refused(messages.chat_body, {**base, "thinking": {"type": "adaptive"}, "tool_choice": {"type": "any"}}) \
        == "thinking"
    earlier = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                 {"type": "redacted_thinking", "data": "x"},
                                                 {"type": "text", "text": "Hello"}]}]
    assert messages.chat_body({**base, "messages": earlier})["messages"][-1] == {"role": "assistant",
                                                                               "content": "Hello"}
    bad_use = {"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "now", "input": "{}"}]}
    assert refused(messages.chat_body, {**base, "messages": [bad_use]}) == "messages[0].content[0]"


def test_messages_content_of_a_whole_answer():
    class Answer:
        model, warnings = "m", ()

    stats = Stats()
    stats.stop_reason = "eos"
    msg = messages._message("msg_1", Answer(), "\n", stats, calls=[CALL])
    assert msg["content"] == [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]
    assert msg["stop_reason"] == "tool_use"
    stats.stop_reason = "length"        # a call read whole before the limit; the answer still ran out
    assert messages._message("msg_1", Answer(), "Sure.", stats, calls=[CALL])["stop_reason"] == "max_tokens"
    stats.stop_reason = "eos"
    plain = messages._message("msg_1", Answer(), "Hi.", stats)
    assert plain["content"] == [{"type": "text", "text": "Hi."}] and plain["stop_reason"] == "end_turn"
