"""geniex.engine.template on its own: the environment transformers' apply_chat_template
renders in (filters, globals, extensions, sandbox), and llama.cpp's object-arguments rule."""
import json
from datetime import datetime

import pytest

from geniex.engine.template import JinjaTemplate, TemplateFailed, TemplateRefused

pytestmark = pytest.mark.fast   # needs no model: the fast tier

USER = [{"role": "user", "content": "Hi"}]


def render(source, messages=USER, **kw):
    return JinjaTemplate(source, "<s>", "</s>").render(messages, **kw)


def test_tojson_is_transformers_own():
    # Jinja's built-in tojson would escape <, >, & and ' for HTML and take no separators.
    data = {"b": "é<&>'", "a": [1, 2]}
    assert render("{{ d | tojson }}", extra={"d": data}) == json.dumps(data, ensure_ascii=False)
    assert render("{{ d | tojson(indent=2) }}", extra={"d": data}) == json.dumps(data, ensure_ascii=False, indent=2)
    assert render("{{ d | tojson(separators=(',', ':'), sort_keys=true) }}", extra={"d": data}) == \
        '{"a":[1,2],"b":"é<&>\'"}'


def test_globals_and_variables():
    out = render("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|"
                 "{{ strftime_now('%Y') }}|{{ greeting }}", add_generation_prompt=False,
                 extra={"greeting": "hello"})
    assert out == f"<s>|</s>|False|True|{datetime.now().year}|hello"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert render("{{ tools[0].function.name }}", tools=tools) == "f"


def test_trim_and_lstrip_blocks_loop_controls_and_generation_block():
    source = ("{% for m in messages %}\n"
              "    {% if loop.index > 1 %}{% break %}{% endif %}\n"
              "{% generation %}[{{ m.content }}]{% endgeneration %}\n"
              "{% endfor %}")
    assert render(source, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "[a]"


def test_raise_exception_is_a_refusal_and_other_failures_are_not():
    with pytest.raises(TemplateRefused, match="refused the conversation: no system here"):
        render("{{ raise_exception('no system here') }}")
    # The sandbox is immutable, as transformers': a template cannot change its inputs.
    with pytest.raises(TemplateFailed, match="SecurityError"):
        render("{{ messages.append(1) }}")
    with pytest.raises(TemplateFailed, match="TemplateSyntaxError"):
        JinjaTemplate("{% for %}")


CALL = [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x":  1}'}}]}]


def test_tool_call_arguments_become_objects_only_where_the_template_needs_them():
    # Prints arguments with tojson: only an object shows its keys, so the JSON string
    # sent by an OpenAI client is parsed (llama.cpp's server does the same).
    each = "{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments ARGS }}{% endif %}{% endfor %}"
    as_json = JinjaTemplate(each.replace("ARGS", "| tojson"))
    assert as_json.object_arguments and as_json.render(CALL) == '{"x": 1}'
    # Prints them as they come: the string is left as sent.
    raw = JinjaTemplate(each.replace("ARGS", ""))
    assert not raw.object_arguments and raw.render(CALL) == '{"x":  1}'
    # The caller's messages are never changed.
    assert CALL[0]["tool_calls"][0]["function"]["arguments"] == '{"x":  1}'


def test_system_text_moves_into_the_next_user_message_only_without_a_system_turn():
    no_system = JinjaTemplate("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no') }}"
                              "{% endif %}[{{ m.role }}:{{ m.content }}]{% endfor %}")
    assert not no_system.system_role
    msgs = [{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
            {"role": "user", "content": "u"}, {"role": "system", "content": "c"},
            {"role": "assistant", "content": "x"}, {"role": "system", "content": "d"}]
    assert no_system.render(msgs, False) == "[user:a\nb\nu][user:c][assistant:x][user:d]"
    with_system = JinjaTemplate("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}")
    assert with_system.system_role
    assert with_system.render(msgs[:3], False) == "[system:a][system:b][user:u]"
