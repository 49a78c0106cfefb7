"""``geniex infer --reasoning-budget`` and ``geniex.api.answer(reasoning_budget=...)``:
the same held answer as the server's (tests/server/test_thinking_budget.py proves what a
held answer is); the flags' usage errors."""
import pytest

import geniex.api as gx
import tiny_gemma4
import tool_templates

PROMPT = "Write a short story about a lighthouse keeper and a storm."


def test_infer_holds_the_thoughts_to_the_budget(cli, tmp_path):
    # The think template (its prompt opens <think>) on the tiny generated model: the
    # answer starts inside the block and, free, does not close it within 16 tokens; held
    # to 3, the 4th token starts the closing run (after the message), as the engine's
    # chat task writes it.
    tiny = tiny_gemma4.write_target(tmp_path / "tiny.gguf", eos_boost=0.0)
    model = tool_templates.demo_with_template(tiny, tmp_path / "tiny-think.gguf", "think")
    session = gx.load(str(model), nctx=512)
    try:
        ask = dict(max_tokens=16, reasoning_format="none")
        free = gx.answer(session, [{"role": "user", "content": PROMPT}], **ask)["content"]
        held = gx.answer(session, [{"role": "user", "content": PROMPT}], reasoning_budget=3, **ask)["content"]
        head = gx.answer(session, [{"role": "user", "content": PROMPT}], max_tokens=3, reasoning_format="none")["content"]
    finally:
        session.close()
    assert "</think>" not in free and held.startswith(head + "</think>"), (free, held)
    out = cli("infer", model, "-p", PROMPT, "--max-tokens", "16", "--reasoning-budget", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == held.rstrip("\n")
    message = cli("infer", model, "-p", PROMPT, "--max-tokens", "24", "--reasoning-budget", "0",
                  "--reasoning-budget-message", "Enough.")
    assert message.stdout.startswith("Enough.</think>"), message.stdout


def test_budget_flags_refuse_bad_values(cli):
    bad = cli("infer", "-p", "hi", "--reasoning-budget", "-2")
    assert bad.returncode == 2 and "--reasoning-budget" in bad.stderr
    both = cli("infer", "-p", "hi", "--reasoning-budget", "2", "--json-schema", '{"type": "object"}')
    assert both.returncode == 2 and "--reasoning-budget cannot be combined with --json-schema" in both.stderr
    serve = cli("serve", "--host", "127.0.0.1:0", "--reasoning-budget", "-2", timeout=60)
    assert serve.returncode == 2 and "--reasoning-budget -2" in serve.stderr, serve.stderr


@pytest.mark.fast
def test_run_sends_the_budget_as_a_request_field():
    from geniex.cli import build_parser
    from geniex.cli.run import request_fields
    args = build_parser().parse_args(["run", "demo", "--reasoning-budget", "5"])
    assert request_fields(args, "demo")["thinking_budget_tokens"] == 5
    assert "thinking_budget_tokens" not in request_fields(build_parser().parse_args(["run", "demo"]), "demo")
