"""How long each step's draft should be: the one that pays most, or none.

A verify row is not free on a CPU: a batch of r rows costs about ``1 + s*(r-1)`` one-row
decodes (``s`` ~0.3 for the demo model on 2 cores), so a long draft the target rejects
loses time, and on text without repeats n-gram drafting can run below plain decoding.
:class:`GainPolicy` (the default, ``--draft-policy auto``) picks each step's draft length
k to maximise expected committed tokens per unit of time:

    E(k) = 1 + a + a^2 + ... + a^k          (tokens a step commits; a = acceptance)
    T(k) = cost(k + 1) + d * k               (verify k+1 rows, draft k tokens)
    k*   = argmax E(k) / T(k) over 0..limit   (k* = 0: no draft this step)

``cost`` is measured when a model loads (:func:`calibrate`: a few decodes of 1 to 16
rows, cached per model file and thread setting); ``a`` is each drafting method's
per-token acceptance, learnt from every step it drafted (a decayed count of tokens
accepted before the first rejection); ``d`` is its measured drafting time per token
relative to a one-row decode (~0 for n-gram methods). Drafts cut by the policy still
teach it: the first token past the cut is compared with what the target said. ``--draft-
policy fixed`` drafts as long as the drafter offers (the caps ``--draft-tokens`` /
``--ngram-max``), for fixed-length comparisons. The output is the same either way.
"""
import json
import statistics
import time

DECAY = 0.95          # weight of the past in the acceptance counts, per step
PRIOR = (2.0, 1.0)    # (accepted, rejected) pseudo-counts: a method starts at a = 2/3
ROWS = (1, 2, 4, 8, 16)
EXPLORE = 8           # a drafter that costs time offers its one extra, teaching token this often
COSTLY = 0.05         # drafting time per token (in one-row decodes) above which that matters


class FixedPolicy:
    """Draft what the drafter offers, up to the loop's room."""

    name = "fixed"

    def cap(self, room):
        return room

    def take(self, method, offered):
        return offered

    def observe(self, method, draft, sampled, draft_time):
        pass

    def describe(self):
        return "draft policy: fixed (as long as the drafter offers)"


class GainPolicy:
    """Expected-gain draft lengths (see the module docstring)."""

    name = "auto"

    def __init__(self, slope, one_row_seconds):
        self.slope = max(0.0, slope)             # extra cost of a verify row, in one-row decodes
        self.one_row = max(one_row_seconds, 1e-6)
        self.stats = {}                           # method -> [accepted, rejected, draft cost d]
        self.last_k = 0
        self.steps = 0

    def _state(self, method):
        st = self.stats.get(method)
        if st is None:
            st = self.stats[method] = [PRIOR[0], PRIOR[1], 0.0]
        return st

    def best(self, method, limit):
        """The draft length in 0..limit with the most expected tokens per unit of time."""
        acc, rej, d = self._state(method)
        a = acc / (acc + rej)
        best_k, best_rate, gain, term = 0, 1.0, 1.0, 1.0
        for k in range(1, limit + 1):
            term *= a
            gain += term
            rate = gain / (1.0 + self.slope * k + d * k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def cap(self, room):
        """How much a drafter may draft this step: the best length of any method it has
        used, plus one token past it that the policy cuts but learns from (the target's
        own token at that row tells whether it was right). For an n-gram method that
        extra token is free; a model drafter pays a decode for it, so it is asked for
        only every :data:`EXPLORE` steps."""
        if not self.stats:
            return room
        self.steps += 1
        best = max(self.best(m, room) for m in self.stats)
        costly = max(st[2] for st in self.stats.values()) > COSTLY
        extra = 0 if costly and self.steps % EXPLORE else 1
        return min(room, best + extra)

    def take(self, method, offered):
        """How many of the ``offered`` draft tokens to verify."""
        self.last_k = self.best(method, offered)
        return self.last_k

    def observe(self, method, draft, sampled, draft_time):
        """Learn from a step: ``draft`` as offered (including tokens cut by :meth:`take`),
        ``sampled`` the target's tokens for the rows it verified."""
        if not draft:
            return
        st = self._state(method)
        n = min(len(draft), len(sampled))
        ok = 0
        while ok < n and draft[ok] == sampled[ok]:
            ok += 1
        st[0] = st[0] * DECAY + ok
        st[1] = st[1] * DECAY + (1 if ok < n else 0)
        per_token = draft_time / len(draft) / self.one_row
        st[2] = per_token if st[2] == 0.0 else 0.8 * st[2] + 0.2 * per_token

    def acceptance(self, method):
        acc, rej, _ = self._state(method)
        return acc / (acc + rej)

    def describe(self):
        return (f"draft policy: auto (a verify row costs {self.slope:.2f} of a one-row decode of "
                f"{self.one_row * 1000:.1f} ms)")


def calibrate(ctx, batch, token, repeats=3):
    """Measure the verify cost curve on ``ctx`` (empty on entry and on exit): returns
    ``(slope, one_row_seconds)`` of the least-squares line ``cost(r) = 1 + slope*(r-1)``
    through the median time of r-row decodes, r in :data:`ROWS`."""
    times = {}
    for r in ROWS:
        samples = []
        for _ in range(repeats):
            ctx.clear()
            batch.fill([token] * r, 0, all_logits=True)
            t0 = time.perf_counter()
            ctx.decode(batch)
            samples.append(time.perf_counter() - t0)
        times[r] = statistics.median(samples)
    ctx.clear()
    one = times[1]
    xs = [r - 1 for r in ROWS]
    ys = [times[r] / one - 1 for r in ROWS]
    slope = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return slope, one


class CalibrationCache:
    """Measured curves on disk, keyed by model file (path, size, mtime) and threads."""

    def __init__(self, path):
        self.path = path

    def _load(self):
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def get(self, key):
        value = self._load().get(key)
        return tuple(value) if isinstance(value, list) and len(value) == 2 else None

    def put(self, key, value):
        data = self._load()
        data[key] = list(value)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data), encoding="utf-8")
            tmp.replace(self.path)
        except OSError:
            pass        # a read-only data dir costs a calibration per load, nothing else
