"""``geniex.api.answer``: the chat route's answer (tool calls, reasoning) from Python,
through the same engine task as the server."""
import json

import pytest

import geniex.api as gx
from geniex.errors import UsageError

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def session(tool_models):
    s = gx.load(str(tool_models["qwen3"]), nctx=1024)
    yield s
    s.close()


def test_a_required_call_from_python(session):
    out = gx.answer(session, [{"role": "user", "content": "What is the weather in Paris?"}], tools=TOOLS,
                    tool_choice="required", parallel_tool_calls=False, max_tokens=60)
    assert out["finish_reason"] == "tool_calls" and out["content"] is None
    (call,) = out["tool_calls"]
    assert call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}


def test_reasoning_from_python(session):
    messages = [{"role": "system", "content": "You repeat the user's text exactly, nothing else."},
                {"role": "user", "content": "Repeat the following text exactly, with nothing before it:\n"
                                            "<think>weather</think>sunny"}]
    raw = gx.answer(session, messages, reasoning_format="none", max_tokens=20)["content"]
    out = gx.answer(session, messages, max_tokens=20)
    if raw.startswith("<think>") and "</think>" in raw:
        thought, rest = raw[len("<think>"):].split("</think>", 1)
        assert (out["reasoning_content"], out["content"]) == (thought, rest.lstrip())
    else:
        pytest.fail(f"the model did not repeat the thinking block: {raw!r}")


def test_bad_values_are_usage_errors(session):
    with pytest.raises(UsageError):
        gx.answer(session, [{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice="always")
    with pytest.raises(UsageError):
        gx.answer(session, [{"role": "user", "content": "hi"}], reasoning_format="r1")
