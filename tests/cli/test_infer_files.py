"""``geniex infer --stop-file``, ``-t/--token-file`` and ``--think``, as a subprocess.

Any model does for what these flags do, so the runs load a tiny generated model
(tests/support/tiny_gemma4.py: a load and an answer cost a fraction of the demo model's),
and each answer a flag must change is made in process first, on the same model through
the session ``geniex infer`` opens (geniex.api)."""
import pytest
import tiny_gemma4
import tool_templates

import geniex.api as gx
from geniex.cli.infer import read_token_file
from geniex.engine import tasks
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams

PROMPT = "Count from one to ten in words, separated by commas."


def answer_of(proc):
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.rstrip("\n")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """The tiny model; its end-of-sequence row zeroed, so answers run to their limit."""
    return tiny_gemma4.write_target(tmp_path_factory.mktemp("tiny") / "tiny.gguf", eos_boost=0.0)


@pytest.fixture(scope="module")
def tiny_session(tiny_model):
    session = gx.load(str(tiny_model), nctx=512)
    yield session
    session.close()


def chat_answer(session, prompt, max_tokens, **template_kwargs):
    """The greedy answer ``geniex infer MODEL -p PROMPT`` gives, made in process."""
    session.reset()
    conv = gx.chat(session)
    conv.template_kwargs = template_kwargs or None
    return "".join(step.text for step in conv.ask(prompt, GenOptions(max_tokens=max_tokens,
                                                                      sampling=SamplingParams())))


def test_stop_file_stops_at_any_of_its_lines(cli, tmp_path, tiny_model, tiny_session):
    full = chat_answer(tiny_session, PROMPT, 16)
    # A piece of the answer that first occurs after its start stops it.
    at = next(i for i in range(4, len(full) - 3) if full.index(full[i:i + 3]) == i and full[i:i + 3].strip())
    stop = full[at:at + 3]
    stops = tmp_path / "stops.txt"
    stops.write_text(f"no such text\n\n{stop}\n")
    cut = answer_of(cli("infer", tiny_model, "-p", PROMPT, "--max-tokens", "16", "--stop-file", stops))
    assert cut == full[:full.index(stop)].rstrip("\n"), (cut, full, stop)


def test_stop_file_errors_say_which_file(cli, tmp_path):
    p = cli("infer", "-p", "Hi", "--stop-file", tmp_path / "missing.txt")
    assert p.returncode == 2 and "--stop-file" in p.stderr and "missing.txt" in p.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    p = cli("infer", "-p", "Hi", "--stop-file", empty)
    assert p.returncode == 2 and "no stop strings" in p.stderr


def test_token_file_is_a_raw_prompt(cli, tmp_path, tiny_model, tiny_session):
    session = tiny_session
    session.reset()
    tokens = session.vocab.tokenize("The capital of France is", add_special=session.vocab.add_bos)
    task = tasks.CompletionTask(tokens, GenOptions(max_tokens=12, sampling=SamplingParams()))
    expected = "".join(e.text for e in tasks.run(session, task) if isinstance(e, tasks.Piece))
    # A chat answer would start otherwise: the file's tokens are the whole prompt.
    assert expected != chat_answer(session, "The capital of France is", 12)
    path = tmp_path / "prompt.tokens"
    path.write_text(", ".join(map(str, tokens)) + "\n")
    assert answer_of(cli("infer", tiny_model, "-t", path, "--max-tokens", "12")) == expected
    path.write_text(str(tokens))                      # a JSON list reads the same (the CLI's reader)
    assert read_token_file(path) == tokens


def test_token_file_errors(cli, tmp_path, tiny_model):
    path = tmp_path / "bad.tokens"
    path.write_text("1 two 3")
    p = cli("infer", "-t", path)
    assert p.returncode == 2 and "'two' is not a token id" in p.stderr
    path.write_text("1 99999999")
    p = cli("infer", tiny_model, "-t", path)
    assert p.returncode == 2 and "99999999 is not a token id of this model" in p.stderr
    path.write_text("1 2")
    p = cli("infer", "-t", path, "-p", "Hi")
    assert p.returncode == 2 and "without -p" in p.stderr


def test_think_reaches_the_template(cli, tmp_path, tiny_model):
    # The qwen3 template (tests/support/tool_templates.py, here on the tiny model) writes
    # an empty thinking block after the prompt when thinking is off, so --no-think changes
    # the prompt (and so the answer); --think leaves it as the template's default. Both
    # answers are made in process first, then each flag's CLI answer must be its own one.
    model = tool_templates.demo_with_template(tiny_model, tmp_path / "tiny-qwen3.gguf", "qwen3")
    session = gx.load(str(model), nctx=512)
    try:
        default = chat_answer(session, "Say hi.", 8)
        no_think = chat_answer(session, "Say hi.", 8, enable_thinking=False)
    finally:
        session.close()
    assert default != no_think                  # else the flags could not be told apart
    assert answer_of(cli("infer", model, "-p", "Say hi.", "--max-tokens", "8", "--think")) == default
    assert answer_of(cli("infer", model, "-p", "Say hi.", "--max-tokens", "8", "--no-think")) == no_think
