"""The small interface every drafting method implements.

The loop calls, for one answer:
``begin`` once after the prompt is in the target's KV cache, then per step
``propose`` (at most ``room`` tokens, possibly none) and, after the target verified,
``observe`` (what was committed and how many drafts were accepted).

Positions: ``history[:n_past]`` is in the target's KV cache and ``history[n_past]`` is
the pending token (committed, not yet decoded) that the next verify batch starts with.
``target_row`` is the row of the target's last decode whose output belongs to position
``n_past - 1`` (MTP reads the hidden state there), or None if nothing was decoded.

``room`` is the loop's limit (context, answer length, verify batch); a drafter applies
its own maximum ``n_max`` on top, once, in :meth:`Drafter.limit`.
"""
import numpy as np


class Draft:
    """A proposal: draft tokens and, where the method has them, their probabilities.

    ``grade`` is the drafter's own class of confidence in this draft (0: it has none),
    e.g. how much context an n-gram match had: the draft policy learns acceptance per
    method and grade, so a drafter whose guesses differ in quality gets each kind sized
    on its own record.
    """

    __slots__ = ("tokens", "probs", "method", "grade")

    def __init__(self, tokens=(), probs=None, method="", grade=0):
        self.tokens = tokens
        self.probs = probs
        self.method = method
        self.grade = grade


EMPTY = Draft()


class Drafter:
    """Base class: a drafter that never proposes anything (plain decoding)."""

    name = ""
    n_max = 0        # the most tokens this drafter proposes in one step
    # Whether ``propose`` may be given a history that runs past the committed one (tokens
    # drafted before it, e.g. a grammar's forced run) without learning from them.
    continues = False
    # Whether ``begin`` reads the target's hidden states of the prompt's rows (MTP,
    # NextN): a prompt read in another context (geniex.engine.prompt_reader) has none.
    reads_target_rows = False
    # Its settings as built, while an answer runs with a request's own (geniex.speculative.per_answer).
    as_loaded = None

    def limit(self, room):
        """How many tokens this step may draft: the loop's room within our maximum."""
        return min(room, self.n_max)

    def begin(self, history, n_past, target_row):
        """A new answer starts from ``history`` (see the module docstring)."""

    def propose(self, history, n_past, room):
        """Return a :class:`Draft` of at most ``limit(room)`` tokens to follow ``history[n_past]``."""
        return EMPTY

    def observe(self, history, n_past, target_row, drafted, accepted):
        """The target verified: ``drafted`` tokens were checked, ``accepted`` kept."""

    def tentative(self, committed):
        """The history of the last :meth:`propose` was committed up to ``committed`` only
        (a ``continues`` drafter was asked to draft after a forced run)."""

    def forget(self):
        """Drop what the drafter learned from earlier answers (n-gram memory)."""

    def close(self):
        """Free what the drafter owns (contexts, models)."""


NO_DRAFTER = Drafter()


class DrafterChain(Drafter):
    """Several methods at once: each step, the first non-empty proposal wins."""

    def __init__(self, drafters):
        self.drafters = list(drafters)
        self.name = ",".join(d.name for d in self.drafters)
        self.n_max = max(d.n_max for d in self.drafters)
        self.continues = all(d.continues for d in self.drafters)
        self.reads_target_rows = any(d.reads_target_rows for d in self.drafters)

    def begin(self, history, n_past, target_row):
        for d in self.drafters:
            d.begin(history, n_past, target_row)

    def propose(self, history, n_past, room):
        for d in self.drafters:
            draft = d.propose(history, n_past, room)
            if draft.tokens:
                if not draft.method:
                    draft.method = d.name
                return draft
        return EMPTY

    def observe(self, history, n_past, target_row, drafted, accepted):
        for d in self.drafters:
            d.observe(history, n_past, target_row, drafted, accepted)

    def tentative(self, committed):
        for d in self.drafters:
            d.tentative(committed)

    def forget(self):
        for d in self.drafters:
            d.forget()

    def close(self):
        for d in self.drafters:
            d.close()


TOP_K = 10   # upstream samples an MTP draft from the top 10 and scores it by their softmax


def top_choice(logits):
    """The most probable token and its probability within the top ``TOP_K`` (how upstream
    scores an MTP draft token against ``--draft-p-min``)."""
    top = np.argpartition(logits, -TOP_K)[-TOP_K:]
    vals = logits[top]
    j = int(np.argmax(vals))
    return int(top[j]), float(1.0 / np.exp(vals - vals[j]).sum())


class ModelDrafter(Drafter):
    """Draft generation shared by the methods that run a model (draft-simple, the MTP
    assistant, bundled NextN): score the current draft row, stop below ``p_min``, decode
    the proposal as the next row, until ``limit(room)`` tokens; drafts shorter than
    ``n_min`` are dropped. Subclasses say how to start, score and advance."""

    most = None      # the longest draft its context was made for (None: any)

    def __init__(self, n_max, n_min, p_min):
        self.n_max, self.n_min, self.p_min = n_max, n_min, p_min

    def propose(self, history, n_past, room):
        limit = self.limit(room)
        if limit < max(1, self.n_min) or not self.start(history, n_past):
            return EMPTY
        tokens, probs = [], []
        while True:
            tok, p = self.score()
            if p < self.p_min:
                break
            tokens.append(tok)
            probs.append(p)
            if len(tokens) == limit or not self.advance(tok, n_past + len(tokens)):
                break
        if not tokens or len(tokens) < self.n_min:
            return EMPTY
        return Draft(tokens, probs)

    def start(self, history, n_past):
        """Decode the first draft row (its output follows ``history[n_past]``); False
        when this step cannot draft."""
        raise NotImplementedError

    def score(self):
        """``(token, probability)`` of the draft row decoded last."""
        raise NotImplementedError

    def advance(self, token, pos):
        """Decode ``token`` (the proposal for position ``pos``) as the next draft row;
        False to stop drafting."""
        raise NotImplementedError
