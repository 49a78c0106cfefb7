"""Drafting from a predicted output (OpenAI's ``prediction``): the answer is the plain
answer token for token whatever the prediction says, greedy and seeded; where the
prediction matches the answer its drafts are accepted, where it was edited they are
rejected and the drafter finds its place again after the edit."""
import pytest

from geniex.engine.chat import Conversation
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import LoadOptions, Session
from geniex.speculative.drafters.prediction import PredictionDrafter

# The draft policy drafts a prediction where verifying pays: on one thread of a 2-core
# x86 machine a batch row costs nearly a one-row decode, so it drafts little there
# (tests/support/parallel.py).
pytestmark = pytest.mark.all_cores

PROMPT = "List the planets of the solar system, one per line, with one fact about each."


def answer(session, sampling, prediction=None, max_tokens=48):
    gen = Conversation(session).ask(PROMPT, GenOptions(max_tokens=max_tokens, sampling=sampling,
                                                       prediction=prediction))
    for _ in gen:
        pass
    session.reset()
    return gen.tokens, gen.stats


@pytest.fixture(scope="module")
def plain(demo_model):
    session = Session(demo_model, LoadOptions(nctx=256))
    yield session
    session.close()


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=40, seed=11)],
                         ids=["greedy", "seeded"])
def test_an_edited_prediction_speeds_the_answer_and_never_changes_it(plain, sampling):
    want, _ = answer(plain, sampling)
    text = plain.vocab.detokenize(want)
    words = text.split(" ")
    middle = len(words) // 2
    edited = " ".join(words[:middle] + ["Unrelated", "words", "here"] + words[middle + 1:])
    got, stats = answer(plain, sampling, prediction=edited)
    assert got == want
    steps, drafted, accepted, _ = stats.by_method["prediction"]
    assert accepted > len(want) // 2 and drafted > accepted        # most of it drafted; the edit rejected
    assert stats.steps < len(want) * 3 // 4                        # fewer target decodes than tokens
    if sampling.temperature == 0:           # an unrelated prediction: drafted, rejected, no harm
        assert answer(plain, sampling, prediction="Nothing like the answer at all.")[0] == want


@pytest.mark.fast
def test_the_drafter_continues_and_finds_its_place_after_an_edit():
    d = PredictionDrafter([10, 11, 12, 13, 14, 15, 16, 17], n_max=3)
    history = [1, 2, 3]                          # the prompt; 3 is pending
    d.begin(history, 2, None)
    assert list(d.propose(history, 2, 10).tokens) == [10, 11, 12]   # the answer starts as predicted
    history += [10, 11, 12, 13]
    d.observe(history, 6, None, 3, 3)
    assert list(d.propose(history, 6, 10).tokens) == [14, 15, 16]   # followed: continues from there
    history += [14, 99]
    d.observe(history, 8, None, 3, 1)
    assert not d.propose(history, 8, 10).tokens                     # 99 is not in the prediction
    history += [15, 16]
    d.observe(history, 10, None, 0, 0)
    assert list(d.propose(history, 10, 2).tokens) == [17]          # "15 16" found again


@pytest.mark.uncalibrated
def test_a_first_prediction_measures_its_policy_without_losing_the_cached_conversation(demo_model, data_dir):
    """A plain session measures its verify costs when the first prediction comes (an
    empty calibration cache: a user's first run). Measuring decodes on the context; the
    conversation it held must come back, or the answer reads an empty cache (it did:
    a garbled answer, found when the server started reusing cached prompts)."""
    session = Session(demo_model, LoadOptions(nctx=256, data_dir=data_dir))
    try:
        tokens = Conversation(session).prompt_tokens([{"role": "user", "content": PROMPT}])
        opts = GenOptions(max_tokens=24, sampling=SamplingParams())
        session.adopt(tokens)
        want = session.generate(tokens, opts)
        want.run()
        assert not (data_dir / "calibration.json").exists()          # nothing measured yet
        session.adopt(tokens)                                        # the prompt is reused ...
        got = session.generate(tokens, GenOptions(max_tokens=24, sampling=SamplingParams(),
                                                  prediction=session.vocab.detokenize(want.tokens)))
        got.run()
        assert (data_dir / "calibration.json").exists()              # ... after the policy was measured
        assert got.stats.prompt_reused == len(tokens) - 1
        assert got.tokens == want.tokens
    finally:
        session.close()
