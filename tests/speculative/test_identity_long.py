"""Identity past the positions where CPU kernels change paths, at the DEFAULT settings.

ggml's CPU flash attention splits a one-row decode's keys per thread once the KV window
reaches 512 cells when K/V are F16 (docs/speculative.md, "Identical output"); that is
where every-core decoding used to stop being bitwise equal to verify rows. These tests
run every drafting method at the shipped defaults (every physical core for one-row
decodes and batches, q8_0 KV cache) with answers that start before position 512 and
1,024 and run 16 tokens past it (identity.LAYOUT), greedy and seeded, and require the plain
answer token for token.

The session is the identity bench (tests/support/identity.py, tests/speculative/
conftest.py), shared with test_identity_constrained: the 1,020-token inventory is
prefilled once, and every answer, plain (``speculative=False``) and speculative, reuses
it from the KV cache (the shorter prompt is its start), as ``geniex infer`` does when
asked again. Every answer to the longer prompt comes first (the tests of each
position run in file order), so that no answer to the shorter one makes the longer
prefilled again. Each answer's first token is still decoded by a verify step.
"""
import pytest

from identity import AT_DEFAULTS, LAYOUT, METHODS, SAMPLINGS, THREADS, first_difference, gen_options
from geniex.engine.session import LoadOptions, Session
from geniex.speculative.options import SpecOptions

# The identity of speculative output on every core (tests/support/parallel.py).
pytestmark = pytest.mark.all_cores


def check_method(bench, prompts, pname, method):
    """``method``'s answers to ``pname``, greedy and seeded, are the plain ones; each drafted."""
    tokens, answer = prompts[pname], LAYOUT[pname][1]
    boundary = int(pname.split("-")[1])
    for sname in SAMPLINGS:
        want = bench.reference((pname, sname), tokens, gen_options(answer, sname)).tokens
        assert len(want) == answer and len(tokens) < boundary < len(tokens) + len(want)
        gen = bench.answer(method, tokens, gen_options(answer, sname))
        first = first_difference(gen.tokens, want)
        assert gen.tokens == want, (f"{pname}, {sname}: differs from plain at answer token {first} "
                                    f"(position {len(tokens) + (first or 0)})")
        assert gen.stats.drafted > 0, f"{pname}, {sname}: the method never drafted: the test would prove nothing"
        # Drafts were verified beyond the boundary (a verify row at position >= boundary).
        assert any(s.drafted and s.n_past + len(s.drafted) >= boundary for s in gen.steps), \
            f"{pname}, {sname}: no draft verified past position {boundary}"


@pytest.mark.parametrize("method", METHODS + [AT_DEFAULTS])
def test_every_method_is_plain_decoding_past_1024(long_bench, long_prompts, method):
    check_method(long_bench, long_prompts, "past-1024", method)


@pytest.mark.parametrize("method", METHODS + [AT_DEFAULTS])
def test_every_method_is_plain_decoding_past_512(long_bench, long_prompts, method):
    check_method(long_bench, long_prompts, "past-512", method)


@pytest.fixture(scope="module")
def q4_0_answers(demo_q4_0, long_prompts):
    """An ngram-mod session (fixed draft lengths) on the Q4_0 copy at the defaults, and
    its plain answers (``speculative=False``) to the past-1,024 prompt, greedy and seeded:
    ``(session, {sampling name: tokens})``.

    One context prefills the prompt, from an empty cache, and every answer reuses it
    (plain and speculative sessions of the same load prefill the same bits; a second
    session cost a load and a second 1,020-token prefill). What this test is about is the
    Q4_0 weights' verify rows against their one-row decodes; that a speculative load sets
    up its context as a plain one does is proved by test_speculative.py's two sessions. The
    plain answers are made first, so that no speculative answer has run on the context
    before the references."""
    s = Session(demo_q4_0, LoadOptions(nctx=2048, threads=THREADS, threads_batch=THREADS,
                                       spec=SpecOptions(types=("ngram-mod",), policy="fixed")))
    try:
        assert s.speculative and s.threads >= 2 and s.options.cache_type_k == s.options.cache_type_v == "q8_0"
        tokens = long_prompts["past-1024"]
        want = {}
        for sname in SAMPLINGS:
            gen = s.generate(tokens, gen_options(LAYOUT["past-1024"][1], sname), speculative=False)
            gen.run()
            assert gen.stats.drafted == 0 and len(tokens) + len(gen.tokens) > 1024
            want[sname] = gen.tokens
            if sname == "greedy":
                assert gen.stats.prompt_reused == 0       # the repacked weights' prefill
        yield s, want
    finally:
        s.close()


@pytest.mark.parametrize("sname", SAMPLINGS)
def test_q4_0_weights_past_1024(q4_0_answers, long_prompts, sname):
    """The tutorial's weight format (Q4_0, repacked on this CPU) at the defaults: the
    speculative answer is the plain one, past position 1,024."""
    session, want = q4_0_answers
    gen = session.generate(long_prompts["past-1024"], gen_options(LAYOUT["past-1024"][1], sname))
    steps = list(gen)
    first = first_difference(gen.tokens, want[sname])
    assert gen.tokens == want[sname], f"{sname}: differs from plain at answer token {first}"
    assert gen.stats.prompt_reused > 0
    assert any(s.drafted and s.n_past + len(s.drafted) >= 1024 for s in steps), "no draft verified past 1,024"
