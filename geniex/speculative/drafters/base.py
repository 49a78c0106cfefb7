"""The small interface every drafting method implements.

The loop calls, for one answer:
``begin`` once after the prompt is in the target's KV cache, then per step
``propose`` (up to ``n_max`` tokens, possibly none) and, after the target verified,
``observe`` (what was committed and how many drafts were accepted).

Positions: ``history[:n_past]`` is in the target's KV cache and ``history[n_past]`` is
the pending token (committed, not yet decoded) that the next verify batch starts with.
``target_row`` is the row of the target's last decode whose output belongs to position
``n_past - 1`` (MTP reads the hidden state there), or None if nothing was decoded.
"""


class Draft:
    """A proposal: draft tokens and, where the method has them, their probabilities."""

    __slots__ = ("tokens", "probs", "method")

    def __init__(self, tokens=(), probs=None, method=""):
        self.tokens = tokens
        self.probs = probs
        self.method = method


EMPTY = Draft()


class Drafter:
    """Base class: a drafter that never proposes anything."""

    name = "none"
    cap = 0          # the most tokens this drafter proposes in one step

    def begin(self, history, n_past, target_row):
        """A new answer starts from ``history`` (see the module docstring)."""

    def propose(self, history, n_past, n_max):
        """Return a :class:`Draft` of at most ``n_max`` tokens to follow ``history[n_past]``."""
        return EMPTY

    def observe(self, history, n_past, target_row, drafted, accepted):
        """The target verified: ``drafted`` tokens were checked, ``accepted`` kept."""

    def close(self):
        """Free what the drafter owns (contexts, models)."""


class DrafterChain(Drafter):
    """Several methods at once: each step, the first non-empty proposal wins."""

    def __init__(self, drafters):
        self.drafters = list(drafters)
        self.name = ",".join(d.name for d in self.drafters)
        self.cap = max(d.cap for d in self.drafters)

    def begin(self, history, n_past, target_row):
        for d in self.drafters:
            d.begin(history, n_past, target_row)

    def propose(self, history, n_past, n_max):
        for d in self.drafters:
            draft = d.propose(history, n_past, n_max)
            if draft.tokens:
                if not draft.method:
                    draft.method = d.name
                return draft
        return EMPTY

    def observe(self, history, n_past, target_row, drafted, accepted):
        for d in self.drafters:
            d.observe(history, n_past, target_row, drafted, accepted)

    def close(self):
        for d in self.drafters:
            d.close()
