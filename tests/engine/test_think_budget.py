"""The reasoning budget's state on the demo model's real vocabulary: where it counts,
when it forces the closing run, what it leaves alone, and rollback (the server's
answers and their identity with speculation: tests/server/test_thinking_budget.py)."""
import pickle

import numpy as np
import pytest

from geniex.engine.think_budget import ThinkBudget
from geniex.llama.objects import Model

THINK = ("<think>", "</think>")


@pytest.fixture(scope="module")
def vocab(demo_model):
    model = Model(demo_model)
    yield model.vocab
    model.close()


def words(vocab, text):
    return vocab.tokenize(text, add_special=False, parse_special=True)


def test_an_open_block_is_closed_after_its_budget(vocab):
    c = ThinkBudget(3, THINK, forced_open=True, message=" ok").constraint(vocab)
    closing = words(vocab, " ok</think>")
    thoughts = words(vocab, "the sea is calm today")
    logits = np.arange(vocab.n_tokens, dtype=np.float32)
    for t in thoughts[:3]:
        assert c.mask(logits) is logits and c.forced_tokens() == []   # free while the budget lasts
        assert c.consume(t)
    assert c.thought_tokens == 3 and c.closed_by_budget
    assert c.forced_tokens() == closing and c.forced_text() == b" ok</think>"
    row = c.mask(logits)
    assert np.isfinite(row).sum() == 1 and row[closing[0]] == logits[closing[0]]
    assert c.allowed_prefix([thoughts[3]]) == 0 and c.allowed_prefix(closing + thoughts) == len(closing) + len(thoughts)
    assert not c.consume(thoughts[3])
    for t in closing:
        assert c.consume(t)
    assert c.forced_tokens() == [] and c.mask(logits) is logits       # answered freely after the block
    c.rollback(len(closing))                                          # back before the closing run
    assert c.forced_tokens() == closing
    c.rollback(2)
    assert not c.closed_by_budget and c.thought_tokens == 1


def test_a_block_the_model_opens_counts_from_its_marker_and_may_close_itself(vocab):
    budget = ThinkBudget(4, THINK)
    c = budget.constraint(vocab)
    for t in words(vocab, "  <think>"):                 # leading whitespace, then the marker
        assert c.consume(t)
    assert c.thought_tokens == 0 and not c.closed_by_budget
    short = words(vocab, "ok</think>The answer")
    assert c.allowed_prefix(short) == len(short)
    for t in short:
        assert c.consume(t)
    assert not c.closed_by_budget and c.forced_tokens() == []       # closed by the model: never forced
    # An answer that does not start with the marker is never held.
    c = budget.constraint(vocab)
    prose = words(vocab, "Hello there, this is a long answer without thoughts")
    assert c.allowed_prefix(prose) == len(prose)


def test_budget_zero_closes_at_once(vocab):
    c = ThinkBudget(0, THINK, forced_open=True).constraint(vocab)
    assert c.forced_tokens() == words(vocab, "</think>")
    c = ThinkBudget(0, THINK).constraint(vocab)
    for t in words(vocab, "<think>"):
        c.consume(t)
    assert c.forced_tokens() == words(vocab, "</think>")


@pytest.mark.fast
def test_a_budget_is_plain_data_for_the_worker_process():
    budget = ThinkBudget(5, ("<|channel>thought", "<channel|>"), True, "done")
    assert pickle.loads(pickle.dumps(budget)) == budget
