"""draft-simple with a draft that is *not* the target: the other identity tests draft
with the demo model for itself, whose greedy drafts the target always accepts, so
there the rejection path (a draft row the target disagrees with, the draft context
rolled back to the target's token) never runs under greedy decoding. Here the draft is
the demo model requantized to Q4_0 (same vocabulary, other weights): it disagrees now
and then, and the answers must still be the target's own, token for token."""
import pytest

from geniex.engine.chat import Conversation
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import LoadOptions, Session
from geniex.speculative.options import SpecOptions

PROMPT = "Write a long essay about the history of the Roman Empire, with many details."


def answer(session, sampling, max_tokens=40):
    gen = Conversation(session).ask(PROMPT, GenOptions(max_tokens=max_tokens, sampling=sampling))
    for _ in gen:
        pass
    return gen.tokens, gen.stats


@pytest.fixture(scope="module")
def sessions(demo_model, demo_q4_0):
    plain = Session(demo_model, LoadOptions(nctx=256))
    spec = Session(demo_model, LoadOptions(nctx=256, spec=SpecOptions(types=("draft-simple",), draft_path=demo_q4_0,
                                                                       policy="fixed")))
    yield plain, spec
    spec.close()
    plain.close()


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=40, seed=7)],
                         ids=["greedy", "seeded"])
def test_a_draft_the_target_rejects_leaves_the_answer_unchanged(sessions, sampling):
    plain, spec = sessions
    want, _ = answer(plain, sampling)
    plain.reset()
    got, stats = answer(spec, sampling)
    spec.reset()
    assert got == want
    assert stats.accepted > 0 and stats.drafted > stats.accepted      # drafts taken, and some rejected
