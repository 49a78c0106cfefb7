"""Chat prompts equal llama.cpp's server's: the model's own Jinja template, rendered as
transformers does, gives the same prompt text and tokens as llama.cpp's server (the
same library, ``xllamacpp.Server``, in a subprocess) for the demo model and for a
template written here (default system message, tools and tool turns, BOS written by
the template, ``raise_exception``); and the same greedy answer through ``geniex
infer`` and ``geniex serve``."""

import gguf
import pytest
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

from geniex.engine.chat import Conversation, template_for
from geniex.engine.loop import GenOptions
from geniex.engine.session import LoadOptions, Session
from geniex.engine.sampling import SamplingParams
from geniex.engine.template import TemplateRefused
from geniex.errors import GenieXError
from geniex.server.placement import Defaults
from llamacpp_server import Reference
from serverproc import AppServer

import tiny_gemma4

# A template in the style of a model card's: a default system message, the tools
# listed in the system turn (| tojson), assistant tool calls whose arguments it prints
# with | tojson (so an OpenAI client's JSON string must become an object, as llama.cpp
# does), tool results, the BOS text written by the template, and raise_exception.
TEST_TEMPLATE = """\
{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}{%- set rest = messages[1:] %}\
{%- else %}{%- set system = 'You are a test assistant.' %}{%- set rest = messages %}{%- endif %}
{{- bos_token }}<|system|>{{ system }}
{%- if tools %} Tools: {% for t in tools %}{{ t.function.name }}{{ t.function.parameters | tojson }}\
{% if not loop.last %}, {% endif %}{% endfor %}{% endif %}<|end|>
{% for m in rest %}
{%- if m.role == 'user' %}
{%- if loop.previtem and loop.previtem.role == 'user' %}\
{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}
<|user|>{{ m.content }}<|end|>
{% elif m.role == 'assistant' %}<|assistant|>{% if m.tool_calls %}{% for tc in m.tool_calls %}\
call {{ tc.function.name }} {{ tc.function.arguments | tojson }}{% endfor %}{% else %}{{ m.content }}{% endif %}<|end|>
{% elif m.role == 'tool' %}<|tool|>{{ m.content }}<|end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}
"""

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\":   \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny, 20 C"},
]

DEMO_CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Name a colour, naïvely: 红?"}],
]

CUSTOM_CHATS = [
    ({"messages": [{"role": "user", "content": "Hi"}]}),
    ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
    ({"messages": TOOL_TURNS, "tools": TOOLS}),
]


def with_template(src, dst, template):
    """A copy of GGUF ``src`` at ``dst`` with ``tokenizer.chat_template`` = ``template``."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(
        gguf.GGUFValueType.STRING, template)}, [])
    return dst


@pytest.fixture(scope="module")
def custom_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("templated")
    return with_template(tiny_gemma4.write_target(d / "base.gguf"), d / "custom.gguf", TEST_TEMPLATE)


@pytest.fixture(scope="module")
def demo_ref(demo_model):
    with Reference(demo_model) as ref:
        yield ref


@pytest.fixture(scope="module")
def custom_ref(custom_model):
    with Reference(custom_model) as ref:
        yield ref


@pytest.fixture(scope="module")
def demo_session(demo_model):
    s = Session(demo_model, LoadOptions(nctx=1024))
    yield s
    s.close()


@pytest.fixture(scope="module")
def custom_session(custom_model):
    s = Session(custom_model, LoadOptions(nctx=512))
    yield s
    s.close()


def ours(session, body):
    text = template_for(session.model).render(body["messages"], tools=body.get("tools"),
                                              extra=body.get("chat_template_kwargs"))
    return text, session.tokenize_prompt(text)


def server_messages(messages):
    """Messages as our server hands them to the template (null content -> "")."""
    from geniex.server.conversation import chat_messages

    class Target:
        type, name = "llm", "test"
    return chat_messages(messages, Target, False)[0]


@pytest.mark.parametrize("messages", DEMO_CHATS)
def test_demo_prompt_tokens_equal_llamacpp_server(demo_session, demo_ref, messages):
    template = template_for(demo_session.model)
    assert template.kind == "jinja"
    text, tokens = ours(demo_session, {"messages": messages})
    assert text == demo_ref.prompt({"messages": messages})
    assert tokens == demo_ref.tokens({"messages": messages})
    # SmolLM2's own template adds its default system message when none is given (the
    # library's built-in chatml guess does not).
    assert ("named SmolLM" in text) == (messages[0]["role"] != "system")


@pytest.mark.parametrize("body", CUSTOM_CHATS, ids=["default-system", "system", "tools"])
def test_custom_template_prompt_tokens_equal_llamacpp_server(custom_session, custom_ref, body):
    vocab = custom_session.vocab
    assert vocab.add_bos and template_for(custom_session.model).bos_token == "<s>"
    text, tokens = ours(custom_session, dict(body, messages=server_messages(body["messages"])))
    assert text == custom_ref.prompt(body)
    assert tokens == custom_ref.tokens(body)
    # The template writes "<s>" itself; the prompt still starts with exactly one BOS.
    assert tokens[0] == vocab.bos and tokens[1] != vocab.bos
    if "tools" in body:
        # The tools in the system turn, the call's arguments as an object.
        assert 'get_weather{"type": "object"' in text and 'call get_weather {"city": "Paris"}' in text
        assert "<|tool|>sunny, 20 C<|end|>" in text
    else:
        system = body["messages"][0]["content"] if len(body["messages"]) > 1 else "You are a test assistant."
        assert text.startswith(f"<|system|>{system}<|end|>")


def test_raise_exception_is_a_clear_error_and_the_conversation_is_kept(custom_session, custom_ref):
    twice = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(TemplateRefused, match="refused the conversation: Conversation roles must alternate"):
        template_for(custom_session.model).render(twice)
    r = custom_ref.post("/apply-template", {"messages": twice})   # llama.cpp refuses it too
    assert r.status_code == 400 and "Conversation roles must alternate" in r.text
    chat = Conversation(custom_session)
    chat.messages = [{"role": "user", "content": "a"}]
    with pytest.raises(TemplateRefused):
        chat.ask("b", GenOptions(max_tokens=2, sampling=SamplingParams()))
    assert chat.messages == [{"role": "user", "content": "a"}]


def test_server_refusal_is_a_400_and_tool_turns_are_accepted(tmp_path, custom_model):
    data = tmp_path / "data"
    data.mkdir()
    with AppServer(data, nctx=512, allow_paths=True) as s:
        r = s.chat({"model": str(custom_model), "max_tokens": 2,
                    "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
        assert r.status_code == 400, r.text
        assert "Conversation roles must alternate user/assistant" in r.json()["error"]["message"]
        r = s.chat({"model": str(custom_model), "max_tokens": 2, "messages": TOOL_TURNS, "tools": TOOLS})
        assert r.status_code == 200, r.text
        r = s.chat({"model": str(custom_model), "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
                    "chat_template_kwargs": "not an object"})
        assert r.status_code == 400, r.text
    assert "Traceback" not in s.stderr
    # Which template was used is logged once for the loaded model.
    assert s.stderr.count("chat template: the model's own") == 1, s.stderr


# -- the same greedy answer ----------------------------------------------------------------

QUESTIONS = ["Name the capital of France.", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def reference_answers(demo_ref):
    """llama.cpp's server's greedy answers (48 tokens at most) to QUESTIONS."""
    out = {}
    for q in QUESTIONS:
        r = demo_ref.post("/v1/chat/completions", {"messages": [{"role": "user", "content": q}],
                                                   "max_tokens": 48, "temperature": 0})
        assert r.status_code == 200, r.text
        out[q] = r.json()
    return out


def answer_tokens(ref):
    # llama.cpp's server counts the end-of-generation token in completion_tokens; geniex
    # counts the answer's tokens only.
    n = ref["usage"]["completion_tokens"]
    return n - 1 if ref["choices"][0]["finish_reason"] == "stop" else n


def test_infer_greedy_answer_equals_llamacpp_server(cli, reference_answers):
    # One question through the CLI (a process start and a model load): the server test
    # below asks both through the same engine.
    question = QUESTIONS[0]
    ref = reference_answers[question]
    # The prompt decodes on the answer's q8_0 cache as the reference's does (read in F16 by
    # default, its cells are rounded otherwise, and an answer may part at a near-tie).
    proc = cli("infer", "-p", question, "--max-tokens", 48, "--verbose", "--prompt-kv", "none")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ref["choices"][0]["message"]["content"] + "\n"
    assert f"prompt tokens:  {ref['usage']['prompt_tokens']} " in proc.stderr
    assert f"decode tokens:  {answer_tokens(ref)} " in proc.stderr
    assert "KV cache q8_0/q8_0; prompts decoded on it (--prompt-kv none)" in proc.stderr
    # --verbose says which template was used, once.
    assert proc.stderr.count("chat template:") == 1
    assert "chat template: the model's own (tokenizer.chat_template), rendered with Jinja2" in proc.stderr


def test_server_greedy_answers_equal_llamacpp_server(tmp_path, reference_answers):
    data = tmp_path / "data"
    data.mkdir()
    with AppServer(data, defaults=Defaults(nctx=4096, prompt_kv="none")) as s:     # as the infer test
        for question, ref in reference_answers.items():
            r = s.chat({"model": "demo/SmolLM2-135M-Instruct:Q4_1", "max_tokens": 48,
                        "messages": [{"role": "user", "content": question}]})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
            assert body["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
            assert body["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]
            assert body["usage"]["completion_tokens"] == answer_tokens(ref)
    assert s.stderr.count("chat template: the model's own") == 1, s.stderr


# -- llama.cpp's built-in formats: no template, or one Jinja cannot render ------------------

@pytest.fixture(scope="module")
def bare_model(tmp_path_factory):
    """The tiny target without any chat template."""
    return tiny_gemma4.write_target(tmp_path_factory.mktemp("bare") / "bare.gguf", chat_template=False)


def test_no_template_is_chatml_as_in_llamacpp_server(bare_model, cli):
    s = Session(bare_model, LoadOptions(nctx=512))
    try:
        template = template_for(s.model)
        assert template.kind == "builtin" and "has none" in template.note
        body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
        text, tokens = ours(s, body)
        assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        with Reference(bare_model) as ref:
            assert text == ref.prompt(body)
            assert tokens == ref.tokens(body)
    finally:
        s.close()
    proc = cli("infer", bare_model, "-p", "Hi", "--max-tokens", 4, "--verbose")
    assert proc.returncode == 0, proc.stderr
    # Said once (the engine logs it; the CLI does not print it again).
    assert proc.stderr.count("chat template:") == 1, proc.stderr
    assert "the model has none; using llama.cpp's built-in chatml format" in proc.stderr


@pytest.mark.parametrize("source, why", [
    ("<start_of_turn>{% for m in messages %}{{ m.content }", "does not compile"),      # syntax error
    ("<start_of_turn>{{ no_such_thing.method() }}", "failed in Jinja2"),               # fails at render
])
def test_template_jinja_cannot_render_uses_the_builtin_family(tmp_path, caplog, source, why):
    path = with_template(tiny_gemma4.write_target(tmp_path / "base.gguf", chat_template=False),
                         tmp_path / "broken.gguf", source)
    s = Session(path, LoadOptions(nctx=512))
    try:
        with caplog.at_level("INFO", logger="geniex.engine"):
            text = template_for(s.model).render([{"role": "user", "content": "Hi"}])
        # "<start_of_turn>" is how llama.cpp recognises the gemma family.
        assert text == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        assert any(why in r.getMessage() and r.levelname == "WARNING" for r in caplog.records), caplog.text
    finally:
        s.close()


def test_template_nothing_can_render_is_a_clear_error(tmp_path):
    path = with_template(tiny_gemma4.write_target(tmp_path / "base.gguf", chat_template=False),
                         tmp_path / "broken.gguf", "{{ no_such_thing.method() }}")
    s = Session(path, LoadOptions(nctx=512))
    try:
        with pytest.raises(GenieXError, match="chat template failed .*UndefinedError.*no built-in format"):
            template_for(s.model).render([{"role": "user", "content": "Hi"}])
    finally:
        s.close()


# A template without a system turn (Gemma-2 and some Mistral templates refuse one).
NO_SYSTEM_TEMPLATE = """\
{%- if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}
{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}
"""


def test_template_without_system_turn_gets_it_in_the_user_message_as_in_llamacpp_server(tmp_path, cli):
    path = with_template(tiny_gemma4.write_target(tmp_path / "base.gguf", chat_template=False),
                         tmp_path / "nosys.gguf", NO_SYSTEM_TEMPLATE)
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]}
    s = Session(path, LoadOptions(nctx=512))
    try:
        text, tokens = ours(s, body)
        assert text == "<|user|>Be brief.\nHi<|end|>\n<|assistant|>Hello<|end|>\n<|user|>Bye<|end|>\n<|assistant|>"
        with Reference(path) as ref:
            assert text == ref.prompt(body)
            assert tokens == ref.tokens(body)
    finally:
        s.close()
    proc = cli("infer", path, "-s", "Be brief.", "-p", "Hi", "--max-tokens", 3)
    assert proc.returncode == 0, proc.stderr
