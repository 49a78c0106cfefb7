"""The identity bench of tests/speculative: a plain session and a speculative one on the
same model and load options, and every drafting method's drafter on the speculative one.

Why one speculative session for every method: a session prefills its prompt before it
answers, and the identity tests' prompts (past 512 and past 1,024 positions) cost more
to prefill than their answers cost to decode. The speculative session is loaded as a
user loads it (``--spec-type`` of the bench's own method at its defaults); each other
method's drafter is built by the engine's own builder (geniex.speculative.build, what
``Session`` calls at load) on that target and swapped in for its answers, so the prompt
is prefilled once for all methods and then reused from the KV cache. The plain reference
is a separate session that prefills the same prompt itself (the comparison spans two
contexts, as "the target alone" does for a user), or, for a bench whose prompts cost
more to prefill than its answers cost to decode (``separate_plain=False``), the
speculative session answering with ``speculative=False`` on the prompt it already holds:
what such a bench is about is a verify row's numerics against a one-row decode's, which
one context shows; that a speculative load sets its context up as a plain load does is
proved by a bench with two sessions (tests/speculative/test_speculative.py).
"""
import contextlib
import json
import threading

from geniex.config import physical_cores
from geniex.engine import tasks
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import LoadOptions, Session
from geniex.speculative import build
from geniex.speculative.policy import FixedPolicy

# Every drafting method of geniex.speculative.options.METHODS (draft-mtp: test_mtp.py).
METHODS = ["ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "draft-simple"]
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=77)}
# The default (every physical core), and at least two threads where the machine has one
# core: the multi-thread decode paths are what the long-position tests are about.
THREADS = max(2, physical_cores())
# A quiet machine's verify cost curve (cost of a batch of n rows / one row): the auto
# policy sized by it drafts where a drafter's tokens are likely; the curve a load measures
# follows the machine's load (a busy neighbour can make batches look too dear to draft at
# all, and an identity test that never drafts proves nothing). Lengths never change tokens.
QUIET_CURVE = {1: 1.0, 2: 2.0, 4: 2.8, 8: 4.1, 16: 7.2}
# ngram-mod as `geniex infer --spec-type ngram-mod` builds it: the auto draft policy sizing
# drafts by each token's probability, memory kept across answers.
AT_DEFAULTS = "ngram-mod at its defaults"
# The long prompts, {name: (tokens, answer length)}: answers start before position 512
# or 1,024 and run 16 tokens past it, where a one-row decode's numerics could part from
# a verify row's. Breaking that on purpose (an F16 KV cache on 2 threads: split-KV at 512+
# cells) makes the plain and speculative answers part at position 514 past 512 (from 16
# tokens before) and at 1,020 past 1,024 (from 4 or 16 before); past 512 from 4 tokens
# before they did not part (another history before the near-tie). So past-512 answers
# start 16 before; past-1,024 ones start 4 before (12 answer tokens fewer for each).
LAYOUT = {"past-1024": (1024 - 4, 4 + 16), "past-512": (512 - 16, 16 + 16)}


def inventory_line(i):
    """Line ``i`` of the inventory the long prompts list: an n-gram method finds drafts
    in it (and some are rejected where the items vary); a JSON schema forces its keys."""
    return json.dumps({"item": i, "color": ["red", "blue", "green"][i % 3], "weight": i * 7 % 23,
                       "shelf": i % 5, "checked_by": ["Ann", "Bob", "Eve", "Tom"][i % 4]}) + "\n"


def fixed(method, draft):
    """SpecOptions for ``method`` with fixed draft lengths, so that every method drafts
    (and the identity is tested) whatever the auto policy would choose; the policy changes
    lengths, never tokens."""
    from geniex.speculative.options import SpecOptions
    return SpecOptions(types=tuple(method.split(",")), draft_model="demo",
                       draft_path=draft if "draft-simple" in method else None, n_max=6, policy="fixed")


class Bench:
    """``plain`` and ``spec`` sessions of ``model`` (``nctx``; ``threads`` for decodes and
    batches: :data:`THREADS` unless given, 0 for the default; the default q8_0 KV cache);
    ``spec`` loaded with ``own`` (SpecOptions) as the method named ``own_name``.
    :meth:`answer` runs any method on ``spec``: its own drafter and policy for
    ``own_name``, otherwise a drafter built from ``options(method)`` (:meth:`drafting`).
    Without ``separate_plain``, ``plain`` is None and :meth:`reference` answers on
    ``spec`` with ``speculative=False`` (one load and one prefill fewer)."""

    def __init__(self, model, nctx, own_name, own, options, separate_plain=True, threads=THREADS):
        load = dict(nctx=nctx, threads=threads, threads_batch=threads)
        self.model, self.own_name, self.options = model, own_name, options
        self.plain = Session(model, LoadOptions(**load)) if separate_plain else None
        self.spec = Session(model, LoadOptions(**load, spec=own))
        assert self.spec.speculative, self.spec.spec_notes
        self.own = (self.spec.drafter, self.spec.policy)
        self.drafters = {}
        self.references = {}

    def size_by_quiet_curve(self):
        """The speculative session's own auto policy sizes drafts by :data:`QUIET_CURVE`
        instead of the curve its load measured (a busy neighbour can make batches look too
        dear to draft at all, and an identity test needs drafts); lengths never change tokens."""
        from geniex.speculative.policy import GainPolicy
        drafter, auto = self.own
        self.own = (drafter, GainPolicy(QUIET_CURVE, auto.one_row))
        self.spec.drafter, self.spec.policy = self.own

    def check_defaults(self):
        """The sessions run the shipped numerics: several threads, q8_0 K and V."""
        for s in self.sessions():
            assert s.threads >= 2 and s.threads_batch >= 2
            assert s.options.cache_type_k == s.options.cache_type_v == "q8_0"

    def sessions(self):
        return [s for s in (self.plain, self.spec) if s is not None]

    def reference(self, key, tokens, opts):
        """The plain answer (a :class:`~geniex.engine.session.Generation`, run) to
        ``tokens`` with ``opts``, computed once per ``key`` (on ``plain``, else on
        ``spec`` with no drafter and no forced drafts)."""
        if key not in self.references:
            gen = (self.plain or self.spec).generate(tokens, opts, speculative=False)
            gen.steps = list(gen)
            self.references[key] = gen
        return self.references[key]

    @contextlib.contextmanager
    def drafting(self, method, spec=None):
        """Within the block, ``spec`` drafts with ``method``: its own drafter and policy
        for ``own_name``, otherwise a drafter built from ``options(method)`` (or from
        ``spec``, SpecOptions, for a variant of a method under a name of its own): once,
        kept for the bench's life (its memory lasts across answers, as in a session)."""
        if method != self.own_name and method not in self.drafters:
            spec = spec or self.options(method)
            drafter, notes = build.build(self.spec.target, spec, self.spec.n_rs_seq, self.spec.bundled_nextn)
            assert drafter is not None, notes
            self.drafters[method] = (drafter, FixedPolicy() if spec.policy == "fixed" else self.own[1])
        self.spec.drafter, self.spec.policy = self.own if method == self.own_name else self.drafters[method]
        try:
            yield self.spec
        finally:
            self.spec.drafter, self.spec.policy = self.own

    @contextlib.contextmanager
    def without_drafter(self):
        """Within the block, ``spec`` has no drafter: a speculative answer's only drafts
        are a grammar's forced runs."""
        self.spec.drafter = None
        try:
            yield self.spec
        finally:
            self.spec.drafter, self.spec.policy = self.own

    def answer(self, method, tokens, opts):
        """``method``'s answer to ``tokens`` on the speculative session (a run Generation
        with its steps in ``.steps``)."""
        with self.drafting(method) as session:
            gen = session.generate(tokens, opts)
            gen.steps = list(gen)
        return gen

    def close(self):
        for drafter, _ in self.drafters.values():
            drafter.close()
        for s in self.sessions():
            s.close()


def first_difference(got, want):
    """Index of the first token where two answers differ (None if one is a prefix)."""
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)


def inventory_tokens(session, n_tokens, line):
    """The first ``n_tokens`` tokens of a header and ``line(0)``, ``line(1)``, ...: a
    prompt that ends exactly where a test wants its answer to start (mid-line; both sides
    of a comparison get the same tokens). Prompts cut from the same text are token
    prefixes of each other, so a session that answered a longer one reuses a shorter one
    from its KV cache."""
    text = "Continue this inventory, one JSON object per line:\n"
    i = 0
    while True:
        text += line(i)
        i += 1
        tokens = session.tokenize_prompt(text)
        if len(tokens) >= n_tokens:
            return tokens[:n_tokens]


def gen_options(max_tokens, sname, **kw):
    return GenOptions(max_tokens=max_tokens, sampling=SAMPLINGS[sname], **kw)


# -- answers on a session's slots (tests of LoadOptions.parallel) ----------------------------
def task_answer(session, tokens, opts, speculative=True, spec=None):
    """(answer tokens, Done stats) of a completion task on ``session`` (``spec``: the
    request's own speculative setup, on the drafters as loaded; None: the loaded one)."""
    task = tasks.CompletionTask(prompt=list(tokens), options=opts,
                                streaming=tasks.Streaming(speculative=speculative, spec=spec))
    got, stats = [], None
    for event in tasks.run(session, task):
        if isinstance(event, tasks.Piece):
            got.extend(event.tokens)
        elif isinstance(event, tasks.Done):
            stats = event.stats
    return got, stats


def together(session, jobs, speculative=True, spec=None):
    """Answer ``jobs`` ([(tokens, opts)]) at once, each from its own thread."""
    out = [None] * len(jobs)
    errors = []

    def client(i):
        try:
            out[i] = task_answer(session, *jobs[i], speculative, spec)
        except BaseException as e:     # noqa: BLE001 - reported by the test
            errors.append(e)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    return out
