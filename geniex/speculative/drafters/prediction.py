"""``prediction``: drafts from a text the request says the answer will mostly be.

OpenAI's Predicted Outputs (``prediction: {"type": "content", "content": ...}``): a
client that edits a file sends the file, and most of the answer repeats it. The
prediction's tokens are indexed once; each step the drafter finds where the answer's
last tokens occur in it and drafts what follows there. Where the answer keeps following
the prediction it continues from the same place; after an edit it looks the answer's
recent tokens up again (a longer match wins, then the nearest place after the last one).
The target verifies every draft as with any method, so the answer is the plain answer
token for token; only its speed depends on the prediction.
"""
from geniex.speculative.drafters.base import EMPTY, Draft, Drafter

METHOD = "prediction"
N_MAX = 16          # draft tokens per step (a wrong prediction costs one verify batch)
CONTEXT = 8         # answer tokens compared when looking the answer up in the prediction
MIN_MATCH = 2       # tokens that must match to jump to another place in the prediction


class PredictionDrafter(Drafter):
    """Draft the continuation of the answer's last tokens in ``tokens`` (the prediction).

    ``at`` is where the pending token (the last committed one) sits in the prediction:
    -1 before an answer's first token (the answer is expected to start as the
    prediction does), None when the answer has left it (looked up again next step)."""

    name = METHOD

    def __init__(self, tokens, n_max=N_MAX):
        self.tokens = list(tokens)
        self.n_max = n_max
        self.at = -1
        self.last = 0                        # the last place the answer followed the prediction
        self.places = {}                     # token -> the positions it occupies in the prediction
        for i, t in enumerate(self.tokens):
            self.places.setdefault(t, []).append(i)

    def begin(self, history, n_past, target_row):
        self.at, self.last = -1, 0

    def propose(self, history, n_past, room):
        limit = self.limit(room)
        if limit <= 0 or not self.tokens:
            return EMPTY
        at = self.at
        if at is None or at >= len(self.tokens) or (at >= 0 and self.tokens[at] != history[n_past]):
            at = self.at = self._find(history, n_past)
            if at is None:
                return EMPTY
        self.last = max(at, 0)
        draft = self.tokens[at + 1:at + 1 + limit]
        return Draft(draft, method=METHOD) if draft else EMPTY

    def _find(self, history, n_past):
        """The place of ``history[n_past]`` in the prediction with the longest run of the
        tokens before it matching too (at least :data:`MIN_MATCH`; ties: the first place
        at or after the last one followed), or None."""
        best, best_key = None, (MIN_MATCH - 1, 0)
        for p in self.places.get(history[n_past], ()):
            n = 1
            while n < CONTEXT and p - n >= 0 and n_past - n >= 0 and self.tokens[p - n] == history[n_past - n]:
                n += 1
            key = (n, -(p - self.last if p >= self.last else len(self.tokens) + self.last - p))
            if key > best_key:
                best, best_key = p, key
        return best

    def observe(self, history, n_past, target_row, drafted, accepted):
        # The answer moved on by the accepted drafts and the target's own token: where
        # the prediction had that token too, the next step continues from there
        # (propose checks it; a rejected draft means the answer left the prediction).
        if self.at is not None:
            self.at += accepted + 1
