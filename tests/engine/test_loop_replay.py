"""The accept loop against a replayed target (one-hot logits on a known answer): the
loop's bookkeeping, limits and stop rules without a model (tests/support/replay.py)."""
import pytest
from replay import ReplayTarget

from geniex.engine.loop import GenOptions, verify
from geniex.engine.sampling import Sampler, SamplingParams
from geniex.speculative.drafters import ngram
from geniex.speculative.drafters.base import Draft, Drafter
from geniex.speculative.options import NGRAM_METHODS, SpecOptions
from geniex.speculative.policy import FixedPolicy, GainPolicy

pytestmark = pytest.mark.fast
VOCAB = 300
EOS = 299
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 3
# The "plain answer": repeats (so n-grams draft) and new tokens (so some drafts fail).
ANSWER = ([11, 12, 13, 14, 15, 16] * 4 + list(range(20, 40)) + [1, 2, 3, 4, 5, 6, 7, 50, 51]
          + [11, 12, 13, 14, 15, 16] * 3 + [EOS])


def run(drafter=None, max_tokens=200, stop=(), n_batch=512, n_ctx=4096, cancel=None, policy=None):
    target = ReplayTarget(PROMPT + ANSWER, VOCAB, eog={EOS}, n_ctx=n_ctx, n_batch=n_batch)
    opts = GenOptions(max_tokens=max_tokens, stop=stop, sampling=SamplingParams())
    steps = list(target.steps(PROMPT, opts, drafter, cancel, policy=policy))
    return target, steps, [t for s in steps for t in s.committed]


class Oracle(Drafter):
    """Proposes the true continuation, as long as asked for (or longer)."""

    name = "oracle"

    def __init__(self, k, overshoot=0):
        self.n_max, self.overshoot = k, overshoot

    def propose(self, history, n_past, room):
        seq = PROMPT + ANSWER
        return Draft(seq[n_past + 1:n_past + 1 + self.limit(room) + self.overshoot])


class Wrong(Drafter):
    name = "wrong"
    n_max = 4

    def propose(self, history, n_past, room):
        return Draft([0] * self.limit(room))


def test_plain_replays_the_answer():
    target, steps, tokens = run()
    assert tokens == ANSWER[:-1]
    assert steps[-1].stop == "eos" and sum(1 for s in steps if s.stop) == 1
    assert target.kv.tokens == (PROMPT + ANSWER)[:len(PROMPT) + len(ANSWER) - 1]
    assert set(target.ctx.decodes[1:]) == {1}


@pytest.mark.parametrize("drafter", [Oracle(3), Oracle(16), Wrong()] +
                         [ngram.make(m, SpecOptions(types=(m,))) for m in NGRAM_METHODS],
                         ids=lambda d: d.name)
def test_every_drafter_commits_the_plain_answer(drafter):
    _, steps, tokens = run(drafter)
    assert tokens == ANSWER[:-1]
    for s in steps:
        assert s.accepted <= len(s.drafted)
        assert s.target[:s.accepted] == s.drafted[:s.accepted]


class PastTheEnd(Drafter):
    """Drafts the true continuation and goes on after the end token."""

    name = "past-the-end"
    n_max = 64

    def propose(self, history, n_past, room):
        return Draft((PROMPT + ANSWER + [7] * 64)[n_past + 1:n_past + 1 + self.limit(room)])


def test_no_draft_row_after_an_end_token():
    """The verify stops sampling at an end token, so the loop verifies no draft past it."""
    target, steps, tokens = run(PastTheEnd())
    assert tokens == ANSWER[:-1] and steps[-1].stop == "eos"
    assert steps[-1].drafted[-1] == EOS
    assert target.ctx.decodes[-1] == len(steps[-1].drafted) + 1


def test_a_drafter_cannot_overfill_the_verify_batch():
    # Whatever a drafter returns, the batch holds at most n_batch rows.
    target, _, tokens = run(Oracle(1000, overshoot=1000), n_batch=16)
    assert tokens == ANSWER[:-1]
    assert max(target.ctx.decodes[1:]) == 16


def test_oracle_accepts_everything_and_takes_fewer_steps():
    _, plain_steps, _ = run()
    _, steps, _ = run(Oracle(4))
    assert len(steps) < len(plain_steps) / 4
    assert all(s.accepted == len(s.drafted) for s in steps)


@pytest.mark.parametrize("max_tokens", [1, 5, 7, 13])
def test_length_limit_inside_an_accepted_run(max_tokens):
    _, steps, tokens = run(Oracle(6), max_tokens=max_tokens)
    assert tokens == ANSWER[:max_tokens]
    assert steps[-1].stop == "length"


def test_end_token_inside_an_accepted_run():
    _, steps, tokens = run(Oracle(8))
    assert tokens == ANSWER[:-1] and steps[-1].stop == "eos"


def test_stop_string_inside_an_accepted_run():
    # Token t prints chr(t % 94 + 33): 20, 21, 22 print "567".
    _, steps, tokens = run(Oracle(8), stop=("567",))
    text = "".join(s.text for s in steps)
    assert "567" not in text and steps[-1].stop == "stop_sequence"
    assert tokens[-3:] == [20, 21, 22]


def test_context_end():
    # The token sampled from the context's last position is committed, never decoded.
    _, plain_steps, plain = run(n_ctx=len(PROMPT) + 10)
    _, steps, tokens = run(Oracle(8), n_ctx=len(PROMPT) + 10)
    assert steps[-1].stop == plain_steps[-1].stop == "context_length"
    assert tokens == plain == ANSWER[:11]


def test_cancel_between_steps():
    calls = []
    # One check before the prompt's only chunk, then one before each step: two steps
    # of 2 accepted drafts + the target's token, then the fourth check cancels.
    _, steps, tokens = run(Oracle(2), cancel=lambda: calls.append(1) or len(calls) > 3)
    assert steps[-1].stop == "user" and tokens == ANSWER[:6]


def test_verify_counts_agreement():
    target = ReplayTarget(PROMPT + ANSWER, VOCAB, eog={EOS})
    n_past = len(PROMPT) - 1
    target.kv.sync(PROMPT, n_past)
    target.ctx.kv_end = n_past
    sampler = Sampler(SamplingParams(), VOCAB)
    sampled, accepted = verify(target.ctx, target.batch, sampler, PROMPT[-1], n_past, [11, 12, 99, 14], {EOS})
    assert sampled == [11, 12, 13] and accepted == 2


def test_policies_keep_the_plain_answer():
    for policy in (FixedPolicy(), GainPolicy({1: 1.0, 2: 1.3, 4: 1.9, 8: 3.1, 16: 5.5}, one_row_seconds=0.01)):
        d = ngram.make("ngram-mod", SpecOptions(types=("ngram-mod",)))
        _, steps, tokens = run(d, policy=policy)
        assert tokens == ANSWER[:-1]
        for s in steps:
            assert len(s.drafted) <= s.extra.get("offered", len(s.drafted))
