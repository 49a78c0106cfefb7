"""Chat templates come from model files: rendering one is bounded in time, output and the
size of every value it builds, and crossing a bound is one clear error."""
import os
import signal
import subprocess
import sys

import jinja2
import pytest

import geniex.api as gx
from geniex.engine import template as template_module
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.template import MAX_TEXT, JinjaTemplate, TemplateLimit, environment
from geniex.llama.gguf_file import read_header
from shared_fixtures import ROOT

import gguf_mutants

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
BOOL = 7                            # GGUF's bool value type (gguf_mutants.SCALARS)
NESTED_LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}hi"


def limit_of(source, messages=CHAT):
    with pytest.raises(TemplateLimit) as caught:
        JinjaTemplate(source).render(messages)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.fixture
def short_deadline(monkeypatch):
    # The mechanism, at a short bound so the test is quick; the shipped bound is checked below.
    monkeypatch.setattr(template_module, "RENDER_SECONDS", 0.2)


@pytest.mark.fast
def test_the_shipped_bounds_are_sane():
    assert 1 <= template_module.RENDER_SECONDS <= 10
    assert 8 << 20 < MAX_TEXT <= 64 << 20          # above the largest request body (8 MiB)


@pytest.mark.fast
@pytest.mark.parametrize("source", [
    NESTED_LOOP,                                                                     # caught at load (a probe)
    "{% if messages|length > 1 %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}{% endif %}",                                                        # caught at render
    "{% macro f(n) %}{% for i in range(100000) %}{% endfor %}{{ f(n) if n < 0 else '' }}{% endmacro %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ f(1) }}{% endfor %}{% endfor %}",
])
def test_an_endless_loop_ends_with_a_clear_error(short_deadline, source):
    message = limit_of(source, CHAT)
    assert "ran for more than 0.2 s" in message   # ended by the bound (10^10 steps never finish)
    assert sys.gettrace() is None                  # the trace function is gone again


@pytest.mark.fast
def test_output_stops_at_the_limit():
    assert "renders text" in limit_of("{% for i in range(100000) %}{{ 'x' * 3000 }}{% endfor %}")


@pytest.mark.fast
@pytest.mark.parametrize("source, words", [
    ("{{ 'x' * 400000000 }}", "repeats text"),
    ("{{ [1] * 400000000 }}", "repeats text"),
    ("{{ 10 ** 100000000 }}", "a number too large"),
    ("{{ '%400000000d' % 1 }}", "asks for a field"),
    ("{{ '%400000000d'|format(1) }}", "asks for a field"),
    ("{{ '{:>400000000}'.format(1) }}", "asks for a field"),
    ("{{ 'x'.center(400000000) }}", "passes a size"),
    ("{{ lipsum(n=100000000) }}", "passes a size"),
    ("{{ [1]|slice(400000000)|list|length }}", "passes a size"),
    ("{{ ('x' * 1000000 + ',')|list|join('y' * 100) }}", "joins text"),
    ("{{ ('y' * 100).join(('x' * 1000000)|list) }}", "joins text"),
    ("{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}", "replaces its way to text"),
    ("{{ ('x' * 1000000).replace('x', 'y' * 1000) }}", "replaces its way to text"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "stored a value"),
    ("{% macro f(s, n) %}{% if n < 40 %}{{ f(s ~ s, n + 1) }}{% endif %}{% endmacro %}{{ f('x', 0) }}",
     "passes a value"),
    ("{{ ('x' * 10000000) + ('x' * 10000000) }}", "joins text"),
])
def test_values_a_template_builds_are_bounded_before_they_are_built(source, words):
    assert words in limit_of(source)


@pytest.mark.fast
def test_an_oversized_template_source_is_refused():
    with pytest.raises(TemplateLimit, match="characters long"):
        JinjaTemplate("x" * (template_module.MAX_SOURCE + 1))


@pytest.mark.fast
def test_real_templates_render_as_plain_jinja_does(demo_model):
    source = read_header(demo_model).metadata["tokenizer.chat_template"]
    messages = [{"role": "user", "content": "hello " * 50}, {"role": "assistant", "content": "yes"}] * 20
    bounded = JinjaTemplate(source).render(messages)
    plain = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    assert bounded == plain.render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="",
                                   tools=None, documents=None)
    assert environment().from_string("{{ 'ab' * 3 }}{{ 2 ** 10 }}{{ '%5d' % 7 }}{{ [1, 2]|join(',') }}") \
        .render() == "ababab1024    71,2"


def hostile_model(tmp_path, source, base=None, add_bos=None):
    """``base`` (default: the tiny Gemma-4 target) with ``source`` as its chat template
    (and ``tokenizer.ggml.add_bos_token`` set to ``add_bos`` unless it is None)."""
    import tiny_gemma4
    base = base or tiny_gemma4.write_target(tmp_path / "base.gguf")
    parsed = gguf_mutants.parse(base)
    changed = {"tokenizer.chat_template": (gguf_mutants.STRING, gguf_mutants.encode_string(source))}
    if add_bos is not None:
        changed["tokenizer.ggml.add_bos_token"] = (BOOL, gguf_mutants.encode_scalar(BOOL, add_bos))
    kvs = [kv for kv in parsed.kvs if kv.key not in changed]
    kvs += [gguf_mutants.KV(key, vtype, raw) for key, (vtype, raw) in changed.items()]
    out = tmp_path / "hostile.gguf"
    gguf_mutants.Mutant(0, "template", "hostile", kvs=kvs).write(parsed, out)
    return out


def test_a_model_file_with_an_endless_template_is_stopped_by_the_bound(short_deadline, tmp_path):
    # What `geniex infer` does with a model (open_session, a Conversation, ask: here through
    # geniex.api, which opens it the same way), in process at the short bound: the template
    # read from the file meets the deadline where infer meets it. How the CLI shows a
    # TemplateLimit (its last line, exit 1) is the 300 MB test's; a SIGTERM during such a
    # loop the last test's.
    model = hostile_model(tmp_path, NESTED_LOOP)
    session = gx.load(str(model), nctx=256)
    try:
        with pytest.raises(TemplateLimit, match=r"^the model's chat template ran for more than 0\.2 s"):
            list(gx.chat(session).ask("hi", GenOptions(max_tokens=4, sampling=SamplingParams())))
    finally:
        session.close()


def test_infer_with_a_300_mb_template_stops_at_the_output_limit(cli, tmp_path):
    model = hostile_model(tmp_path, "{% for i in range(100000) %}{{ 'x' * 3000 }}{% endfor %}")
    proc = cli("infer", model, "-p", "hi", "--max-tokens", "4")
    assert proc.returncode == 1 and "bad_alloc" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: the model's chat template renders text")


def test_a_template_that_renders_nothing_is_a_clear_error(cli, tmp_path):
    # A vocabulary that adds no BOS (as the demo model's): an empty rendering leaves no
    # token to decode. (The tiny model with add_bos_token false: the demo model's 100 MB
    # were rewritten and loaded for this.)
    model = hostile_model(tmp_path, "{% if false %}x{% endif %}", add_bos=False)
    proc = cli("infer", model, "-p", "hi", "--max-tokens", "4")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == ("error: the prompt is empty: the model's chat template "
                                                    "rendered nothing for this conversation")


def test_sigterm_stops_infer_while_a_template_loops(tmp_path, data_dir):
    model = hostile_model(tmp_path, NESTED_LOOP)
    env = {**os.environ, "GENIEX_DATADIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "geniex", "infer", str(model), "-p", "hi", "--verbose"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:              # the model is loaded; the template's probes come next
        if line.startswith("model: "):
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
