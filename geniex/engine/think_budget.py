"""A reasoning budget: at most N tokens of thoughts, then the block is closed for the model.

llama.cpp's ``--reasoning-budget N`` (per request ``thinking_budget_tokens``, or the
Messages API's ``thinking.budget_tokens``): once the answer has spent N tokens inside
its reasoning block (``<think>`` or Gemma 4's ``<|channel>thought``) without closing it,
the closing marker (after an optional message, ``--reasoning-budget-message``) is forced,
token by token, and the model goes on to answer. Budget 0 closes the block at once.

It is a constraint on the answer, like a grammar (:mod:`geniex.engine.constraints`, same
interface): each verify row is sampled under the budget's state after the tokens before
it, so a speculative answer is forced at the same position as the plain one and stays
identical token for token; the forced closing run is drafted for free
(:class:`~geniex.engine.forced.ForcedDrafter`).
"""
from dataclasses import dataclass

import numpy as np

from geniex.engine.toolcalls.reasoning import forced_open, markers_for
from geniex.errors import UsageError

# Phases of an answer under a budget.
_START, _INSIDE, _CLOSING, _DONE = range(4)


@dataclass(frozen=True)
class ThinkBudget:
    """A budget bound to a template's reasoning markers: plain data (it crosses to the
    server's worker process); :meth:`constraint` makes one answer's state."""

    tokens: int                  # thought tokens allowed before the block is closed (>= 0)
    markers: tuple               # (open, close), as toolcalls.markers_for gives them
    forced_open: bool = False    # the prompt opened the block: the answer starts inside it
    message: str = ""            # text put before the closing marker when the budget runs out

    def constraint(self, vocab):
        """A fresh :class:`BudgetConstraint` for one answer on ``vocab``."""
        return BudgetConstraint(self, vocab)


def for_prompt(tokens, template_source, prompt, message="", grammar=None, param=None):
    """The budget of ``tokens`` thought tokens for an answer to ``prompt`` (the rendered
    chat prompt): the template's markers, and whether the prompt opened the block. With a
    ``grammar`` too it is a UsageError naming ``param``: an answer has one constraint."""
    if grammar is not None:
        raise UsageError(f"{param + ': ' if param else ''}a reasoning budget cannot be combined with "
                         "response_format, a grammar or a required tool choice (the answer would be constrained "
                         "twice)", param=param)
    markers = markers_for(template_source)
    return ThinkBudget(tokens, markers, forced_open(prompt, markers), message)


class BudgetConstraint:
    """One answer's budget state. Tokens are free until the budget is spent inside an
    open block; then only the closing run may follow. Consumed tokens can be rolled
    back (a stop string cut the verify's rows), as a grammar's can."""

    def __init__(self, budget, vocab):
        self.budget = budget
        self.vocab = vocab
        self.open, self.close = (m.encode("utf-8") for m in budget.markers)
        self.closing = vocab.tokenize(budget.message + budget.markers[1], add_special=False, parse_special=True)
        self.end_token = vocab.eos
        self._row = np.empty(vocab.n_tokens, dtype=np.float32)
        self._neg_inf = np.float32(-np.inf)
        # (phase, thought tokens so far, closing tokens emitted, recent bytes)
        start = (_INSIDE, 0, 0, b"") if budget.forced_open else (_START, 0, 0, b"")
        self.state = self._entered(start) if budget.forced_open else start
        self._undo = []

    def _entered(self, state):
        """``state`` just inside the block: a spent budget (0) closes it at once."""
        return (_CLOSING, 0, 0, b"") if self.budget.tokens <= 0 else state

    def _after(self, state, token):
        """The state after ``token``, or None where the budget forbids it."""
        phase, count, emitted, seen = state
        if phase == _DONE:
            return state
        if phase == _CLOSING:
            if token != self.closing[emitted]:
                return None
            emitted += 1
            return (_DONE, count, emitted, b"") if emitted == len(self.closing) else (_CLOSING, count, emitted, b"")
        seen += self.vocab.piece(token)
        if phase == _START:
            head = seen.lstrip()
            if head.startswith(self.open):
                # Thoughts start after the opening marker (text the same token carries
                # past it is the block's first thought, not counted: a token is the unit).
                return self._entered((_INSIDE, 0, 0, head[len(self.open):][-len(self.close):]))
            if self.open.startswith(head):
                return (_START, 0, 0, seen)        # may still become the opening marker
            return (_DONE, 0, 0, b"")              # no reasoning block: nothing to hold
        count += 1
        if self.close in seen:
            return (_DONE, count, 0, b"")           # the model closed the block itself
        if count >= self.budget.tokens:
            return (_CLOSING, count, 0, b"")
        return (_INSIDE, count, 0, seen[-len(self.close):])

    def mask(self, logits):
        """``logits`` as they are, or (while the closing run is forced) -inf on every
        token but the next one of it (a buffer of this constraint)."""
        phase, _, emitted, _ = self.state
        if phase != _CLOSING:
            return logits
        row = self._row
        row.fill(self._neg_inf)
        token = self.closing[emitted]
        row[token] = logits[token]
        return row

    def consume(self, token):
        """Advance by ``token``; False where the budget forbids it."""
        after = self._after(self.state, int(token))
        if after is None:
            return False
        self._undo.append(self.state)
        self.state = after
        return True

    def rollback(self, n):
        """Undo the last ``n`` consumed tokens."""
        if n > 0:
            self.state = self._undo[-n]
            del self._undo[-n:]

    def forced_tokens(self):
        """The rest of the closing run while it is forced, else nothing."""
        phase, _, emitted, _ = self.state
        return list(self.closing[emitted:]) if phase == _CLOSING else []

    def forced_text(self):
        phase, _, emitted, _ = self.state
        if phase != _CLOSING:
            return b""
        return b"".join(self.vocab.piece(t) for t in self.closing[emitted:])

    def allowed_prefix(self, tokens):
        """How many of ``tokens``, in order, the budget allows (state unchanged)."""
        state = self.state
        for i, token in enumerate(tokens):
            state = self._after(state, int(token))
            if state is None:
                return i
        return len(tokens)

    def is_accepting(self):
        return True

    def is_stopped(self):
        return False

    @property
    def thought_tokens(self):
        """Thought tokens counted so far (for tests and traces)."""
        return self.state[1]

    @property
    def closed_by_budget(self):
        """True once the budget forced (or is forcing) the block closed."""
        phase, _, emitted, _ = self.state
        return phase == _CLOSING or (phase == _DONE and emitted > 0)
