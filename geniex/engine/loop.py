"""The accept loop: one loop for plain and speculative decoding.

Each step, as docs/speculative.md, "The loop", describes it:

1. **draft**: the drafter proposes up to ``room`` tokens after the pending token
   (plain decoding is the drafter that proposes nothing);
2. **verify**: decode ``[pending, d1..dk]`` with logits on every row, sample row i
   with the answer's sampler, keep going while the sample equals d(i+1);
3. **commit**: take the sampled tokens in order until one ends the answer (an end
   token, a stop string, the length limit), and trim rejected rows from the KV cache.

Plain and speculative answers run this same code, so they sample the same rows in the
same order with the same random stream, and agree token for token wherever the library
computes a row of a batch the same as a one-row decode (docs/speculative.md, "Identical output").

:func:`steps` is a generator of :class:`Step` records, so a caller can print text as it
comes, trace each step, or step through the loop in a debugger.
"""
import time
from dataclasses import dataclass, field

from geniex.engine.forced import ForcedDrafter
from geniex.engine.logprobs import Probe
from geniex.engine.sampling import Sampler
from geniex.engine.stats import Stats
from geniex.engine.text import TextStream
from geniex.errors import ContextLengthExceeded, GenieXError
from geniex.speculative.drafters.base import EMPTY, NO_DRAFTER
from geniex.speculative.policy import FixedPolicy

FIXED = FixedPolicy()


@dataclass
class GenOptions:
    """How to answer: limits, stop strings, sampling."""

    max_tokens: int = 2048
    stop: tuple = ()
    sampling: object = None          # SamplingParams
    grammar: object = None           # a constraints.Grammar the answer must match (None: free text)
    forced_drafts: bool = True       # with a grammar, draft what it forces (geniex.engine.forced)
    forced_max: int | None = None    # the longest forced run (None: the verify batch; recurrent targets: less)
    logprobs: int | None = None      # None: none; n: each answer token's log-probability and its top n
    think_budget: object = None      # a think_budget.ThinkBudget (never with a grammar: one constraint per answer)
    prediction: str | None = None    # text the answer is expected to repeat: drafted from (Session.generate)


@dataclass
class Step:
    """One verify step, as the trace and a debugger see it."""

    index: int
    n_past: int                      # position of ``pending`` (the first verify row)
    pending: int                     # the last committed token, decoded this step
    drafted: list                    # the draft tokens in the verify batch
    draft_probs: list | None
    method: str                      # which drafter proposed ('' = none)
    target: list                     # the target's sampled token per examined row
    accepted: int                    # drafts the target agreed with
    committed: list                  # tokens that became part of the answer this step
    text: str                        # printable text released this step
    draft_time: float
    verify_time: float
    stop: str = ""                   # set on the last step
    extra: dict = field(default_factory=dict)
    logprobs: list | None = None     # a TokenLogprob per committed token (GenOptions.logprobs)


def verify(ctx, batch, sampler, pending, n_past, drafts, eog, constraint=None, probe=None):
    """Decode ``[pending, *drafts]`` from position ``n_past`` with logits on every row and
    sample the rows in order while the target agrees with the draft (``probe``, a
    :class:`~geniex.engine.logprobs.Probe`, reads each sampled row's log-probabilities).

    Returns ``(sampled, accepted)``: the accepted drafts followed by the target's own
    token (a row that disagrees, or the row after the last draft), and how many drafts
    matched. An end token ends the sampling even where it matches its draft.

    With a ``constraint`` (:class:`~geniex.engine.constraints.Constraint`), row i is
    sampled under the grammar state after the tokens before it (the accepted drafts, as
    plain decoding would have consumed them) and each sampled token is consumed; a
    complete grammar ends the answer with an end token, drawing nothing.
    """
    ctx.decode(batch.fill([pending, *drafts], n_past, all_logits=True))
    sampled = []
    for i in range(len(drafts) + 1):
        row = ctx.logits(i)
        if constraint is None:
            tok = sampler.sample(row)
        elif constraint.is_stopped():
            tok = constraint.end_token
        else:
            tok = sampler.sample(constraint.mask(row))
        if probe is not None:
            probe.row(row, tok)        # the raw row: log-probabilities as the model gives them
        sampler.accept(tok)
        if constraint is not None and not constraint.consume(tok):
            raise GenieXError("the grammar allows no token the sampler may pick here (a logit_bias "
                              "banning every allowed token?)")
        sampled.append(tok)
        if i == len(drafts) or tok != drafts[i] or tok in eog:
            break
    last = len(sampled) - 1
    return sampled, last + (last < len(drafts) and sampled[last] == drafts[last])


class Answer:
    """One answer's rules and committed side: its sampler, grammar, text and stop rules.
    A step cuts its draft, verifies it and commits the sampled tokens through it."""

    def __init__(self, opts, vocab, n_vocab, history):
        self.sampler = Sampler(opts.sampling, n_vocab, history)
        rule = opts.grammar if opts.grammar is not None else opts.think_budget
        self.constraint = rule.constraint(vocab) if rule is not None else None
        self.probe = Probe(opts.logprobs) if opts.logprobs is not None else None
        self.stream = TextStream(opts.stop)
        self.max_tokens = opts.max_tokens
        self.eog, self.piece = vocab.eog, vocab.piece
        self.generated = 0
        self.stop = ""

    def ended(self, cancel, n_past, n_ctx):
        """Whether the answer has ended; before a step, a client gone (``cancel()``) or a
        full context ends it."""
        if not self.stop:
            if cancel is not None and cancel():
                self.stop = "user"
            elif n_past >= n_ctx:
                self.stop = "context_length"
        return bool(self.stop)

    def cut(self, draft, method, room, policy):
        """The one cut of a draft, whatever the drafter returned: room and end tokens,
        then the policy's choice, then the grammar. Nothing offered: the step is a plain
        step (no policy call)."""
        drafts = draft.tokens
        if drafts:
            drafts = drafts[:policy.take(method, _offered(drafts, room, self.eog), draft.grade, draft.probs)]
        if drafts and self.constraint is not None:
            # A draft token the grammar forbids can never be sampled: cut it (and what
            # follows it) before the verify rather than reject it there.
            drafts = drafts[:self.constraint.allowed_prefix(drafts)]
        return drafts

    def verify(self, ctx, batch, pending, n_past, drafts):
        """:func:`verify` with this answer's sampler, end tokens, grammar and probe."""
        if self.probe is not None:
            self.probe.start()
        return verify(ctx, batch, self.sampler, pending, n_past, drafts, self.eog, self.constraint, self.probe)

    def commit(self, sampled):
        """Take ``sampled`` tokens in order until one ends the answer: an end token (not
        part of the answer), a stop string (held back by the stream), or the length
        limit; the grammar forgets the tokens sampled after it. Returns ``(tokens used,
        answer tokens, text)``."""
        committed, text = [], []
        used = len(sampled)
        for tok in sampled:
            if tok in self.eog:
                self.stop = "eos"
                used = len(committed) + 1
                break
            committed.append(tok)
            self.generated += 1
            piece = self.stream.feed(self.piece(tok))
            if piece:
                text.append(piece)
            if self.stream.stopped:
                self.stop = "stop_sequence"
            elif self.generated >= self.max_tokens:
                self.stop = "length"
            if self.stop:
                used = len(committed)
                break
        if self.constraint is not None and used < len(sampled):
            self.constraint.rollback(len(sampled) - used)     # sampled past a stop string
        return used, committed, "".join(text)


def steps(ctx, vocab, kv, batch, prompt_tokens, opts, drafter=NO_DRAFTER, cancel=None, stats=None,
          policy=FIXED, progress=None):
    """Answer ``prompt_tokens`` on the target context ``ctx`` (its cache tracked by ``kv``,
    a :class:`~geniex.llama.kv.KvHistory`), yielding a :class:`Step` per target decode.
    ``stats`` (a Stats) is filled in place; ``cancel()`` returning True ends the answer
    with stop reason ``user``; ``policy`` sizes each draft (geniex.speculative.policy);
    ``progress(total, cached, processed)`` hears how far the prompt's decoding got."""
    stats = stats if stats is not None else Stats()
    t_start = time.perf_counter()
    history = list(prompt_tokens)
    row = _prefill_prompt(ctx, kv, batch, history, cancel, stats, progress)   # errors.Cancelled: client gone
    n_past = len(history) - 1
    drafter.begin(history, n_past, row)
    answer = Answer(opts, vocab, ctx.n_vocab, history)
    if answer.constraint is not None and opts.forced_drafts:
        drafter = ForcedDrafter(answer.constraint, vocab, drafter, opts.forced_max)
    rows = min(ctx.n_batch, batch.capacity)     # a verify batch never exceeds the context's batch
    index = 0
    t_decode = time.perf_counter()
    try:
        while not answer.ended(cancel, n_past, ctx.n_ctx):
            room = min(ctx.n_ctx - n_past, opts.max_tokens - answer.generated, rows) - 1
            t0 = time.perf_counter()
            draft = drafter.propose(history, n_past, policy.cap(room)) if room > 0 else EMPTY
            method = draft.method or drafter.name
            drafts = answer.cut(draft, method, room, policy)
            t1 = time.perf_counter()
            pending = history[n_past]
            sampled, accepted = answer.verify(ctx, batch, pending, n_past, drafts)
            used, committed, text = answer.commit(sampled)
            history.extend(sampled[:used])
            n_past += used
            if used <= len(drafts):
                ctx.trim(n_past)                # rows after the last used one hold rejected drafts
            examined, accepted = min(used, len(drafts)), min(used, accepted)
            if draft.tokens:
                policy.observe(method, draft.tokens, sampled, t1 - t0, draft.grade, draft.probs)
            t2 = time.perf_counter()
            stats.record_step(examined, accepted, t1 - t0, t2 - t1, t2 - t_start if committed else None,
                              len(draft.tokens), method if drafts else "")
            if answer.stop:
                text += answer.stream.flush()   # held text (a partial character) ends with us
            else:
                drafter.observe(history, n_past, used - 1, examined, accepted)
            probs = list(draft.probs[:len(drafts)]) if drafts and draft.probs is not None else None
            logprobs = answer.probe.rows[:len(committed)] if answer.probe is not None else None
            yield Step(index, n_past - used, pending, list(drafts), probs, method if drafts else "",
                       sampled[:used], accepted, committed, text, t1 - t0, t2 - t1, answer.stop,
                       _extra(draft, drafts), logprobs)
            index += 1
    finally:
        kv.tokens = history[:n_past]            # what the KV cache holds for the next answer
    stats.finish(answer.generated, answer.stop, t_decode, t_start)
    tail = answer.stream.flush()                # empty unless the loop ended before a verify
    if tail or answer.stop in ("user", "context_length"):
        yield Step(index, n_past, history[n_past] if n_past < len(history) else -1, [], None, "",
                   [], 0, [], tail, 0.0, 0.0, answer.stop)


def _extra(draft, drafts):
    """A step's ``extra``: what the drafter offered beyond what was verified, the draft's grade."""
    extra = {}
    if len(draft.tokens) > len(drafts):
        extra["offered"] = len(draft.tokens)
    if draft.grade:
        extra["grade"] = draft.grade
    return extra


def _offered(tokens, room, eog):
    """How many of a draft's tokens a verify may check: within ``room``, and none after an
    end token (the verify stops sampling there, so rows after it would be wasted)."""
    n = min(len(tokens), room)
    for i in range(n):
        if tokens[i] in eog:
            return i + 1
    return n


def _prefill_prompt(ctx, kv, batch, history, cancel, stats, progress=None):
    """Bring the KV cache to ``history[:-1]`` (reusing what it already holds); returns
    the batch row of the last decoded position, or None."""
    t0 = time.perf_counter()
    if not history:
        raise ValueError("empty prompt")
    if len(history) > ctx.n_ctx:
        raise ContextLengthExceeded(
            f"the prompt has {len(history)} tokens but the context holds {ctx.n_ctx}; "
            "raise --nctx or shorten the prompt", n_prompt_tokens=len(history), n_ctx=ctx.n_ctx)
    n_past = len(history) - 1
    stats.prompt_tokens = len(history)
    stats.prompt_reused = kv.sync(history, keep_at_most=n_past)
    report = None
    if progress is not None:
        total, cached = len(history), stats.prompt_reused
        progress(total, cached, cached)
        # The last prompt token is decoded by the first verify step: count it there.
        report = lambda pos: progress(total, cached, pos if pos < n_past else total)
    row = kv.fill(batch, history, stats.prompt_reused, n_past, cancel, report)
    if report is not None and stats.prompt_reused >= n_past:
        report(n_past)
    stats.prompt_time = time.perf_counter() - t0
    return row
