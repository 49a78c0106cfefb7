"""``geniex infer --stop-file``, ``-t/--token-file`` and ``--think``, as a subprocess."""
import geniex.api as gx
from geniex.engine import tasks
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams

PROMPT = "Count from one to ten in words, separated by commas."


def answer_of(proc):
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.rstrip("\n")


def test_stop_file_stops_at_any_of_its_lines(cli, tmp_path):
    # (24 tokens: the answer's fifth line starts by then, so its fourth is whole)
    full = answer_of(cli("infer", "-p", PROMPT, "--max-tokens", "24"))
    lines = full.splitlines()
    assert len(lines) >= 4, full
    stop = lines[3]                     # a line of the answer (not its first) stops it
    stops = tmp_path / "stops.txt"
    stops.write_text(f"no such text\n\n{stop}\n")
    cut = answer_of(cli("infer", "-p", PROMPT, "--max-tokens", "24", "--stop-file", stops))
    assert cut == full[:full.index(stop)].rstrip("\n") or cut == full[:full.index(stop)]


def test_stop_file_errors_say_which_file(cli, tmp_path):
    p = cli("infer", "-p", "Hi", "--stop-file", tmp_path / "missing.txt")
    assert p.returncode == 2 and "--stop-file" in p.stderr and "missing.txt" in p.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    p = cli("infer", "-p", "Hi", "--stop-file", empty)
    assert p.returncode == 2 and "no stop strings" in p.stderr


def test_token_file_is_a_raw_prompt(cli, tmp_path, demo_model):
    session = gx.load(str(demo_model), nctx=512)
    try:
        tokens = session.vocab.tokenize("The capital of France is", add_special=session.vocab.add_bos)
        task = tasks.CompletionTask(tokens, GenOptions(max_tokens=12, sampling=SamplingParams()))
        expected = "".join(e.text for e in tasks.run(session, task) if isinstance(e, tasks.Piece))
    finally:
        session.close()
    path = tmp_path / "prompt.tokens"
    path.write_text(", ".join(map(str, tokens)) + "\n")
    assert answer_of(cli("infer", "-t", path, "--max-tokens", "12")) == expected
    path.write_text(str(tokens))                      # a JSON list reads the same
    assert answer_of(cli("infer", "--token-file", path, "--max-tokens", "12")) == expected


def test_token_file_errors(cli, tmp_path):
    path = tmp_path / "bad.tokens"
    path.write_text("1 two 3")
    p = cli("infer", "-t", path)
    assert p.returncode == 2 and "'two' is not a token id" in p.stderr
    path.write_text("1 99999999")
    p = cli("infer", "-t", path)
    assert p.returncode == 2 and "99999999 is not a token id of this model" in p.stderr
    path.write_text("1 2")
    p = cli("infer", "-t", path, "-p", "Hi")
    assert p.returncode == 2 and "without -p" in p.stderr


def test_think_reaches_the_template(cli, tool_models):
    # The qwen3 variant writes an empty thinking block after the prompt when thinking is
    # off, so --no-think changes the prompt (and so the answer); --think leaves it as the
    # template's default. Both answers are made in process first (the session infer opens,
    # through geniex.api), then each flag's CLI answer must be its own one of them.
    model = tool_models["qwen3"]
    session = gx.load(str(model), nctx=512)
    try:
        expected = {}
        for kwargs in ({}, {"enable_thinking": False}):
            conv = gx.chat(session)
            conv.template_kwargs = kwargs or None
            gen = conv.ask("Say hi.", GenOptions(max_tokens=12, sampling=SamplingParams()))
            expected[bool(kwargs)] = "".join(step.text for step in gen)
    finally:
        session.close()
    default, no_think = expected[False], expected[True]
    assert default != no_think                  # else the flags could not be told apart
    assert answer_of(cli("infer", model, "-p", "Say hi.", "--max-tokens", "12", "--think")) == default
    assert answer_of(cli("infer", model, "-p", "Say hi.", "--max-tokens", "12", "--no-think")) == no_think
