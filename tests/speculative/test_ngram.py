"""The n-gram drafters alone, on token lists (no model)."""
import pytest

from geniex.speculative.drafters import ngram
from geniex.speculative.options import NGRAM_METHODS, SpecOptions

pytestmark = pytest.mark.fast

# A history that repeats a 12-token phrase: after the phrase's first 4 tokens come
# again, every method should predict how it goes on.
PHRASE = list(range(100, 112))
HISTORY = [1, 2, 3] + PHRASE + [7, 8] + PHRASE + [9] + PHRASE[:6]


def drafter(method, **kw):
    d = ngram.make(method, SpecOptions(types=(method,), **kw))
    return d


@pytest.mark.parametrize("method", NGRAM_METHODS)
def test_drafts_the_continuation_of_a_repeat(method):
    d = drafter(method, ngram_n=3, ngram_min=1, ngram_max=4)
    n_past = len(HISTORY) - 1
    d.begin(HISTORY, n_past, None)
    draft = d.propose(HISTORY, n_past, room=100)
    assert list(draft.tokens) == PHRASE[6:10]


@pytest.mark.parametrize("method", NGRAM_METHODS)
def test_room_and_maximum_bound_the_draft(method):
    d = drafter(method, ngram_n=3, ngram_min=1, ngram_max=5)
    n_past = len(HISTORY) - 1
    d.begin(HISTORY, n_past, None)
    assert len(d.propose(HISTORY, n_past, room=2).tokens) == 2
    assert len(d.propose(HISTORY, n_past, room=100).tokens) <= 5
    assert not d.propose(HISTORY, n_past, room=0).tokens


@pytest.mark.parametrize("method", NGRAM_METHODS)
def test_nothing_to_draft_without_a_repeat(method):
    d = drafter(method)
    history = list(range(50))
    d.begin(history, 49, None)
    assert not d.propose(history, 49, room=8).tokens


def test_short_drafts_are_dropped():
    d = drafter("ngram-simple", ngram_n=3, ngram_min=6, ngram_max=8)
    history = [5, 6, 7, 8, 9, 5, 6, 7]       # the repeat offers only 5 tokens (8 9 5 6 7)
    d.begin(history, len(history) - 1, None)
    assert not d.propose(history, len(history) - 1, room=8).tokens


def test_ngram_mod_indexes_as_the_answer_grows_and_keeps_memory_through_rejections():
    """Rejected drafts do not wipe what ngram-mod remembers (upstream clears its table
    after 5 poor steps; here the draft policy stops drafting what the target rejects,
    and a replayed request later still finds its earlier answer)."""
    d = drafter("ngram-mod", ngram_n=2, ngram_min=1, ngram_max=3)
    history = [1, 2, 3, 4]
    d.begin(history, 3, None)
    history += [1, 2]
    d.observe(history, 5, 0, 0, 0)
    assert list(d.propose(history, 5, room=8).tokens) == [3, 4, 1]
    for _ in range(5):                           # five rounds under 25% acceptance
        d.observe(history, 5, 0, 4, 0)
    assert list(d.propose(history, 5, room=8).tokens) == [3, 4, 1]


def test_ngram_mod_takes_the_occurrence_whose_context_matches_longest():
    """The key (7, 8) was followed by 1 after "a b" and by 2 after "c d" (the latest):
    after "a b 7 8" the draft is what followed there, not the latest continuation."""
    d = drafter("ngram-mod", ngram_n=2, ngram_min=1, ngram_max=3)
    history = [50, 51, 7, 8, 1, 1, 1, 60, 61, 7, 8, 2, 2, 2, 9, 50, 51, 7, 8]
    d.begin(history, len(history) - 1, None)
    assert list(d.propose(history, len(history) - 1, room=8).tokens) == [1, 1, 1]
    history[-4:-2] = [60, 61]
    d.forget()
    d.begin(history, len(history) - 1, None)
    assert list(d.propose(history, len(history) - 1, room=8).tokens) == [2, 2, 2]


def test_ngram_mod_answer_openings_follow_the_question_not_the_last_answer():
    """Every chat turn ends with the same template tokens; with memory across answers the
    first draft of an answer comes from the earlier answer to the same question."""
    d = drafter("ngram-mod", ngram_n=3, ngram_min=1, ngram_max=4)
    opening = [90, 91, 92]                       # "<|im_start|>assistant\n"
    q1, q2 = [10, 11, 12, 13], [20, 21, 22, 23]
    a1, a2 = [30, 31, 32, 33, 34], [40, 41, 42, 43, 44]
    for q, a in ((q1, a1), (q2, a2)):
        d.begin(q + opening, len(q) + 2, None)
        d.observe(q + opening + a, len(q) + 2 + len(a), 0, 0, 0)
    d.begin(q1 + opening, len(q1) + 2, None)
    assert list(d.propose(q1 + opening, len(q1) + 2, room=8).tokens) == a1[:4]


def test_ngram_mod_drafts_a_loop_past_the_end_of_memory():
    d = drafter("ngram-mod", ngram_n=2, ngram_min=1, ngram_max=7)
    history = [5, 1, 2, 3, 1, 2, 3, 1, 2]
    d.begin(history, len(history) - 1, None)
    assert list(d.propose(history, len(history) - 1, room=8).tokens) == [3, 1, 2, 3, 1, 2, 3]


@pytest.mark.parametrize("method", NGRAM_METHODS)
def test_memory_across_answers(method):
    """What one answer taught drafts in the next, until forget()."""
    d = drafter(method, ngram_n=3, ngram_min=1, ngram_max=4)
    first = [1, 2, 3] + PHRASE + [9, 9] + PHRASE + [8]    # twice: map-k and cache want 2 sightings
    d.begin(first, len(first) - 1, None)
    d.observe(first + [5, 6], len(first) + 1, 0, 0, 0)
    # Another conversation that quotes the phrase once: nothing in it repeats yet.
    second = [40, 41, 42] + PHRASE[:5]
    d.begin(second, len(second) - 1, None)
    assert list(d.propose(second, len(second) - 1, room=8).tokens) == PHRASE[5:9]
    d.forget()
    d.begin(second, len(second) - 1, None)
    assert not d.propose(second, len(second) - 1, room=8).tokens


def test_a_conversation_that_goes_on_grows_one_segment():
    d = drafter("ngram-mod", ngram_n=2, ngram_min=1, ngram_max=4)
    turn1 = [1, 2, 3, 4, 5, 6]
    d.begin(turn1, 5, None)
    turn2 = turn1 + [7, 8, 1, 2]
    d.begin(turn2, len(turn2) - 1, None)
    assert d.corpus == turn2 and d.seg == 0
    assert list(d.propose(turn2, len(turn2) - 1, room=8).tokens) == [3, 4, 5, 6]


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(ngram, "MEMORY_TOKENS", 50)
    d = drafter("ngram-mod")
    for i in range(5):
        h = list(range(i * 100, i * 100 + 30))
        d.begin(h, len(h) - 1, None)
    assert len(d.corpus) <= 50 + 30


@pytest.mark.parametrize("method", NGRAM_METHODS)
def test_the_same_request_again_drafts_the_previous_answer(method):
    """An agent that sends the same prompt again: the earlier answer stays in memory
    (also for the methods that draft from positions, not only from a table)."""
    d = drafter(method, ngram_n=3, ngram_min=1, ngram_max=4)
    prompt = [1, 2, 3, 4, 5]
    answer = PHRASE + PHRASE                       # twice: map-k and cache want 2 sightings
    d.begin(prompt, len(prompt) - 1, None)
    full = prompt + answer
    d.observe(full, len(full) - 1, 0, 0, 0)
    d.begin(prompt + PHRASE[:4], len(prompt) + 3, None)    # the retry, 4 tokens in
    assert list(d.propose(prompt + PHRASE[:4], len(prompt) + 3, room=8).tokens) == PHRASE[4:8]


@pytest.mark.parametrize("seed", range(8))
def test_ngram_mod_drafts_only_what_memory_says(seed):
    """Random small-vocabulary texts over several answers (so segments, repeats and loops
    all occur): every draft token followed its n preceding tokens (text + draft so far)
    somewhere in memory, and no draft exceeds its limit."""
    import random
    rng = random.Random(seed)
    n, lo, hi = rng.choice([(1, 1, 4), (2, 1, 6), (3, 2, 8), (4, 1, 5)])
    d = drafter("ngram-mod", ngram_n=n, ngram_min=lo, ngram_max=hi)
    drafted = 0
    for _answer in range(4):
        history = [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
        d.begin(history, len(history) - 1, None)
        for _step in range(40):
            room = rng.randrange(0, 10)
            draft = list(d.propose(history, len(history) - 1, room).tokens)
            assert len(draft) <= min(room, hi) and (not draft or len(draft) >= lo)
            memory = [tuple(d.corpus[e - n:e + 1]) for e in range(n, len(d.corpus))]
            text = history + draft
            for i, tok in enumerate(draft):
                end = len(history) + i
                assert tuple(text[end - n:end + 1]) in memory, (n, text, d.corpus)
            drafted += len(draft)
            history += [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
            d.observe(history, len(history) - 1, 0, len(draft), 0)
    assert drafted > 0


def test_ngram_mod_probabilities_grow_with_the_match():
    """Each draft token carries 1 - 1/M, M = the match behind it: the key, the context
    before it that matched, and the draft tokens before it."""
    d = drafter("ngram-mod", ngram_n=3, ngram_min=1, ngram_max=6)
    history = [1, 2, 3] + PHRASE + [7, 8] + PHRASE[:5]     # the phrase again, 5 tokens in
    d.begin(history, len(history) - 1, None)
    draft = d.propose(history, len(history) - 1, room=8)
    assert list(draft.tokens) == PHRASE[5:11]
    # key PHRASE[2:5], context PHRASE[:2] (then 8 != 3): 5 tokens of match at the first
    assert draft.probs == pytest.approx([1 - 1 / (5 + i) for i in range(6)])


def test_ngram_mod_where_earlier_texts_went_on_differently_the_draft_is_that_likely():
    d = drafter("ngram-mod", ngram_n=3, ngram_min=1, ngram_max=2)
    history = [50, 7, 8, 9, 1, 60, 7, 8, 9, 2, 70, 7, 8, 9]   # (7 8 9) then 1, then 2
    d.begin(history, len(history) - 1, None)
    draft = d.propose(history, len(history) - 1, room=8)
    assert list(draft.tokens) == [2, 70]                      # the latest among equals
    assert draft.probs[0] == pytest.approx((1 - 1 / 3) * 0.5)


def test_ngram_mod_another_conversations_opening_is_no_evidence():
    """Every answer opens after the same template tokens: another conversation's answer
    after them is offered at probability 0 (the policy drafts none of it), while the
    same words inside the current conversation are evidence."""
    from geniex.speculative.policy import GainPolicy
    policy = GainPolicy({1: 1.0, 2: 2.0, 4: 2.8, 8: 4.1, 16: 7.2}, 0.01)
    d = drafter("ngram-mod", ngram_n=3, ngram_min=1, ngram_max=4)
    opening = [90, 91, 92]                                    # "<|im_start|>assistant\n"
    first = [10, 11, 12] + opening
    d.begin(first, len(first) - 1, None)
    d.observe(first + PHRASE, len(first) + len(PHRASE) - 1, 0, 0, 0)
    second = [20, 21, 22] + opening                           # another question
    d.begin(second, len(second) - 1, None)
    draft = d.propose(second, len(second) - 1, room=8)
    assert list(draft.tokens) == PHRASE[:4] and draft.probs[0] == 0.0
    assert policy.take("ngram-mod", len(draft.tokens), draft.grade, draft.probs) == 0
    # A turn of the same conversation that quotes the phrase: drafted from its 3rd token.
    third = first + PHRASE + [30, 31] + opening + PHRASE[:3]
    d.begin(third, len(third) - 1, None)
    draft = d.propose(third, len(third) - 1, room=8)
    assert list(draft.tokens) == PHRASE[3:7] and draft.probs[0] > 0.8
    assert policy.take("ngram-mod", len(draft.tokens), draft.grade, draft.probs) == 4
