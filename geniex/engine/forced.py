"""Forced-token drafting: where the grammar allows one continuation only (a schema's keys
and punctuation, a fixed prefix), draft it for free.

:class:`ForcedDrafter` wraps the answer's own drafter (or none). Each step it asks the
answer's grammar state what must follow the pending token; if something must, it
drafts that run first and lets the wrapped drafter continue after it (where that
drafter can draft after tokens that are not committed yet), else the wrapped drafter
drafts as usual. The verify samples every row as always, so the answer stays the plain
constrained answer token for token; a forced run only saves the target the one-row
decodes it would have spent on tokens the grammar had already decided.

The run is the canonical tokenizing of the forced text (what a model usually emits),
cut to what the grammar accepts; llguidance's own forced tokens stop short of a token
that the next bytes could extend, and are the fallback.
"""
from geniex.speculative.drafters.base import NO_DRAFTER, Draft, Drafter

METHOD = "forced"
# The draft policy's confidence class of a forced run (its prior: nearly always accepted;
# it then learns the real rate per method and grade).
GRADE = 4


class ForcedDrafter(Drafter):
    """The forced run of ``constraint``, then ``inner``'s draft (see the module docstring)."""

    def __init__(self, constraint, vocab, inner=NO_DRAFTER, max_run=None):
        self.constraint, self.vocab, self.inner = constraint, vocab, inner
        self.name = inner.name or METHOD
        self.max_run = max_run           # recurrent targets roll back this far only
        self.n_max = max(inner.n_max, max_run or 64)

    def propose(self, history, n_past, room):
        forced = self.forced(room if self.max_run is None else min(room, self.max_run))
        if not forced:
            return self.inner.propose(history, n_past, room)
        rest = room - len(forced)
        if rest > 0 and self.max_run is None and getattr(self.inner, "continues", False):
            more = self.inner.propose(history[:n_past + 1] + forced, n_past + len(forced), rest)
            self.inner.tentative(n_past + 1)
            if more.tokens:
                return Draft(forced + list(more.tokens), method=f"{METHOD}+{more.method or self.inner.name}",
                             grade=more.grade)
        return Draft(forced, method=METHOD, grade=GRADE)

    def forced(self, room):
        """The tokens the grammar forces after the pending token, at most ``room``."""
        if room <= 0:
            return []
        c = self.constraint
        text = c.forced_text()
        if not text:
            return []
        tokens = []
        try:
            tokens = self.vocab.tokenize(text.decode("utf-8"), add_special=False, parse_special=False)
        except UnicodeDecodeError:
            pass                          # ends inside a character: llguidance's tokens below
        tokens = tokens[:c.allowed_prefix(tokens[:room])]
        if not tokens:
            tokens = c.forced_tokens()[:room]
        return tokens

    def begin(self, history, n_past, target_row):
        self.inner.begin(history, n_past, target_row)

    def observe(self, history, n_past, target_row, drafted, accepted):
        self.inner.observe(history, n_past, target_row, drafted, accepted)

    # forget() and close() are the session's business: it owns the wrapped drafter.
