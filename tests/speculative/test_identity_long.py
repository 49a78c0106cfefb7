"""Identity past the positions where CPU kernels change paths, at the DEFAULT settings.

ggml's CPU flash attention splits a one-row decode's keys per thread once the KV window
reaches 512 cells when K/V are F16 (docs/speculative.md, "Identical output"); that is
where every-core decoding used to stop being bitwise equal to verify rows. These tests
run every drafting method at the shipped defaults (every physical core for one-row
decodes and batches, q8_0 KV cache) with answers that start 16 tokens before position
512 and before 1,024 and run 16 tokens past it, greedy and seeded, and require the plain
answer token for token.

The sessions are the identity bench (tests/support/identity.py, tests/speculative/
conftest.py), shared with test_identity_constrained: the 1,008-token inventory is
prefilled once by the plain session and once by the speculative one, and every answer
reuses it from the KV cache (the shorter prompt is its start), as ``geniex infer`` does
when asked again. Every answer to the longer prompt comes first (the tests of each
position run in file order), so that no answer to the shorter one makes the longer
prefilled again. Each answer's first token is still decoded by a verify step.
"""
import pytest

from identity import AT_DEFAULTS, MARGIN, METHODS, SAMPLINGS, THREADS, first_difference, gen_options
from geniex.engine.session import LoadOptions, Session
from geniex.speculative.options import SpecOptions

ANSWER = 2 * MARGIN


def check_method(bench, prompts, pname, method):
    """``method``'s answers to ``pname``, greedy and seeded, are the plain ones; each drafted."""
    tokens = prompts[pname]
    boundary = int(pname.split("-")[1])
    for sname in SAMPLINGS:
        want = bench.reference((pname, sname), tokens, gen_options(ANSWER, sname)).tokens
        assert len(want) == ANSWER and len(tokens) < boundary < len(tokens) + len(want)
        gen = bench.answer(method, tokens, gen_options(ANSWER, sname))
        first = first_difference(gen.tokens, want)
        assert gen.tokens == want, (f"{pname}, {sname}: differs from plain at answer token {first} "
                                    f"(position {len(tokens) + (first or 0)})")
        assert gen.stats.drafted > 0, f"{pname}, {sname}: the method never drafted: the test would prove nothing"


@pytest.mark.parametrize("method", METHODS + [AT_DEFAULTS])
def test_every_method_is_plain_decoding_past_1024(long_bench, long_prompts, method):
    check_method(long_bench, long_prompts, "past-1024", method)


@pytest.mark.parametrize("method", METHODS + [AT_DEFAULTS])
def test_every_method_is_plain_decoding_past_512(long_bench, long_prompts, method):
    check_method(long_bench, long_prompts, "past-512", method)


@pytest.fixture(scope="module")
def q4_0_pair(demo_q4_0):
    """Plain and ngram-mod sessions on the Q4_0 copy, loaded once for both samplings."""
    plain = Session(demo_q4_0, LoadOptions(nctx=2048, threads=THREADS, threads_batch=THREADS))
    spec = Session(demo_q4_0, LoadOptions(nctx=2048, threads=THREADS, threads_batch=THREADS,
                                          spec=SpecOptions(types=("ngram-mod",), policy="fixed")))
    yield plain, spec
    spec.close()
    plain.close()


@pytest.mark.parametrize("sname", SAMPLINGS)
def test_q4_0_weights_past_1024(q4_0_pair, long_prompts, sname):
    """The tutorial's weight format (Q4_0, repacked on this CPU) at the defaults. Each
    session prefills the prompt from an empty cache for the first sampling (so the
    repacked weights' multi-row prefill is compared too) and reuses it for the second."""
    tokens = long_prompts["past-1024"]
    out = []
    for s in q4_0_pair:
        if sname == "greedy":
            s.reset(drafts=True)
        gen = s.generate(tokens, gen_options(ANSWER, sname))
        gen.run()
        if sname == "greedy":
            assert gen.stats.prompt_reused == 0
        out.append(gen)
    assert out[0].tokens == out[1].tokens and len(tokens) + len(out[0].tokens) > 1024
    assert out[1].stats.drafted > 0
