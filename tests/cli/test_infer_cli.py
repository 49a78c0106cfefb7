"""`geniex infer` driven as a subprocess, as a user would."""
import os
import re
import signal
import subprocess
import sys

import pytest
import tiny_gemma4

from shared_fixtures import ROOT

PROFILE_LINE = re.compile(r"^— [\d.]+ tok/s • \d+ tok • [\d.]+ s first token( • \d+% accept)? —$", re.M)


def stop_reason(stderr):
    m = re.search(r"^stop reason:\s+(\S+)", stderr, re.M)
    return m and m.group(1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny generated model (tests/support/tiny_gemma4.py) for the runs where any model
    does: its load and answers cost a fraction of the demo model's. Its end-of-sequence
    row is zeroed (``eos_boost=0``) so that answers run until a limit stops them."""
    return tiny_gemma4.write_target(tmp_path_factory.mktemp("tiny") / "tiny.gguf", eos_boost=0.0)


def test_one_shot_answer_with_profile_line_and_no_library_log(cli, tiny_model):
    proc = cli("infer", tiny_model, "-p", "Why is the sky blue?", "--max-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert PROFILE_LINE.search(proc.stderr) and " • 12 tok • " in proc.stderr, proc.stderr
    # llama.cpp's own log is silent by default (--log shows it: the test below).
    assert "llama_model_loader" not in proc.stderr and "llama.cpp" not in proc.stderr


@pytest.fixture(scope="module")
def paris(tmp_path_factory, calibration_cache):
    """One --verbose demo answer to a question read from a file (-i) with a system prompt
    (-s), shared by the two tests below: each asserts on its own part of the run."""
    import shutil
    d = tmp_path_factory.mktemp("paris")
    shutil.copyfile(calibration_cache, d / "calibration.json")
    (d / "q.txt").write_text("What is the capital of France?")
    env = {**os.environ, "GENIEX_DATADIR": str(d), "PYTHONUNBUFFERED": "1"}
    env.pop("GENIEX_LOG", None)
    return subprocess.run([sys.executable, "-m", "geniex", "infer", "-i", str(d / "q.txt"), "-s", "Answer in one word.",
                           "--verbose", "--max-tokens", "16"], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_greedy_paris_and_verbose_block(paris):
    proc = paris
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout and "Traceback" not in proc.stderr
    for label in ("total time:", "ttft:", "prompt tokens:", "prompt speed:", "decode tokens:",
                  "decode speed:", "stop reason:"):
        assert label in proc.stderr
    assert stop_reason(proc.stderr) == "eos"
    assert "compute: cpu" in proc.stderr          # --verbose says which device was chosen
    assert "KV cache q8_0/q8_0; prompts read in an F16 cache" in proc.stderr     # --prompt-kv f16, the default
    assert "draft accept" not in proc.stderr       # no drafts, no accept line


def test_stop_reasons_through_the_cli(cli, tiny_model):
    # (The tiny model where any model does; "Paris" is the demo model's answer.)
    proc = cli("infer", tiny_model, "-p", "Count from 1 to 50.", "--max-tokens", "5", "--verbose")
    assert stop_reason(proc.stderr) == "length"
    proc = cli("infer", "-p", "Name the capital of France.", "--stop", "Paris", "--verbose")
    assert stop_reason(proc.stderr) == "stop_sequence" and "Paris" not in proc.stdout
    # --nctx 64 (llama.cpp rounds the context up to 256 cells) and a counting prompt of
    # 245 tokens (the tiny vocab spells most characters as bytes): the context fills after
    # a few answer tokens, not hundreds.
    counting = ", ".join(str(i) for i in range(1, 59))
    proc = cli("infer", tiny_model, "-p", f"Continue: {counting},", "--nctx", "64", "--verbose")
    assert stop_reason(proc.stderr) == "context_length", proc.stderr
    assert int(re.search(r"^decode tokens:\s+(\d+)", proc.stderr, re.M).group(1)) < 64, proc.stderr


def test_input_file_and_system_prompt(cli, tmp_path, paris):
    # The question came from the file (the shared run's answer names Paris); a file that
    # is missing is one line.
    assert paris.returncode == 0 and "Paris" in paris.stdout, paris.stderr
    proc = cli("infer", "-i", tmp_path / "missing.txt")
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1 and "missing.txt" in proc.stderr


def test_interactive_session_over_stdin_two_turns(cli, tiny_model):
    proc = cli("infer", tiny_model, "--max-tokens", "16", "--verbose",
               input="My name is Alice. Remember it.\nWhat is my name?\n/bye\n")
    assert proc.returncode == 0, proc.stderr
    # Two answers, each followed by its profile block. The second prompt holds the whole
    # conversation (first question and answer), and only its new tokens were decoded.
    assert proc.stderr.count("stop reason:") == 2
    prompts = [int(n) for n in re.findall(r"^prompt tokens:\s+(\d+)", proc.stderr, re.M)]
    answers = [int(n) for n in re.findall(r"^decode tokens:\s+(\d+)", proc.stderr, re.M)]
    reused = re.findall(r"\((\d+) reused from cache\)", proc.stderr)
    assert prompts[1] > prompts[0] + answers[0]
    assert len(reused) == 1 and int(reused[0]) >= prompts[0] + answers[0] - 8


def test_ctrl_c_ends_the_answer_not_the_session(data_dir):
    env = {**os.environ, "GENIEX_DATADIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "geniex", "infer", "--verbose", "--max-tokens", "2000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=ROOT)
    p.stdin.write("Write a very long story about the sea.\n")
    p.stdin.flush()
    first = p.stdout.read(20)                 # the answer is streaming
    assert first
    p.send_signal(signal.SIGINT)
    seen = []                                 # the first answer's profile: it has ended
    while not (seen and seen[-1].startswith("stop reason:")):
        line = p.stderr.readline()
        assert line, "".join(seen)
        seen.append(line)
    p.stdin.write("What is the capital of France?\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=120)
    err = "".join(seen) + err
    assert p.returncode == 0, err
    reasons = re.findall(r"^stop reason:\s+(\S+)", err, re.M)
    assert reasons[0] == "user" and len(reasons) == 2
    assert "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["infer", "/nonexistent/model.gguf", "-p", "hi"], "no such file"),
    (["infer", "{notgguf}", "-p", "hi"], "not a GGUF"),
    (["infer", "{truncated}", "-p", "hi"], "truncated"),
    (["infer", "-p", "hi", "--compute", "quantum"], "unknown device quantum"),
    (["infer", "-p", "hi", "--compute", "npu"], "no NPU"),
    (["infer", "-p", "hi", "--nctx", "0"], "--nctx must be at least 1"),
    (["infer", "-p", "hi", "--temperature", "hot"], "--temperature takes a number"),
    (["infer", "-p", "hi", "--bogus-flag"], "unrecognized arguments"),
])
def test_bad_input_is_one_clear_line(cli, tmp_path, args, message):
    (tmp_path / "notgguf.gguf").write_text("this is not a model")
    if "{truncated}" in args:
        # The first third of a tiny model (its tensor data cut, as a broken download of any
        # model has it; the demo model's third was 33 MB to copy), only where asked for.
        import tiny_gemma4
        whole = tiny_gemma4.write_target(tmp_path / "whole.gguf").read_bytes()
        (tmp_path / "truncated.gguf").write_bytes(whole[:len(whole) // 3])
    args = [a.format(notgguf=tmp_path / "notgguf.gguf", truncated=tmp_path / "truncated.gguf") for a in args]
    proc = cli(*args)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip() and not l.startswith("(see")]
    assert len(lines) == 1, proc.stderr
    assert "GGML_ASSERT" not in proc.stderr and "backtrace" not in proc.stderr.lower()


def test_version_names_the_library(cli):
    proc = cli("--version")
    assert proc.returncode == 0
    assert "geniex 0." in proc.stdout and "xllamacpp" in proc.stdout and "b11549" in proc.stdout
    assert "system info:" in proc.stdout


def test_llama_cpp_log_is_shown_with_log_or_geniex_log(cli, tiny_model):
    # Silent by default: checked on the one-shot answer's run above.
    loud = cli("infer", tiny_model, "-p", "hi", "--max-tokens", "2", "--log", "info")
    assert "geniex.llama.cpp: llama_model_loader" in loud.stderr
    env = cli("infer", tiny_model, "-p", "hi", "--max-tokens", "2", env={"GENIEX_LOG": "debug"})
    assert "llama_model_loader" in env.stderr
    bad = cli("infer", "-p", "hi", "--log", "loud")
    assert bad.returncode == 2 and "unknown log level" in bad.stderr
