"""Issue 12 regressions of the CLI: the context limit before the library allocates, and
a draft vocabulary larger than the target's (real tiny GGUF models from tools/)."""
import tiny_gemma4

from geniex.speculative.options import FALLBACK


def test_infer_refuses_a_context_beyond_the_memory_budget_before_loading(cli):
    p = cli("infer", "--nctx", "8192", "-p", "Hi", "--max-tokens", "2", env={"GENIEX_MEMORY_BUDGET": "16M"})
    assert p.returncode == 2, p.stderr
    assert "memory budget of 16 MiB" in p.stderr and "use at most" in p.stderr
    assert "llama_context" not in p.stderr          # refused before a context was made


def test_a_draft_vocabulary_larger_than_the_targets_falls_back(cli, tmp_path):
    target = tiny_gemma4.write_llama(tmp_path / "target-256.gguf", vocab_size=256)
    draft = tiny_gemma4.write_llama(tmp_path / "draft-320.gguf", seed=5, vocab_size=320)
    p = cli("infer", target, "--spec-type", "draft-simple", "--draft-model", draft, "-p", "hello world",
            "--max-tokens", "16", "--seed", "1", "--temperature", "0")
    assert p.returncode == 0, p.stderr
    assert FALLBACK in p.stderr and "320 tokens, more than the target's 256" in p.stderr, p.stderr
    assert "llama_decode failed" not in p.stderr
