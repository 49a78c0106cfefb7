"""Self-speculative drafters that look for repeats in the token history (no draft model).

Each keeps what it learned for the life of the loaded model, across answers and
conversations (bounded by :data:`MEMORY_TOKENS`; :meth:`_Indexed.forget` resets it), and
indexes each committed token once:

- ``ngram-mod``: map from the last ``n`` tokens to what followed them; a draft is the
  chain of lookups from the current suffix (variable length). Where a key was followed
  by different tokens, the occurrence with the longest matching context wins, and each
  draft token carries its chance of being right, from how long the text has matched
  what it follows (:class:`NgramMod`): the draft policy sizes the draft by it.
- ``ngram-simple``: the most recent earlier occurrence of the last ``n`` tokens; the
  draft is the tokens that followed it.
- ``ngram-map-k``: like ngram-simple through a key map, but a key is used only once it
  has occurred ``min_hits`` (2) times, which trades fewer drafts for better ones.
- ``ngram-map-k4v``: up to four continuations per key with counts; drafts the most
  frequent one when it clearly leads (at least twice the runner-up).
- ``ngram-cache``: counts of next tokens after 1..4-token contexts; drafts the most
  frequent next token from the longest context that has a clear winner, repeatedly.

Defaults: :data:`geniex.speculative.options.NGRAM_DEFAULTS`.
"""
from array import array
from collections import Counter

from geniex.llama.kv import common_prefix
from geniex.speculative.drafters.base import EMPTY, Draft, Drafter

# How many tokens of past answers (prompts included) a drafter remembers. Past it, the
# drafter starts over from the current answer: a bound on memory (a table entry per
# remembered position) that still holds many long conversations.
MEMORY_TOKENS = 1 << 18

# ngram-mod: how many recent occurrences of a key a lookup compares, and how many tokens
# of context before the key it compares (a longer match than this is as good as a tie).
CANDIDATES = 8
CONTEXT = 32
UNINDEXED = -2
# A match in another conversation's text counts only from where the current answer
# began (unless the whole context matched, CONTEXT tokens or back to the start of the
# text: the same request again), and this many tokens
# less than one in the current text: a few words shared with an unrelated text are
# mostly chance (the chat template that opens every answer is the common case).
ELSEWHERE = 4


class _Indexed(Drafter):
    """Shared bookkeeping: a corpus of every answer's history, each position indexed once.

    What a drafter learns lives as long as the loaded model (the Session), across
    answers and conversations, as llama.cpp's server keeps its ngram-mod table: an agent
    that sends a file again, or a chat that quotes an earlier answer, gets drafts from
    the start. The corpus holds one segment per answer; a conversation that goes on
    starts with the whole previous segment, which then grows in place instead of being
    copied. :meth:`forget` drops it all.
    """

    def __init__(self, name, n, n_min, n_max):
        self.name = name
        self.n, self.n_min, self.n_max = n, n_min, n_max
        self.forget()

    def forget(self):
        """Drop everything learned (the next answer starts from its own history only)."""
        self.corpus = []   # the histories of every answer so far, one segment each
        self.seg = 0       # where the current answer's segment starts in the corpus
        self.answer = 0    # where the current answer starts in the corpus (its prompt ends)
        self.indexed = 0   # corpus positions whose n-gram ending there is indexed
        self.clear()

    def clear(self):
        """Empty the method's tables."""

    def begin(self, history, n_past, target_row):
        segment = len(self.corpus) - self.seg
        if not (segment >= self.n and common_prefix(self.corpus[self.seg:], history) == segment):
            # Another text, or the same prompt sent again (an agent's retry): a new
            # segment, so that the previous answer stays in memory to draft from.
            self.seg = len(self.corpus)
        # else: the conversation goes on (the history starts with the whole segment),
        # and the segment grows in place.
        if len(self.corpus) > MEMORY_TOKENS:
            self.forget()
        self._sync(history, n_past + 1)
        self.answer = len(self.corpus)

    def observe(self, history, n_past, target_row, drafted, accepted):
        self._sync(history, n_past + 1)

    def _sync(self, history, upto):
        """Append ``history[:upto]``'s new tokens to the segment and index them."""
        corpus = self.corpus
        have = len(corpus) - self.seg
        if upto == have + 1:
            corpus.append(history[have])          # a step that committed one token: no slice
        elif upto > have:
            corpus.extend(history[have:upto])
        size = len(corpus)
        if self.indexed < size:
            for end in range(max(self.indexed, self.seg + self.n), size):
                self.add(corpus, end)
            self.indexed = size

    def add(self, corpus, end):
        """Record that corpus[end - n:end] was followed by corpus[end]."""
        raise NotImplementedError

    def _continuation(self, end, room):
        """The corpus tokens from ``end`` on, as many as this step may draft."""
        if end is None or end >= len(self.corpus):
            return []
        return self.corpus[end:end + self.limit(room)]

    def _finish(self, tokens, room, grade=0):
        tokens = tokens[:self.limit(room)]
        return Draft(tokens, grade=grade) if tokens and len(tokens) >= self.n_min else EMPTY


class NgramMod(_Indexed):
    """n-gram -> the tokens that followed it, drafting a chain of lookups.

    Upstream's table keeps one next token per n-gram, the latest, so where a text says
    the same n tokens twice with different continuations (indented code, a refrain, the
    template's "assistant" turn opening every answer) a lookup drafts whichever came last.
    Here a key keeps its recent occurrences, and a lookup takes the one whose preceding
    context matches the current text longest (the latest among equals). The draft then
    follows that occurrence's continuation and looks up again where memory ends, so a
    loop in the text goes on being drafted as upstream's chain does.

    Draft lengths follow what SuffixDecoding found (Oliaro et al., 2024; vLLM's
    ``suffix`` method): the longer the text has matched an earlier text, the likelier it
    goes on matching, so each draft token carries a probability from the match length
    behind it (:func:`_confidence`): the key, its matching context, and the draft tokens
    before it. Where earlier texts went on differently after the same words, the first
    token's probability is the share that went on this way (their frequencies); a match
    with another conversation counts only from where the current answer began (the
    template that opens every answer, and the words every request ends with, are not
    evidence) and :data:`ELSEWHERE` tokens less. The draft policy verifies as many tokens
    as pay off at those probabilities (calibrated per bucket against what the target
    accepts), so a verbatim copy of the prompt is drafted long from its first tokens and
    text with nothing to copy costs nothing. The context matched is also the draft's
    grade (:func:`_grade`), shown in the trace.
    """

    def clear(self):
        self.last = {}                 # key -> latest end e (corpus[e] followed the key)
        # prev[e]: the previous end with the same key as e (-1: none); UNINDEXED where
        # e is not in the table (a segment's first n positions, or before a reset).
        self.prev = array("q", [UNINDEXED]) * len(self.corpus)

    def add(self, corpus, end):
        key = tuple(corpus[end - self.n:end])
        prev = self.prev
        if len(prev) < end:                # positions not indexed (a segment's first n)
            prev.extend(array("q", [UNINDEXED]) * (end - len(prev)))
        prev.append(self.last.get(key, -1))
        self.last[key] = end

    def propose(self, history, n_past, room):
        self._sync(history, n_past + 1)    # a no-op unless a caller skipped observe()
        limit = self.limit(room)
        corpus, prev, out, probs = self.corpus, self.prev, [], []
        grade = 0
        while len(out) < limit:
            e, context, match, share = self._best(out)
            if e is None:
                break
            if not out:
                grade = _grade(context)
            # The draft token's chance grows with how long the text has matched what it
            # follows: the key, the context before it, and each draft token after it (as
            # if the ones before were accepted).
            p = _confidence(match) * share
            # Follow the occurrence while memory lasts (and within its segment: a
            # position past the next segment's start is not indexed).
            while len(out) < limit:
                out.append(corpus[e])
                probs.append(p)
                match += 1
                p = _confidence(match)
                e += 1
                if e >= len(prev) or prev[e] == UNINDEXED:
                    break
        draft = self._finish(out, room, grade)
        if draft.tokens:
            draft.probs = probs[:len(draft.tokens)]
        return draft

    def _best(self, out):
        """``(end, context, match, share)``: the end position whose key is the text's last n
        tokens (the corpus followed by the draft so far) and whose earlier context matches
        the text's longest; how many tokens of that context matched; how many tokens of
        match that is worth (:data:`ELSEWHERE`); and the share of the occurrences worth as
        much that go on with the same token (where earlier texts went on differently after
        the same words, the draft is only that likely). ``(None, 0, 0, 0.0)`` if none."""
        corpus, n = self.corpus, self.n
        total = len(corpus) + len(out)
        if total - self.seg < n:
            return None, 0, 0, 0.0             # the text is its segment: shorter than a key
        short = n - len(out)               # key tokens that come from the corpus
        if not out:
            key = tuple(corpus[-n:])       # the step's first lookup: one slice, no concatenation
        else:
            key = tuple(corpus[len(corpus) - short:] + out) if short > 0 else tuple(out[-n:])
        answered = total - self.answer     # text tokens since this answer began
        whole = min(CONTEXT, total - n - self.seg)   # a context this long matched it all
        e = self.last.get(key)
        best, best_match, best_context, tried, ties, agree = None, -CONTEXT - n, 0, 0, 0, 0
        while e is not None and e >= 0 and tried < CANDIDATES:
            context = self._context(e, out, total)
            match = context + n
            if e < self.seg and context < whole:
                # Another conversation's text (not the same request again): what matched
                # before this answer began is mostly the chat template and the words
                # every request ends with.
                match = min(match, answered) - ELSEWHERE
            if best is None or match > best_match:
                best, best_match, best_context, ties, agree = e, match, context, 1, 1
                if context == CONTEXT:
                    break                      # newest full match: none can do better
            elif match == best_match:
                ties += 1
                agree += corpus[e] == corpus[best]
            e = self.prev[e]
            tried += 1
        if best is None:
            return None, 0, 0, 0.0
        return best, best_context, best_match, agree / ties

    def _context(self, e, out, total):
        """How many tokens before occurrence ``e``'s key equal those before the text's
        key (up to CONTEXT; the text starts at its segment)."""
        corpus, n, size, start = self.corpus, self.n, len(self.corpus), self.seg
        a, b, m = e - n - 1, total - n - 1, 0
        while m < CONTEXT and a >= 0 and b >= start:
            if corpus[a] != (corpus[b] if b < size else out[b - size]):
                break
            a, b, m = a - 1, b - 1, m + 1
        return m

def _confidence(match):
    """The chance that a text which has matched an earlier one for ``match`` tokens goes
    on as it did: 1 - 1/match, the rule that fits the acceptance of the demo model's
    drafts by match length on the bench's workloads (tools/bench/counts.py); the longer a
    text has followed another, the likelier it goes on following it. The draft policy
    calibrates it per probability bucket."""
    return 1.0 - 1.0 / match if match > 1 else 0.0


def _grade(context):
    """ngram-mod's confidence class for a draft whose first lookup matched ``context``
    tokens before the key: 1 (none), 2 (1-7), 3 (8 up to CONTEXT), 4 (CONTEXT or more)."""
    return 1 if context == 0 else 2 if context < 8 else 3 if context < CONTEXT else 4


class NgramSimple(_Indexed):
    """Most recent earlier occurrence of the current n-gram -> the tokens after it."""

    continues = True      # propose() only reads its tables

    def clear(self):
        self.last = {}        # n-gram -> corpus position after its latest occurrence

    def add(self, corpus, end):
        self.last[tuple(corpus[end - self.n:end])] = end

    def propose(self, history, n_past, room):
        key = tuple(history[n_past + 1 - self.n:n_past + 1])
        end = self.last.get(key) if len(key) == self.n else None
        return self._finish(self._continuation(end, room), room)


class NgramMapK(_Indexed):
    """Key n-gram -> (continuation m-gram, hits); drafts after ``min_hits`` repeats."""

    continues = True      # propose() only reads its tables

    min_hits = 2   # occurrences of the key before it is trusted (ngram-simple trusts one)

    def clear(self):
        self.last = {}
        self.hits = Counter()

    def add(self, corpus, end):
        key = tuple(corpus[end - self.n:end])
        self.hits[key] += 1
        self.last[key] = end

    def propose(self, history, n_past, room):
        key = tuple(history[n_past + 1 - self.n:n_past + 1])
        if self.hits[key] < self.min_hits:
            return EMPTY
        return self._finish(self._continuation(self.last.get(key), room), room)


class NgramMapK4V(_Indexed):
    """Key n-gram -> up to four continuation m-grams with counts."""

    continues = True      # propose() only reads its tables

    def clear(self):
        self.values = {}      # key -> {mgram: count}
        self.pending = []     # (key, end) whose continuation is not complete yet

    def begin(self, history, n_past, target_row):
        self.pending = []     # continuations of the last answer never completed
        super().begin(history, n_past, target_row)

    def add(self, corpus, end):
        self.pending.append((tuple(corpus[end - self.n:end]), end))
        m = self.n_max
        keep = []
        for key, e in self.pending:
            if e + m <= end + 1:
                vals = self.values.setdefault(key, {})
                mgram = tuple(corpus[e:e + m])
                if mgram in vals or len(vals) < 4:
                    vals[mgram] = vals.get(mgram, 0) + 1
            else:
                keep.append((key, e))
        self.pending = keep

    def propose(self, history, n_past, room):
        key = tuple(history[n_past + 1 - self.n:n_past + 1])
        vals = self.values.get(key)
        if not vals:
            return EMPTY
        ranked = sorted(vals.items(), key=lambda kv: -kv[1])
        if len(ranked) > 1 and ranked[0][1] < 2 * ranked[1][1]:
            return EMPTY
        return self._finish(list(ranked[0][0]), room)


class NgramCache(_Indexed):
    """Next-token counts after 1..n-token contexts (the dynamic n-gram cache)."""

    continues = True      # propose() only reads its tables

    def clear(self):
        self.counts = [dict() for _ in range(self.n + 1)]   # counts[k][context] = Counter

    def add(self, corpus, end):
        for k in range(1, self.n + 1):
            ctx = tuple(corpus[end - k:end])
            self.counts[k].setdefault(ctx, Counter())[corpus[end]] += 1

    def propose(self, history, n_past, room):
        seq = list(history[max(0, n_past + 1 - self.n):n_past + 1])
        out = []
        limit = self.limit(room)
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
        return self._finish(out, room)


CLASSES = {
    "ngram-mod": NgramMod,
    "ngram-simple": NgramSimple,
    "ngram-map-k": NgramMapK,
    "ngram-map-k4v": NgramMapK4V,
    "ngram-cache": NgramCache,
}


def make(name, spec):
    """Build the n-gram drafter ``name`` from SpecOptions (0 = the method's default)."""
    return CLASSES[name](name, *spec.ngram_settings(name))
