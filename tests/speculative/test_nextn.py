"""draft-mtp with the NextN layers bundled in the target (issue 5, "Bundled MTP").

A tiny random ``qwen35`` target (tests/support/tiny_nextn.py: one gated delta-net layer, one
full-attention layer, one NextN block) is loaded with ``load_mtp``; the draft is a
second, MTP-type context on the same model with a KV cache of its own. The property
under test: speculative output is token for token the output of plain decoding (the
plain session loads the same file without its NextN layers), greedy and seeded, and
the counters and step records agree with each other.
"""

import pytest

from geniex.engine.loop import GenOptions
from geniex.engine.session import LoadOptions, Session
from geniex.speculative.options import SpecOptions
from geniex.engine.sampling import SamplingParams
from geniex.speculative.options import NGRAM_DEFAULTS

import tiny_nextn

PROMPTS = ["the cat sat on", "Once upon a time there was a quiet river near old stone bridge"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("nextn")
    return {"nextn": tiny_nextn.write_target(d / "nextn.gguf"),
            "plain": tiny_nextn.write_target(d / "plain.gguf", nextn=False)}


@pytest.fixture(scope="module")
def spec(models):
    s = Session(models["nextn"], LoadOptions(nctx=512, spec=SpecOptions(types=("draft-mtp",), n_max=3,
                                                                         policy="fixed")))
    yield s
    s.close()


@pytest.fixture(scope="module")
def plain(models):
    s = Session(models["nextn"], LoadOptions(nctx=512))
    yield s
    s.close()


def run(session, tokens, max_tokens=60, temperature=0.0, seed=0, speculative=True, reset=True):
    if reset:
        session.reset()
    gen = session.generate(list(tokens), GenOptions(
        max_tokens=max_tokens, sampling=SamplingParams(temperature=temperature, seed=seed)),
        speculative=speculative)
    steps = list(gen)
    return gen.tokens, steps, gen.stats


def test_loads_bundled_nextn(spec, plain):
    assert spec.speculative, spec.spec_notes
    assert spec.drafter.name == "draft-mtp"
    assert spec.model.n_layer_nextn() == 1
    assert any("NextN layer(s) bundled" in n for n in spec.spec_notes)
    assert not plain.speculative


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.8, 1), (1.0, 3)])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_identical_to_plain(spec, plain, prompt, temperature, seed):
    toks = spec.tokenize_prompt(prompt)
    p, _, _ = run(plain, toks, temperature=temperature, seed=seed, speculative=False)
    s, steps, stats = run(spec, toks, temperature=temperature, seed=seed)
    assert s == p
    assert stats.drafted > 0


def test_counters_and_steps(spec):
    toks = spec.tokenize_prompt(PROMPTS[1])
    tokens, steps, stats = run(spec, toks, max_tokens=40)
    assert stats.steps == len(steps)
    assert stats.accepted == sum(st.accepted for st in steps)
    assert stats.drafted == sum(min(len(st.target), len(st.drafted)) for st in steps)
    assert sum(stats.accept_hist) == sum(1 for st in steps if st.drafted)
    for st in steps:
        assert len(st.drafted) <= 3
        assert st.accepted <= len(st.drafted)
        assert st.target[:st.accepted] == list(st.drafted[:st.accepted])
        if st.drafted:
            assert st.method == "draft-mtp"
            assert st.draft_probs is not None and len(st.draft_probs) == len(st.drafted)
    assert [t for st in steps for t in st.committed] == tokens


def test_follow_up_reuses_kv(spec, plain):
    """A second prompt extending the first reuses the cached prefix on both contexts."""
    first = spec.tokenize_prompt(PROMPTS[0])
    a1, _, _ = run(plain, first, max_tokens=20, speculative=False)
    b1, _, _ = run(spec, first, max_tokens=20)
    assert a1 == b1
    follow = first + a1 + spec.tokenize_prompt(" and then")[1:]
    a2, _, _ = run(plain, follow, max_tokens=30, speculative=False, reset=False)
    b2, _, st = run(spec, follow, max_tokens=30, reset=False)
    assert a2 == b2
    assert st.prompt_reused > 0


def test_hybrid_target_keeps_snapshots_for_the_longest_draft(models, plain):
    """A hybrid target keeps a recurrent-state snapshot per position a verify may reject:
    the longest draft of any requested method (here ngram-mod's maximum), so a chain with
    n-gram drafting works on it too and stays identical to plain decoding."""
    s = Session(models["nextn"], LoadOptions(nctx=512, spec=SpecOptions(
        types=("ngram-mod", "draft-mtp"), n_max=3)))
    try:
        assert s.speculative, s.spec_notes
        assert s.n_rs_seq == max(3, NGRAM_DEFAULTS["ngram-mod"][2])
        tokens = s.vocab.tokenize("a b c a b c a b c a b c a b c")
        want, _, _ = run(plain, tokens)
        got, _, stats = run(s, tokens)
        assert got == want
    finally:
        s.close()


def test_plain_conversation_on_a_hybrid_target_restarts_when_it_cannot_roll_back(plain):
    """Without snapshots a recurrent state cannot be trimmed back to a shared prefix: the
    next prompt is decoded from scratch instead of failing."""
    first = plain.vocab.tokenize(PROMPTS[1])
    run(plain, first, max_tokens=8)
    edited = first[:-2] + plain.vocab.tokenize(" moon")
    again, _, stats = run(plain, edited, max_tokens=8, reset=False)
    fresh, _, _ = run(plain, edited, max_tokens=8)
    assert again == fresh and stats.prompt_reused in (0, len(edited) - 1)


def test_no_nextn_layers_needs_draft_model(models):
    s = Session(models["plain"], LoadOptions(nctx=256, spec=SpecOptions(types=("draft-mtp",))))
    try:
        assert not s.speculative
        assert "draft-mtp needs a draft model" in s.spec_notes[0]
    finally:
        s.close()


def test_identical_past_long_positions_at_defaults(tmp_path):
    """At the shipped defaults (every core, q8_0 KV cache for the target and the NextN
    context), answers running past position 1,024 are plain decoding's, greedy and
    seeded (one model and one pair of sessions for both)."""
    path = tiny_nextn.write_target(tmp_path / "nextn-long.gguf", context_length=2048)
    spec_s = Session(path, LoadOptions(nctx=2048, spec=SpecOptions(types=("draft-mtp",), n_max=3, policy="fixed")))
    plain_s = Session(path, LoadOptions(nctx=2048))
    try:
        assert spec_s.speculative, spec_s.spec_notes
        assert spec_s.drafter.ctx.params.type_k == spec_s.ctx.params.type_k
        words = " ".join(PROMPTS[1].split() * 120)
        toks = plain_s.tokenize_prompt(words)[:1000]
        for temperature, seed in [(0.0, 0), (0.8, 1)]:
            p, _, _ = run(plain_s, toks, max_tokens=60, temperature=temperature, seed=seed, speculative=False)
            s, _, stats = run(spec_s, toks, max_tokens=60, temperature=temperature, seed=seed)
            assert s == p and len(toks) + len(p) > 1024, (temperature, seed)
            assert stats.drafted > 0
    finally:
        spec_s.close()
        plain_s.close()
