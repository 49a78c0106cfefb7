"""``--chat-template NAME|FILE`` (``serve``, also ``--chat-template-file``; ``infer``;
``geniex.api.load``): one of llama.cpp's built-in formats or a Jinja template in place of
the model's own, checked before anything loads; and a model without a template gets its
architecture's built-in format where the family has one."""
import pytest

from geniex.engine.chat import ARCH_TEMPLATES, template_choice
from geniex.errors import UsageError
from geniex.llama.chat_template import builtin_names
from geniex.server.placement import Defaults
from serverproc import DEMO, AppServer, chat_body

MESSAGES = [{"role": "user", "content": "What is today?"}]
JINJA = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_a_choice_is_a_builtin_name_or_jinja_and_anything_else_is_refused_naming_the_flag(tmp_path):
    assert template_choice("llama3") == "llama3" and template_choice(None) is None
    path = tmp_path / "t.jinja"
    path.write_text(JINJA)
    assert template_choice(str(path)) == JINJA == template_choice(JINJA)
    with pytest.raises(UsageError, match=r"--chat-template nope: neither .*chatml.* nor a Jinja template file"):
        template_choice("nope")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in %}")
    with pytest.raises(UsageError, match="--chat-template-file .*broken.jinja: not a Jinja template"):
        template_choice(str(broken), "--chat-template-file")
    # Every architecture's fallback is a format this library has.
    assert set(ARCH_TEMPLATES.values()) <= set(builtin_names())


@pytest.mark.parametrize("choice, opening, ending", [
    ("llama3", "<|start_header_id|>user<|end_header_id|>\n\nWhat is today?<|eot_id|>",
     "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("file", "[user] What is today?\n", "[assistant] "),
])
def test_a_server_renders_every_chat_with_its_chat_template(tmp_path, choice, opening, ending):
    if choice == "file":
        choice = tmp_path / "t.jinja"
        choice.write_text(JINJA)
    with AppServer(tmp_path / "data", parallel=1, defaults=Defaults(chat_template=template_choice(str(choice)))) as s:
        prompt = s.post("/apply-template", {"model": DEMO, "messages": MESSAGES}).json()["prompt"]
        assert opening in prompt and prompt.endswith(ending) and "<|im_start|>" not in prompt
        r = s.chat(chat_body("What is today?", max_tokens=2))
        assert r.status_code == 200, r.text
        tokens = s.post("/tokenize", {"model": DEMO, "content": prompt, "parse_special": True}).json()["tokens"]
        assert r.json()["usage"]["prompt_tokens"] == len(tokens)       # the answer read that prompt


def test_infer_takes_a_builtin_name_and_says_so_and_refuses_an_unknown_one(cli):
    proc = cli("infer", "-p", "What is today?", "--chat-template", "gemma", "--max-tokens", "2", "--verbose")
    assert "chat template: llama.cpp's built-in gemma format (--chat-template)" in proc.stderr
    bad = cli("infer", "-p", "Hi", "--chat-template", "gemma-9", check_clean=False)
    assert bad.returncode != 0 and "--chat-template gemma-9: neither one of llama.cpp's built-in" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_serve_refuses_a_missing_template_file_before_it_listens(cli, tmp_path):
    proc = cli("serve", "--host", "127.0.0.1:0", "--chat-template-file", tmp_path / "none.jinja",
               check_clean=False, timeout=60)
    assert proc.returncode != 0 and "--chat-template-file" in proc.stderr and "no such file" in proc.stderr


THINKS = ("{% if not enable_thinking %}[thinking off]{% endif %}[{{ date_string }}]"
          "{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.mark.parametrize("reasoning", ["auto", "off"])
def test_templates_get_llama_servers_variables_and_serve_reasoning_sets_thinking(tmp_path, reasoning):
    """As llama-server: thinking on unless --reasoning off (a request's own
    enable_thinking wins), and today's date as date_string (Llama 3.x prints it)."""
    import datetime
    defaults = Defaults(chat_template=template_choice(THINKS), reasoning=reasoning)
    with AppServer(tmp_path / "data", parallel=1, defaults=defaults) as s:
        def prompt(**kw):
            return s.post("/apply-template", {"model": DEMO, "messages": MESSAGES, **kw}).json()["prompt"]
        today = datetime.date.today().strftime("%d %b %Y")
        assert prompt() == ("[thinking off]" if reasoning == "off" else "") + f"[{today}]What is today?"
        assert prompt(chat_template_kwargs={"enable_thinking": True}).startswith(f"[{today}]")
        assert prompt(chat_template_kwargs={"enable_thinking": False}).startswith("[thinking off]")
