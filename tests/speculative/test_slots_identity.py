"""Several answers at once on one model's slots (``LoadOptions.parallel``, ``geniex serve
--parallel``) are each the answer the target alone gives: for every drafting method,
greedy and seeded, with 1 to 4 answers running together, past position 1,024, and
whatever the slots' caches held before (geniex.engine.batcher, geniex.engine.slots).

The reference is a plain one-slot session (the target alone). The slots are one session
loaded as ``serve --spec-type ngram-mod,draft-simple --draft-model demo`` makes it (an
n-gram drafter and a draft context per slot), answering plainly (``speculative=False``)
and with each method alone as a request's own setup (geniex.speculative.per_answer: the
loaded drafter of that method, the request's settings): one load and one prefill of the
prompts for the three tests (a session per method prefilled them again, and the
draft-simple one loaded the draft model beside it).
It answers the prompts one at a time first (one client), then all at once (two and four
clients), the prompts then coming back from the slots' KV or the prompt cache. The
prompts share a long opening (one ~1,000-token prefill, the rest restored): they end 8
tokens before position 1,024 and the answers run 24 tokens, so every verify past 1,024
is covered.
"""
import pytest

from geniex.engine.loop import GenOptions
from geniex.engine.session import LoadOptions, Session
from geniex.speculative.options import SpecOptions
from identity import SAMPLINGS, first_difference, inventory_line, inventory_tokens, task_answer as answer, together

N_PROMPT = 1024 - 8
ANSWER = 24
CLIENTS = 4


def prompts(session):
    """Four prompts of :data:`N_PROMPT` tokens sharing all but their last lines."""
    base = inventory_tokens(session, N_PROMPT - 40, inventory_line)
    out = []
    for i in range(CLIENTS):
        tail = session.vocab.tokenize(f"\n# part {i}: " + inventory_line(100 + 17 * i) * 3, add_special=False)
        out.append((base + tail)[:N_PROMPT])
    return out


def options(i):
    """Clients 0 and 2 greedy, 1 and 3 seeded sampling."""
    return GenOptions(max_tokens=ANSWER, sampling=SAMPLINGS["greedy" if i % 2 == 0 else "seeded"])


@pytest.fixture(scope="module")
def reference(demo_model):
    """The target alone: a plain one-slot session, each prompt from an empty cache."""
    plain = Session(demo_model, LoadOptions(nctx=1100))
    try:
        ps = prompts(plain)
        # The first from an empty cache; the others keep the opening it holds (one
        # prefill: what a prefix kept in a quantized cache holds is what a fresh
        # prefill writes, tests/server/test_prompt_cache.py).
        answers = [answer(plain, tokens, options(i))[0] for i, tokens in enumerate(ps)]
        yield ps, answers
    finally:
        plain.close()


@pytest.fixture(scope="module")
def slots(demo_model):
    """Four slots loaded with ngram-mod at its defaults and draft-simple (the demo model
    drafting for itself), with a prompt cache."""
    spec = SpecOptions(types=("ngram-mod", "draft-simple"), draft_model="demo", draft_path=demo_model)
    session = Session(demo_model, LoadOptions(nctx=1100, parallel=CLIENTS, cache_ram=1 << 30, spec=spec))
    yield session
    session.close()


PLAIN = None         # the plain test's setup: no drafting (``speculative=False``)


def check(session, ps, want, spec, rounds, alone=range(CLIENTS)):
    """Answer the prompts ``alone`` one at a time, then ``rounds`` (client orders) at
    once, with ``spec`` (PLAIN: no drafting); every answer must be the target alone's.
    Returns the drafts accepted."""
    speculative = spec is not PLAIN
    runs = {"one client": [(i, answer(session, ps[i], options(i), speculative, spec)) for i in alone]}
    for order in rounds:
        runs[f"{len(order)} clients"] = list(zip(order, together(
            session, [(ps[i], options(i)) for i in order], speculative, spec)))
    accepted = 0
    for name, got in runs.items():
        for i, (tokens, stats) in got:
            assert tokens == want[i], f"{name}, client {i}: parts from the target alone at {first_difference(tokens, want[i])}"
            assert stats.prompt_tokens + len(tokens) > 1024     # the answer ran past position 1,024
            # Only the setup's own method drafted (not the loaded chain).
            assert set(stats.by_method) <= set(spec.types if spec else ()), (name, i, stats.by_method)
            accepted += stats.accepted
        if name != "one client":
            # The prompts were found kept (in a slot, or the prompt cache: conversations
            # pushed out of a slot are kept there).
            assert all(stats.prompt_reused > 0 for _, (_, stats) in got), name
    assert session.batcher.seats > session.batcher.decodes       # decodes did hold several slots
    return accepted


def test_plain_answers_on_slots_are_the_target_alone(slots, reference):
    ps, want = reference
    assert len(slots.slots) == CLIENTS
    assert check(slots, ps, want, PLAIN, [(2, 1), (0, 1, 2, 3)]) == 0


def test_ngram_mod_answers_on_slots_are_the_target_alone(slots, reference):
    ps, want = reference
    assert slots.speculative, slots.spec_notes
    ngram = SpecOptions(types=("ngram-mod",))
    assert check(slots, ps, want, ngram, [(3, 0, 2, 1)]) > 0, "nothing was drafted: the identity was not tested"


def test_draft_simple_answers_on_slots_are_the_target_alone(slots, demo_model, reference):
    """The demo model drafting for itself, fixed lengths: its drafts are accepted whole
    greedy and partly seeded, so long verifies and rejections both happen. Each slot's
    draft context reads its prompt itself (the slot's target cache holds it already
    after the tests above): two at once."""
    ps, want = reference
    spec = SpecOptions(types=("draft-simple",), draft_model="demo", draft_path=demo_model, n_max=6, policy="fixed")
    assert check(slots, ps, want, spec, [(2, 1)], alone=(1, 2)) > 0
