"""The identity bench shared by test_identity_constrained and test_identity_long (see
tests/support/identity.py): loaded once per run, so that its prompt is prefilled once
for every method, free text and constrained."""
import pytest

from geniex.speculative.options import SpecOptions
from identity import AT_DEFAULTS, LAYOUT, Bench, fixed, inventory_line, inventory_tokens


@pytest.fixture(scope="session")
def long_bench(demo_model):
    """A speculative session at the shipped defaults (every core, q8_0 KV cache), nctx
    2048, loaded as ngram-mod at its defaults, the other methods drafting fixed lengths
    (draft-simple with the demo model drafting for itself: greedy, its drafts are
    accepted whole, so accepted runs are verified past 512 and 1,024; a draft that is
    mostly rejected, tried, made every answer take a verify step per token and cost more
    than its cheaper prefill saved);
    the plain references are its own answers with ``speculative=False`` on the prompt it
    holds (the ~1,000-token prefill is the costliest part of these tests: one load and one
    prefill for both sides, see tests/support/identity.py)."""
    bench = Bench(demo_model, 2048, AT_DEFAULTS, SpecOptions(types=("ngram-mod",)),
                  lambda method: fixed(method, demo_model), separate_plain=False)
    bench.check_defaults()
    bench.size_by_quiet_curve()             # ngram-mod at its defaults: a quiet machine's curve
    yield bench
    bench.close()


@pytest.fixture(scope="session")
def long_prompts(long_bench):
    """The inventory ending where :data:`identity.LAYOUT` says, before 512 and before
    1,024: the shorter is the start of the longer."""
    tokens = inventory_tokens(long_bench.spec, max(n for n, _ in LAYOUT.values()), inventory_line)
    return {name: tokens[:n] for name, (n, _) in LAYOUT.items()}
