"""Identity past the positions where CPU kernels change paths, at the DEFAULT settings.

ggml's CPU flash attention splits a one-row decode's keys per thread once the KV window
reaches 512 cells when K/V are F16 (docs/speculative.md, "Identical output"); that is
where every-core decoding used to stop being bitwise equal to verify rows. These tests
run every drafting method at the shipped defaults (every physical core for one-row
decodes and batches, q8_0 KV cache) with answers that run past position 512 and past
1,024, greedy and seeded, and require the plain answer token for token.

Each session answers the four cases in one fixed sequence without forgetting the
conversation (:func:`answer_all`), as ``geniex infer`` does when asked again: a prompt is
decoded once and its second sampling reuses it from the KV cache, and the longer prompt
extends the shorter. The plain reference runs the same sequence, so both sides fill the
cache the same way, and each answer's first token is still decoded by a verify step.
"""
import pytest

from geniex.config import physical_cores
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import LoadOptions, Session
from geniex.speculative import policy
from geniex.speculative.options import SpecOptions

METHODS = ["ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "draft-simple"]
# ngram-mod as `geniex infer --spec-type ngram-mod` builds it: the auto draft policy sizing
# drafts by each token's probability, memory kept across answers (the other sessions
# draft fixed lengths so that every method surely drafts).
AT_DEFAULTS = "ngram-mod at its defaults"
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=77)}
ANSWER = 48
# The default (every physical core), and at least two threads where the machine has one
# core: the multi-thread decode paths are what these tests are about.
THREADS = max(2, physical_cores())


def long_prompt(session, n_tokens):
    """A prompt of about ``n_tokens`` that asks to continue a repetitive list (so the
    n-gram methods draft, and some drafts are rejected where the list varies)."""
    lines, i = [], 0
    head = "Continue this inventory list in the same format:\n"
    while True:
        lines.append(f"Item {i}: {['red', 'blue', 'green'][i % 3]} box, weight {i * 7 % 23} kg, "
                     f"shelf {i % 5}, checked by {['Ann', 'Bob', 'Eve', 'Tom'][i % 4]}.")
        i += 1
        tokens = session.tokenize_prompt(head + "\n".join(lines) + "\n")
        if len(tokens) >= n_tokens:
            return tokens


@pytest.fixture(scope="module")
def plain(demo_model):
    s = Session(demo_model, LoadOptions(nctx=2048, threads=THREADS, threads_batch=THREADS))
    assert s.threads >= 2
    assert s.options.cache_type_k == s.options.cache_type_v == "q8_0"
    yield s
    s.close()


@pytest.fixture(scope="module")
def prompts(plain):
    # Answers start at ~480 (run past 512) and at ~1000 (run past 1,024).
    return {"past-512": long_prompt(plain, 480), "past-1024": long_prompt(plain, 1000)}


# (prompt, sampling) in the order every session answers them.
SEQUENCE = [(pname, sname) for pname in ("past-512", "past-1024") for sname in SAMPLINGS]


def answer_all(session, prompts):
    """The answers to :data:`SEQUENCE` on ``session`` from an empty cache, one after
    the other in one conversation: {(prompt, sampling): Generation}."""
    session.reset()
    out = {}
    for pname, sname in SEQUENCE:
        gen = session.generate(prompts[pname], GenOptions(max_tokens=ANSWER, sampling=SAMPLINGS[sname]))
        gen.run()
        out[pname, sname] = gen
    return out


@pytest.fixture(scope="module")
def reference(plain, prompts):
    out = {}
    for (pname, sname), gen in answer_all(plain, prompts).items():
        assert len(prompts[pname]) + len(gen.tokens) > (512 if pname == "past-512" else 1024)
        out[pname, sname] = gen.tokens
    # The sequence reuses what it can: the second sampling of a prompt decodes no prompt.
    assert gen.stats.prompt_reused == len(prompts[pname]) - 1
    return out


@pytest.fixture(scope="module", params=METHODS + [AT_DEFAULTS])
def spec_session(request, demo_model):
    method = request.param
    if method == AT_DEFAULTS:
        so = SpecOptions(types=("ngram-mod",))
    else:
        # Fixed draft lengths, so that every method drafts (and the identity is tested)
        # whatever the auto policy would choose; the policy changes lengths, never tokens.
        so = SpecOptions(types=(method,), draft_model="demo", draft_path=demo_model if method == "draft-simple" else None,
                         n_max=6, policy="fixed")
    s = Session(demo_model, LoadOptions(nctx=2048, threads=THREADS, threads_batch=THREADS, spec=so))
    assert s.speculative, s.spec_notes
    if method == AT_DEFAULTS:
        # The verify cost curve measured at load follows the machine's load (a busy
        # neighbour can make batches look too dear to draft at all); this test needs
        # drafts, so it sizes them by a quiet machine's curve. Lengths never change tokens.
        s.policy = policy.GainPolicy({1: 1.0, 2: 2.0, 4: 2.8, 8: 4.1, 16: 7.2}, s.policy.one_row)
    yield s
    s.close()


def test_every_method_is_plain_decoding_past_long_positions(spec_session, prompts, reference):
    """Past 512 and past 1,024, greedy and seeded: each answer is the plain one."""
    for (pname, sname), gen in answer_all(spec_session, prompts).items():
        want = reference[pname, sname]
        first = next((i for i, (a, b) in enumerate(zip(gen.tokens, want)) if a != b), None)
        assert gen.tokens == want, (f"{pname}, {sname}: differs from plain at answer token {first} "
                                    f"(position {len(prompts[pname]) + (first or 0)})")
        if sname == "greedy":
            assert gen.stats.drafted > 0, f"{pname}: the method never drafted: the test would prove nothing"


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
def test_q4_0_weights_past_1024(q4_0_pair, sname):
    """The tutorial's weight format (Q4_0, repacked on this CPU) at the defaults. Each
    session starts from an empty cache (the first sampling's prompt is not reused)."""
    tokens = long_prompt(q4_0_pair[0], 1000)
    out = []
    for s in q4_0_pair:
        s.reset(drafts=True)
        gen = s.generate(tokens, GenOptions(max_tokens=ANSWER, sampling=SAMPLINGS[sname]))
        gen.run()
        assert gen.stats.prompt_reused == 0
        out.append(gen.tokens)
    assert out[0] == out[1] and len(tokens) + len(out[0]) > 1024
