"""Self-speculative drafters that look for repeats in the token history (no draft model).

All four index the history incrementally (each committed token is indexed once):

- ``ngram-mod``: map from the last ``n`` tokens to the token that followed them; a draft
  is the chain of lookups from the current suffix (variable length). The table is
  cleared when acceptance stays under 25% for 5 drafted steps, as upstream does.
- ``ngram-simple``: the most recent earlier occurrence of the last ``n`` tokens; the
  draft is the tokens that followed it.
- ``ngram-map-k``: like ngram-simple through a key map, but a key is used only once it
  has occurred ``min_hits`` (2) times, which trades fewer drafts for better ones.
- ``ngram-map-k4v``: up to four continuations per key with counts; drafts the most
  frequent one when it clearly leads (at least twice the runner-up).
- ``ngram-cache``: counts of next tokens after 1..4-token contexts; drafts the most
  frequent next token from the longest context that has a clear winner, repeatedly.

Defaults (chosen by measurement on the demo model with ``tools/bench_ngram.py``): match length 4 (ngram-map-k and ngram-cache 3), drafts of 2 to
8 tokens.
"""
from collections import Counter

from geniex.speculative.drafters.base import EMPTY, Draft, Drafter

DEFAULTS = {  # name: (n, min, max)
    "ngram-mod": (4, 2, 8),
    "ngram-simple": (4, 2, 8),
    "ngram-map-k": (3, 2, 8),
    "ngram-map-k4v": (4, 2, 8),
    "ngram-cache": (3, 2, 8),
}


class _Indexed(Drafter):
    """Shared bookkeeping: index every history position exactly once."""

    def __init__(self, name, n, n_min, n_max):
        self.name = name
        self.n, self.n_min, self.n_max = n, n_min, n_max
        self.cap = n_max
        self.indexed = 0   # history positions whose n-gram ending there has been indexed

    def begin(self, history, n_past, target_row):
        # A new answer may share a prefix with the previous one (conversation reuse) or
        # not; rebuilding from the history is simplest and cheap next to a prefill.
        self.reset()
        self._index(history, n_past + 1)

    def reset(self):
        self.indexed = 0

    def observe(self, history, n_past, target_row, drafted, accepted):
        self._index(history, n_past + 1)

    def _index(self, history, upto):
        """Index n-grams ending at positions [self.indexed, upto) with their next token."""
        start = max(self.indexed, self.n)
        for end in range(start, upto):
            self.add(history, end)
        self.indexed = max(self.indexed, upto)

    def add(self, history, end):
        """Record that history[end - n:end] was followed by history[end]."""
        raise NotImplementedError

    def _finish(self, tokens, n_max):
        tokens = tokens[:min(n_max, self.n_max)]
        return Draft(tokens) if len(tokens) >= self.n_min else EMPTY


class NgramMod(_Indexed):
    """n-gram -> next token, drafting a chain of lookups."""

    def reset(self):
        super().reset()
        self.table = {}
        self.low_rounds = 0

    def add(self, history, end):
        self.table[tuple(history[end - self.n:end])] = history[end]

    def propose(self, history, n_past, n_max):
        key = history[n_past + 1 - self.n:n_past + 1]
        if len(key) < self.n:
            return EMPTY
        out = []
        limit = min(n_max, self.n_max)
        table = self.table
        while len(out) < limit:
            nxt = table.get(tuple(key))
            if nxt is None:
                break
            out.append(nxt)
            key = key[1:] + [nxt]
        return self._finish(out, n_max)

    def observe(self, history, n_past, target_row, drafted, accepted):
        super().observe(history, n_past, target_row, drafted, accepted)
        if drafted:
            self.low_rounds = self.low_rounds + 1 if accepted < 0.25 * drafted else 0
            if self.low_rounds >= 5:
                # The table keeps predicting what the target no longer says: start over
                # from the current answer only.
                self.table.clear()
                self.low_rounds = 0


class NgramSimple(_Indexed):
    """Most recent earlier occurrence of the current n-gram -> the tokens after it."""

    def reset(self):
        super().reset()
        self.last = {}        # n-gram -> end position of its latest occurrence

    def add(self, history, end):
        self.last[tuple(history[end - self.n:end])] = end

    def propose(self, history, n_past, n_max):
        key = tuple(history[n_past + 1 - self.n:n_past + 1])
        end = self.last.get(key) if len(key) == self.n else None
        if end is None or end > n_past:
            return EMPTY
        return self._finish(history[end:min(end + min(n_max, self.n_max), n_past + 1)], n_max)


class NgramMapK(_Indexed):
    """Key n-gram -> (continuation m-gram, hits); drafts after ``min_hits`` repeats."""

    min_hits = 2   # occurrences of the key before it is trusted (ngram-simple trusts one)

    def reset(self):
        super().reset()
        self.last = {}
        self.hits = Counter()

    def add(self, history, end):
        key = tuple(history[end - self.n:end])
        self.hits[key] += 1
        self.last[key] = end

    def propose(self, history, n_past, n_max):
        key = tuple(history[n_past + 1 - self.n:n_past + 1])
        end = self.last.get(key)
        if end is None or end > n_past or self.hits[key] < self.min_hits:
            return EMPTY
        return self._finish(history[end:min(end + min(n_max, self.n_max), n_past + 1)], n_max)


class NgramMapK4V(_Indexed):
    """Key n-gram -> up to four continuation m-grams with counts."""

    def reset(self):
        super().reset()
        self.values = {}      # key -> {mgram: count}
        self.pending = []     # (key, end) whose continuation is not complete yet

    def add(self, history, end):
        self.pending.append((tuple(history[end - self.n:end]), end))
        m = self.n_max
        keep = []
        for key, e in self.pending:
            if e + m <= end + 1:
                vals = self.values.setdefault(key, {})
                mgram = tuple(history[e:e + m])
                if mgram in vals or len(vals) < 4:
                    vals[mgram] = vals.get(mgram, 0) + 1
            else:
                keep.append((key, e))
        self.pending = keep

    def propose(self, history, n_past, n_max):
        key = tuple(history[n_past + 1 - self.n:n_past + 1])
        vals = self.values.get(key)
        if not vals:
            return EMPTY
        ranked = sorted(vals.items(), key=lambda kv: -kv[1])
        if len(ranked) > 1 and ranked[0][1] < 2 * ranked[1][1]:
            return EMPTY
        return self._finish(list(ranked[0][0]), n_max)


class NgramCache(_Indexed):
    """Next-token counts after 1..n-token contexts (the dynamic n-gram cache)."""

    def reset(self):
        super().reset()
        self.counts = [dict() for _ in range(self.n + 1)]   # counts[k][context] = Counter

    def _index(self, history, upto):
        for end in range(max(self.indexed, 1), upto):
            for k in range(1, min(self.n, end) + 1):
                ctx = tuple(history[end - k:end])
                self.counts[k].setdefault(ctx, Counter())[history[end]] += 1
        self.indexed = max(self.indexed, upto)

    def propose(self, history, n_past, n_max):
        seq = list(history[max(0, n_past + 1 - self.n):n_past + 1])
        out = []
        limit = min(n_max, self.n_max)
        while len(out) < limit:
            nxt = None
            for k in range(min(self.n, len(seq)), 0, -1):
                c = self.counts[k].get(tuple(seq[-k:]))
                if c:
                    (tok, top), *rest = c.most_common(2)
                    # Trust a context only when its favourite is clearly ahead.
                    if top >= 2 and (not rest or top >= 2 * rest[0][1]):
                        nxt = tok
                    break
            if nxt is None:
                break
            out.append(nxt)
            seq.append(nxt)
        return self._finish(out, n_max)


CLASSES = {
    "ngram-mod": NgramMod,
    "ngram-simple": NgramSimple,
    "ngram-map-k": NgramMapK,
    "ngram-map-k4v": NgramMapK4V,
    "ngram-cache": NgramCache,
}


def make(name, spec):
    """Build the n-gram drafter ``name`` from SpecOptions (0 = method default)."""
    n, n_min, n_max = DEFAULTS[name]
    return CLASSES[name](name, spec.ngram_n or n, spec.ngram_min or n_min, spec.ngram_max or n_max)
