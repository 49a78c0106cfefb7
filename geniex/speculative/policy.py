"""How long each step's draft should be: the one that pays most, or none.

A verify row is not free on a CPU: the demo model on 2 cores is compute-bound, a batch of
2 rows costs about two one-row decodes and each further row a good part of one (``--verbose``
prints the measured curve), so a short draft barely pays even when it is right, a long
draft the target rejects loses time, and on text without repeats n-gram drafting can run
below plain decoding.
:class:`GainPolicy` (the default, ``--draft-policy auto``) picks each step's draft length
k to maximise expected committed tokens per unit of time:

    E(k) = 1 + a + a^2 + ... + a^k          (tokens a step commits; a = acceptance)
    T(k) = cost(k + 1) + d * k               (verify k+1 rows, draft k tokens)
    k*   = argmax E(k) / T(k) over 0..limit   (k* = 0: no draft this step)

Beside other slots (``serve --parallel``) a step's verify joins one decode with their
rows, which every answer in it waits for, so the rate is the whole decode's: E(k) plus
one token per other answer, over cost(other rows + k + 1) (:attr:`GainPolicy.company`);
where extra rows cost little alone but tip a full batch over a kernel step, a draft that
pays alone is dropped there, and speculation with several clients is not slower than none.
``cost`` is measured when a model loads (:func:`calibrate`: the fastest of a few decodes
of every size from 1 to 8 rows and of 16, interpolated between 8 and 16; cached per model
file, threads and KV cache type), on every core and, where the thread governor may move the answer to one
thread, on one thread too (a batch row costs more there than on every core), and the
policy uses the curve of the governor's setting;
``a`` is the per-token acceptance of each drafting method's drafts of the draft's grade
(the drafter's own confidence class: for ngram-mod, how much context before the key
matched; 0 for methods without one), learnt from every step it drafted (a decayed count
of tokens accepted before the first rejection); ``d`` is its measured drafting time per
token relative to a one-row decode (0 for n-gram methods, whose lookup time does not grow
with the draft: measuring it would let a slow moment make a cheap drafter look costly,
and a drafter asked for fewer tokens than its minimum never drafts again). A drafter that gives each
draft token its own probability (draft-simple and draft-mtp: the draft model's; ngram-mod:
from how long the text has matched what it follows) has the i-th token's acceptance read
from the learnt record of that probability's bucket (:data:`PROB_EDGES`, starting from
trusting the drafter), so E(k) = 1 + a1 + a1*a2 + ... and a draft is cut where the
drafter's confidence drops. Drafts cut by the policy still
teach it: the first token past the cut is compared with what the target said (n-gram
methods offer their whole draft every step, since drafting costs them nothing; a model
drafter, whose tokens each cost a decode, offers one token past the policy's length only
every :data:`EXPLORE` steps). ``--draft-policy fixed`` drafts as long as the drafter offers (the caps ``--draft-tokens`` /
``--ngram-max``), for fixed-length comparisons. The output is the same either way.
"""
import contextlib
import json
import os
import time
from bisect import bisect_right
from pathlib import Path

from geniex import files
from geniex.speculative.options import NGRAM_METHODS

DECAY = 0.95          # weight of the past in the acceptance counts, per step
# (accepted, rejected) pseudo-counts a record starts from, by draft grade: an ungraded
# method starts at a = 2/3; ngram-mod's grades 1-4 start at the per-token acceptance
# measured for them with fixed lengths, so that a verbatim repeat is drafted from its
# first sighting (ngram-mod's drafts carry per-token probabilities, which decide instead).
PRIORS = {0: (2.0, 1.0), 1: (2.0, 1.0), 2: (2.5, 0.5), 3: (2.75, 0.25), 4: (2.95, 0.05)}
# Every size up to 8 rows: a batch's cost on this CPU is a staircase, not a line (the
# demo model's Q4_1 kernels take rows in pairs, so 3 rows cost about what 4 do; repacked
# Q4_0 weights take them in fours, so 7 rows cost more than 8), and a curve interpolated
# between 1, 2, 4 and 8 priced 3, 5 and 7 rows 10-15% below what they cost
# (tools/bench/BENCHMARKS.md, "Verify cost").
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
REPEATS = 3           # decodes of each size when calibrating (the fastest counts)
# Part of the calibration cache's key: curves measured the way this version measures them
# (sizes taking turns) replace those measured before (each size's decodes in one burst).
# v4: every size up to 8 rows (v3 curves lack 3, 5, 6 and 7, and are measured again).
CALIBRATION = "v4"
STALLED = 1.5         # a batch measured above this many times its rows: a stall, not a cost
EXPLORE = 8           # a drafter that costs time offers its one extra, teaching token this often
COSTLY = 0.05         # drafting time per token (in one-row decodes) above which that matters
KEEP = 64             # calibration entries kept on disk
MAX_CACHE_FILE = 4 << 20   # bytes of calibration.json read (64 entries take a few kB)
# A drafter's own probability for each draft token, in buckets: each bucket learns how
# often such tokens are accepted, starting from the bucket's middle probability
# (PROB_WEIGHT pseudo-counts), i.e. from trusting the drafter. Fine near 1, where
# ngram-mod's long matches sit and a draft's best length changes most.
PROB_EDGES = (0.3, 0.5, 0.7, 0.85, 0.9, 0.95, 0.97, 0.985)
PROB_WEIGHT = 3.0


class FixedPolicy:
    """Draft what the drafter offers, up to the loop's room."""

    name = "fixed"

    def cap(self, room):
        return room

    def take(self, method, offered, grade=0, probs=None):
        return offered

    def observe(self, method, draft, sampled, draft_time, grade=0, probs=None):
        pass

    def describe(self):
        return "draft policy: fixed (as long as the drafter offers)"


class GainPolicy:
    """Expected-gain draft lengths (see the module docstring)."""

    name = "auto"

    def __init__(self, costs, one_row_seconds, others=None, setting=None):
        """``costs``: {rows: time of a decode of that many rows / time of one row} on the
        context's own thread setting ("all"); ``others``: {setting name: costs} for the
        settings a thread governor may move the context to, and ``setting`` a callable
        naming the current one (the curve then follows it)."""
        self.measured = {int(r): float(c) for r, c in costs.items()}   # as measured (the bench reports it)
        self.costs = plausible(self.measured)
        self.one_row = max(one_row_seconds, 1e-6)
        self.curves = {name: plausible({int(r): float(c) for r, c in curve.items()})
                       for name, curve in (others or {}).items()}
        self.curves["all"] = self.costs
        self.setting = setting or (lambda: "all")
        self._cost = {}                          # setting -> [cost of verifying k drafts (k+1 rows)]
        self.stats = {}                           # (method, grade) -> [accepted, rejected, draft cost d]
        self.calibration = {}                     # method -> [accepted, rejected] per probability bucket
        self.steps = 0
        self.costly = False                       # some method's drafting time per token is above COSTLY
        # () -> (rows, answers) the other slots put in the shared decode this policy's
        # verify joins (geniex.engine.batcher.Batcher.company); None: it decodes alone.
        self.company = None

    def verify_cost(self, k, setting="all"):
        """Time of a (k+1)-row verify in one-row decodes on ``setting`` (a name from
        ``others``, or "all": the context's own), interpolated between measured row counts
        (and extended along the last measured segment)."""
        if setting not in self.curves:
            setting = "all"
        cost = self._cost.setdefault(setting, [1.0])
        while len(cost) <= k:
            cost.append(_interpolate(self.curves[setting], len(cost) + 1))
        return cost[k]

    def _state(self, method, grade=0):
        st = self.stats.get((method, grade))
        if st is None:
            acc, rej = PRIORS.get(grade, PRIORS[0])
            st = self.stats[(method, grade)] = [acc, rej, 0.0]
        return st

    def _calibration(self, method):
        cal = self.calibration.get(method)
        if cal is None:
            edges = (0.0, *PROB_EDGES, 1.0)
            mids = [(lo + hi) / 2 for lo, hi in zip(edges, edges[1:])]
            cal = self.calibration[method] = [[PROB_WEIGHT * m, PROB_WEIGHT * (1 - m)] for m in mids]
        return cal

    def best(self, method, limit, grade=0, probs=None):
        """The draft length in 0..limit with the most expected tokens per unit of time,
        for a draft of ``method`` and ``grade`` (see :class:`~geniex.speculative.drafters.base.Draft`);
        with ``probs`` (a model drafter's probability per draft token, at least ``limit``
        of them) each token's acceptance is its probability bucket's record instead of
        the method's mean."""
        if limit <= 0:
            return 0                              # nothing offered: the step is a plain one
        acc, rej, d = self._state(method, grade)
        a = acc / (acc + rej)
        cal = self._calibration(method) if probs is not None else None
        setting = self.setting()
        # Beside other slots a verify row is priced at what it adds to the whole shared
        # decode, which every answer in it waits for: the step's tokens are this answer's
        # expected ones plus one per other answer, its time the decode of everyone's rows.
        rows, others = self.company() if self.company is not None else (0, 0)
        best_k, gain, term = 0, 1.0, 1.0
        best_rate = (1.0 + others) / self.verify_cost(rows, setting)
        for k in range(1, limit + 1):
            if cal is None:
                term *= a
            else:
                hit, miss = cal[bisect_right(PROB_EDGES, probs[k - 1])]
                term *= hit / (hit + miss)
            gain += term
            rate = (gain + others) / (self.verify_cost(rows + k, setting) + d * k)
            if rate > best_rate:
                best_k, best_rate = k, rate
            elif term < 0.01:
                break                             # further tokens add nothing
        return best_k

    def cap(self, room):
        """How much a drafter may draft this step (see the module docstring)."""
        if not self.stats:
            return room
        self.steps += 1
        if not self.costly:
            return room                           # drafting costs nothing measurable: offer it all
        best = max(self.best(m, room, g) for m, g in self.stats)
        return min(room, best + (0 if self.steps % EXPLORE else 1))

    def take(self, method, offered, grade=0, probs=None):
        """How many of the ``offered`` draft tokens to verify (``probs``: the drafter's
        probability for each, where it has them)."""
        return self.best(method, offered, grade, probs)

    def observe(self, method, draft, sampled, draft_time, grade=0, probs=None):
        """Learn from a step: ``draft`` as offered (including tokens cut by :meth:`take`),
        ``sampled`` the target's tokens for the rows it verified, ``probs`` the drafter's
        probability per draft token (model drafters)."""
        if not draft:
            return
        if probs is not None:
            cal = self._calibration(method)
            for i in range(min(len(draft), len(sampled), len(probs))):
                rec, hit = cal[bisect_right(PROB_EDGES, probs[i])], draft[i] == sampled[i]
                rec[0] = rec[0] * DECAY + hit
                rec[1] = rec[1] * DECAY + (not hit)
                if not hit:
                    break
        st = self._state(method, grade)
        n = min(len(draft), len(sampled))
        ok = 0
        while ok < n and draft[ok] == sampled[ok]:
            ok += 1
        st[0] = st[0] * DECAY + ok
        st[1] = st[1] * DECAY + (1 if ok < n else 0)
        if method in NGRAM_METHODS:
            return      # a lookup's time does not grow with the draft: no per-token cost
        per_token = draft_time / len(draft) / self.one_row
        st[2] = per_token if st[2] == 0.0 else 0.8 * st[2] + 0.2 * per_token
        self.costly = max(rec[2] for rec in self.stats.values()) > COSTLY

    def acceptance(self, method, grade=0):
        """The learnt per-token acceptance of ``method``'s drafts of ``grade``."""
        acc, rej, _ = self._state(method, grade)
        return acc / (acc + rej)

    def describe(self):
        def show(costs):
            return ", ".join(f"{r}: {c:.2f}" for r, c in sorted(costs.items()))
        others = "".join(f"; on the thread governor's '{name}' setting: {show(curve)}"
                         for name, curve in self.curves.items() if name != "all")
        return (f"draft policy: auto (verify cost in one-row decodes of {self.one_row * 1000:.1f} ms, "
                f"by rows: {show(self.costs)}{others})")


def _interpolate(costs, rows):
    pts = sorted(costs.items())
    if rows <= pts[0][0]:
        return pts[0][1]
    for (r0, c0), (r1, c1) in zip(pts, pts[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    (r0, c0), (r1, c1) = pts[-2], pts[-1]
    return c1 + (c1 - c0) * (rows - r1) / (r1 - r0)


def calibrate(ctx, batch, token, repeats=REPEATS):
    """Measure the verify cost curve on ``ctx`` (empty on entry and on exit): returns
    ``({rows: time / one-row time}, one-row seconds)`` for rows in :data:`ROWS`, each the
    fastest of ``repeats`` decodes (a busy neighbour only ever slows a decode down).

    The sizes take turns (1, 2, ... 8, 16 rows, then again), so that a slow spell of the
    machine falls on every size alike instead of on the few decodes of one size: three
    one-row decodes measured during a neighbour's burst made every batch look cheap, and
    the curve is cached for the model. Each timed decode follows a one-row decode, as in
    an answer. The policy prices drafts by the curve made :func:`plausible`; a
    :func:`stalled` one is measured again at the next load."""
    times = dict.fromkeys(ROWS, float("inf"))
    for _ in range(repeats):
        for r in ROWS:
            # Each timed decode follows a one-row decode, as in an answer: a one-row step
            # after another reuses its graph (plain decoding's case), a verify batch
            # follows a step of another size and builds its own (a few percent of a
            # one-row decode on the demo model).
            ctx.clear()
            ctx.decode(batch.fill([token], 0, all_logits=True))
            ctx.clear()
            batch.fill([token] * r, 0, all_logits=True)
            t0 = time.perf_counter()
            ctx.decode(batch)
            times[r] = min(times[r], time.perf_counter() - t0)
    ctx.clear()
    one = times[1]
    return {r: times[r] / one for r in ROWS}, one


def plausible(costs):
    """A measured curve made physically possible: a batch never costs less than a smaller
    one (it does all of that one's work and more), nor less than a one-row decode, nor
    more than its rows decoded one at a time (which the loop could do instead, with the
    same logits on the quantized KV cache). A point outside those bounds was measured in
    a quiet instant or a stall of a busy machine (8 rows at 20 one-row decodes, while
    other processes held both cores) and is clamped."""
    out, floor = {}, 1.0
    for r in sorted(costs):
        out[r] = floor = min(max(float(costs[r]), floor), float(max(r, floor)))
    return out


def stalled(costs):
    """Whether a measured curve shows multi-threaded batches stalling (some batch costing
    well over its rows decoded one at a time): such a curve is used for the load it was
    measured at, and measured again at the next one."""
    return any(float(c) > STALLED * int(r) for r, c in costs.items())


def model_key(path):
    """How a model file's calibration keys start: its resolved path, size and mtime (a
    rewritten file is measured again)."""
    st = Path(path).stat()
    return f"{Path(path).resolve()}|{st.st_size}|{int(st.st_mtime)}|"


class CalibrationCache:
    """Measured curves on disk, keyed by model file (path, size, mtime) and threads; the
    newest :data:`KEEP` entries are kept."""

    def __init__(self, path):
        self.path = path

    def _load(self):
        # Anything but a small regular file (a FIFO would block the load, a symlink leads
        # out of the data dir) is no cache: the model is calibrated again.
        try:
            data = json.loads(files.read_bounded(self.path, MAX_CACHE_FILE))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key):
        """``(costs, one_row_seconds)`` or None (also for a curve measured during stalls:
        it is measured again)."""
        value = self._load().get(key)
        if isinstance(value, dict) and value.get("stalled"):
            return None
        try:
            costs, one = value["costs"], float(value["one_row"])
            return {int(r): float(c) for r, c in costs.items()}, one
        except (TypeError, KeyError, ValueError, AttributeError):
            return None

    def put(self, key, value, stalled=False):
        """Keep ``value`` = ``(costs, one_row_seconds)``; a ``stalled`` one only until the
        next load measures again."""
        record = {"costs": {str(r): c for r, c in value[0].items()}, "one_row": value[1]}
        if stalled:
            record["stalled"] = True
        self.put_record(key, record)

    def get_record(self, key):
        """Another measurement kept here (a JSON object), or None."""
        value = self._load().get(key)
        return value if isinstance(value, dict) else None

    def put_record(self, key, record):
        """Keep ``record`` (a JSON object) under ``key``, the newest :data:`KEEP` kept."""
        data = self._load()
        data.pop(key, None)
        data[key] = record
        data = dict(list(data.items())[-KEEP:])
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)       # never written through whatever was there
            with files.open_for_writing(tmp, exclusive=True) as f:
                f.write(json.dumps(data).encode("utf-8"))
            os.replace(tmp, self.path)
        except OSError:
            # a read-only data dir costs a calibration per load, nothing else
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
