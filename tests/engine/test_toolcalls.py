"""The tool-call and reasoning parsers alone (no model): each family's format, whole and
streamed in every split, failures kept as content, detection from templates."""
import json

import pytest

from geniex.engine import toolcalls
from geniex.engine.toolcalls import tools as agent
from geniex.errors import UsageError

pytestmark = pytest.mark.fast

F = toolcalls.FAMILIES


def run_stream(text, family, pieces, **kw):
    """Feed ``text`` cut into ``pieces``-long pieces; returns (content, reasoning, calls, deltas)."""
    parser = toolcalls.ChatParser(family() if family else None, streaming=True, **kw)
    deltas = [parser.feed(text[i:i + pieces]) for i in range(0, len(text), pieces)] + [parser.finish()]
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning for d in deltas)
    calls = [(c.name, json.loads(c.arguments)) for d in deltas for c in d.calls]
    return content, reasoning, calls, deltas


def whole(text, family, **kw):
    content, reasoning, calls = toolcalls.parse(text, family() if family else None, **kw)
    return content, reasoning, [(c.name, json.loads(c.arguments)) for c in calls]


PARIS = ("get_weather", {"city": "Paris"})
ROME = ("get_weather", {"city": "Rome"})
CASES = [
    ("hermes", 'OK. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', "OK. ", [PARIS]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>', "", [PARIS, ROME]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [PARIS]),  # no close tag
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', "",
     [PARIS]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("llama3", ' {"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_weather", "parameters": {"city": "Rome"}}', "", [PARIS, ROME]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_weather", "arguments": {"city": "Rome"}}]', "", [PARIS, ROME]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', "",
     [PARIS, ROME]),
    ("gemma4", 'Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', "Let me check.",
     [PARIS]),
    ("gemma4", '<|tool_call>call:get_weather{city:"Paris"}', "", [PARIS]),
    ("gemma4", '<|tool_call>call:f{a:<|"|>x, y: {z}<|"|>,n:-2.5,b:true,c:null,l:[1,<|"|>s<|"|>],o:{k:v}}<tool_call|>'
               '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>}<tool_call|>', "",
     [("f", {"a": "x, y: {z}", "n": -2.5, "b": True, "c": None, "l": [1, "s"], "o": {"k": "v"}}), ROME]),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "", [PARIS]),
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_weather", "arguments": {"city": "Rome"}}]}', "", [PARIS, ROME]),
    ("generic", '```json\n{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}\n```', "", [PARIS]),
    ("generic", '{"response": "It is sunny."}', "It is sunny.", []),
]


@pytest.mark.parametrize("family,text,content,calls", CASES)
def test_each_family_whole_and_streamed_in_every_split(family, text, content, calls):
    assert whole(text, F[family]) == (content, "", calls)
    for size in (1, 2, 3, 7, len(text)):
        got = run_stream(text, F[family], size)
        assert got[:3] == (content, "", calls), size


NOT_CALLS = [
    ("hermes", 'I like <tool_calls> and <tool_call>not json</tool_call> too'),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'),       # cut short
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),                          # no name
    ("llama3", '{"weather": "sunny"}'),
    ("llama3", 'The call is {"name": "get_weather", "parameters": {}}'),            # not the whole answer
    ("mistral", '[TOOL_CALLS] is how I would call it'),
    ("gemma4", '<|tool_call>call get_weather'),
    ("generic", '{"weather": "sunny"}'),
    ("generic", 'Just text {"tool_call": {"name": "x", "arguments": {}}}'),
]


@pytest.mark.parametrize("family,text", NOT_CALLS)
def test_text_that_is_not_a_call_is_content(family, text):
    assert whole(text, F[family]) == (text, "", [])
    for size in (1, 4, len(text)):
        assert run_stream(text, F[family], size)[:3] == (text, "", []), size


def test_a_stream_holds_back_only_a_possible_opening():
    parser = toolcalls.ChatParser(F["hermes"](), streaming=True)
    assert parser.feed("Sure, <tool").content == "Sure, "
    assert parser.feed("box> is here").content == "<toolbox> is here"
    assert parser.feed(" <tool_call>{\"name\": \"a\",").content == " "
    delta = parser.feed(' "arguments": {}}</tool_call>')
    assert delta.content == "" and [c.name for c in delta.calls] == ["a"]
    assert not parser.finish()


def test_calls_have_openai_ids_and_json_arguments():
    _, _, calls = toolcalls.parse('<tool_call>{"name": "a", "arguments": {"x": [1, "é"]}}</tool_call>', F["hermes"]())
    item = calls[0].openai()
    assert item["id"].startswith("call_") and item["type"] == "function"
    assert json.loads(item["function"]["arguments"]) == {"x": [1, "é"]}
    _, _, mistral = toolcalls.parse('[TOOL_CALLS][{"name": "a", "arguments": {}, "id": "abc123XYZ"}]', F["mistral"]())
    assert mistral[0].id == "abc123XYZ"      # Mistral's templates want their 9-character ids back


def test_parallel_false_keeps_the_first_call():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert [c.name for c in toolcalls.parse(text, F["hermes"](), parallel=False)[2]] == ["a"]


REASONING = [
    ("<think>weather</think>\n\nsunny", "deepseek", False, "sunny", "weather"),
    ("<think>weather</think>sunny", "auto", False, "sunny", "weather"),
    ("  <think>weather</think>sunny", "deepseek", False, "sunny", "weather"),
    ("<think>weather</think>sunny", "none", False, "<think>weather</think>sunny", ""),
    ("<think>weather</think>sunny", "deepseek-legacy", False, "<think>weather</think>sunny", "weather"),
    ("weather</think>sunny", "deepseek", True, "sunny", "weather"),
    ("still thinking", "deepseek", True, "", "still thinking"),
    ("<think>unclosed", "deepseek", False, "", "unclosed"),
    ("no thoughts <think>here</think>", "deepseek", False, "no thoughts <think>here</think>", ""),
    ("<", "deepseek", False, "<", ""),
]


@pytest.mark.parametrize("text,fmt,forced,content,reasoning", REASONING)
def test_reasoning_formats(text, fmt, forced, content, reasoning):
    assert whole(text, None, reasoning_format=fmt, forced=forced) == (content, reasoning, [])
    for size in (1, 3, len(text)):
        got = run_stream(text, None, size, reasoning_format=fmt, forced=forced)
        if fmt == "deepseek-legacy":
            assert got[:2] == (text, "")        # streamed, the thoughts stay in content only
        else:
            assert got[:2] == (content, reasoning), size


def test_reasoning_then_a_call():
    text = "<think>I need the weather.</think>\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>"
    assert whole(text, F["hermes"], reasoning_format="auto") == ("", "I need the weather.", [PARIS])
    assert run_stream(text, F["hermes"], 2, reasoning_format="auto")[:3] == ("", "I need the weather.", [PARIS])


def test_gemma4_reasoning_markers():
    markers = toolcalls.markers_for("{{ '<|channel>thought' }}")
    assert whole("<|channel>thought\nhm<channel|>Hi", None, reasoning_format="auto", markers=markers) == ("Hi", "\nhm", [])


def test_families_are_detected_from_the_templates():
    import tool_templates
    expected = {"qwen3": "hermes", "llama3": "llama3", "mistral": "mistral", "gemma4": "gemma4",
                "generic": "generic", "think": "generic"}
    for family, source in tool_templates.TEMPLATES.items():
        assert toolcalls.family_of(source).name == expected[family], family
    assert toolcalls.family_of(None).name == "generic"
    assert toolcalls.forced_open("<|im_start|>assistant\n<think>\n", ("<think>", "</think>"))


def test_request_fields_are_checked():
    tools = [{"type": "function", "function": {"name": "x"}}]
    assert agent.check_tool_choice(None, None) == "auto"
    assert agent.check_tool_choice("none", None) == "none"
    assert agent.check_tool_choice("required", tools) == "required"
    assert agent.check_tool_choice({"type": "function", "function": {"name": "x"}}, tools)["function"]["name"] == "x"
    for bad, with_tools in (("always", tools), ("required", None), ({"type": "function", "function": {"name": "y"}},
                                                                    tools), (3, tools)):
        with pytest.raises(UsageError) as e:
            agent.check_tool_choice(bad, with_tools)
        assert e.value.param == "tool_choice"
    with pytest.raises(UsageError):
        agent.check_tools([{"type": "function", "function": {"name": ""}}])
    with pytest.raises(UsageError):
        agent.check_reasoning_format("r1")
    assert agent.template_kwargs({"a": 1}, True) == {"a": 1, "enable_thinking": True}
    assert agent.template_kwargs(None, None) is None
    with pytest.raises(UsageError):
        agent.template_kwargs({"enable_thinking": False}, True)


@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral", "gemma4", "generic"])
def test_call_grammars_compile_and_their_calls_parse(family):
    from geniex.engine.toolcalls.grammar import call_grammar, lark_source
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
             {"type": "function", "function": {"name": "get_time"}}]
    for name in (None, "get_time"):
        for parallel in (True, False):
            grammar = call_grammar(family, tools, name, parallel)
            assert grammar.kind == "lark"
    source = lark_source(family, tools, "get_time", False)
    assert "get_time" in source and "get_weather" not in source
    assert '"additionalProperties": false' in lark_source(family, tools)
