"""The accept loop: one loop for plain and speculative decoding.

Plain decoding is this loop with a drafter that proposes nothing: each step decodes
``[pending]`` and samples one row. With drafts, a step decodes
``[pending, d1..dk]`` with logits on every row, samples row i with the same sampler,
keeps going while the sample equals d(i+1), commits the accepted drafts plus the
target's own token, and trims rejected positions from the KV cache. Because both
modes run this code, they sample the same rows in the same order with the same random
stream, so their outputs agree token for token wherever the library computes a row of
a batch the same as a one-row decode (see README, "Identical output").

:func:`steps` is a generator of :class:`Step` records, so a caller can print text as it
comes, trace each step, or step through the loop in a debugger.
"""
import time
from dataclasses import dataclass, field

from geniex.errors import Cancelled, ContextLengthExceeded
from geniex.engine.sampling import Sampler
from geniex.engine.stats import Stats
from geniex.engine.text import TextStream
from geniex.speculative.drafters.base import EMPTY


@dataclass
class GenOptions:
    """How to answer: limits, stop strings, sampling, drafting."""

    max_tokens: int = 2048
    stop: tuple = ()
    sampling: object = None          # SamplingParams
    n_max: int = 3                   # draft tokens per step at most
    n_min: int = 0                   # shorter drafts are dropped


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


def common_prefix(a, b, start=0):
    """Length of the shared prefix of two token lists, ``start`` being known to match."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefill(ctx, batch, tokens, start, end, cancel=None):
    """Decode ``tokens[start:end]`` in chunks of the context's batch size.

    Returns the batch row of the last decoded token (its output is on), or None.
    ``cancel()`` is asked before each chunk: a long prompt whose client went away stops
    within one chunk (raises :class:`~geniex.errors.Cancelled`; the positions decoded so
    far are trimmed by the next ``sync_kv``).
    """
    row = None
    pos = start
    step = min(ctx.n_batch, batch.capacity)
    while pos < end:
        if cancel is not None and cancel():
            raise Cancelled(pos - start, end - start)
        n = min(step, end - pos)
        ctx.decode(batch.fill(tokens[pos:pos + n], pos))
        row = n - 1
        pos += n
    return row


def steps(session, prompt_tokens, opts, drafter=None, cancel=None, stats=None):
    """Answer ``prompt_tokens`` on ``session`` (a :class:`~geniex.engine.runtime.Session`),
    yielding a :class:`Step` per target decode. ``stats`` (a Stats) is filled in place.

    ``cancel()`` returning True ends the answer with stop reason ``user``.
    """
    stats = stats if stats is not None else Stats()
    ctx, vocab, batch = session.ctx, session.vocab, session.batch
    t_start = time.perf_counter()
    history = list(prompt_tokens)
    if not history:
        raise ValueError("empty prompt")
    if len(history) > ctx.n_ctx:
        raise ContextLengthExceeded(
            f"the prompt has {len(history)} tokens but the context holds {ctx.n_ctx}; "
            "raise --nctx or shorten the prompt")
    stats.prompt_tokens = len(history)
    n_past = len(history) - 1
    reuse = session.sync_kv(history, keep_at_most=n_past)
    stats.prompt_reused = reuse
    row = prefill(ctx, batch, history, reuse, n_past, cancel)
    stats.prompt_time = time.perf_counter() - t_start

    drafter = drafter or _NoDrafter
    drafter.begin(history, n_past, row)
    sampler = Sampler(opts.sampling, ctx.n_vocab, history)
    stream = TextStream(opts.stop)
    eog = vocab.eog
    generated = 0
    index = 0
    t_decode = time.perf_counter()
    stop = ""
    try:
        while not stop:
            if cancel is not None and cancel():
                stop = "user"
                break
            if n_past >= ctx.n_ctx:
                stop = "context_length"
                break
            pending = history[n_past]
            # Never draft past the context, or past the answer's last allowed token.
            room = min(opts.n_max, ctx.n_ctx - n_past - 1, opts.max_tokens - generated - 1)
            t0 = time.perf_counter()
            draft = drafter.propose(history, n_past, room) if room > 0 else EMPTY
            tokens = draft.tokens
            if len(tokens) > room:
                tokens = tokens[:room]
            if tokens and len(tokens) < opts.n_min:
                tokens = ()
            t1 = time.perf_counter()
            n = len(tokens) + 1
            batch.tokens[0] = pending
            if tokens:
                batch.tokens[1:n] = tokens
            batch.pos[:n] = range(n_past, n_past + n)
            batch.logits[:n] = 1
            batch.struct.n_tokens = n
            ctx.decode(batch)

            target, committed, text = [], [], []
            accepted = 0
            for i in range(n):
                tok = sampler.sample(ctx.logits(i))
                sampler.accept(tok)
                target.append(tok)
                history.append(tok)
                if tok in eog:
                    stop = "eos"
                else:
                    committed.append(tok)
                    generated += 1
                    piece = stream.feed(vocab.piece(tok))
                    if piece:
                        text.append(piece)
                    if stream.stopped:
                        stop = "stop_sequence"
                    elif generated >= opts.max_tokens:
                        stop = "length"
                if i < n - 1 and tok == tokens[i]:
                    accepted += 1
                    if stop:
                        break
                    continue
                break
            examined = min(len(target), len(tokens))
            # Rows after the last accepted draft hold rejected tokens: forget them.
            n_past += len(target)
            if n > len(target):
                ctx.trim(n_past)
            del history[n_past + 1:]
            t2 = time.perf_counter()
            stats.record_step(examined, accepted)
            stats.draft_time += t1 - t0
            stats.verify_time += t2 - t1
            if committed and stats.ttft == 0.0:
                stats.ttft = t2 - t_start
            if not stop:
                drafter.observe(history, n_past, len(target) - 1, examined, accepted)
            else:
                # The answer ends with this step: release held text (an incomplete UTF-8
                # character) with it, so that exactly one Step carries ``stop``.
                held = stream.flush()
                if held:
                    text.append(held)
            # What was verified: a draft cut to ``room`` or dropped by ``n_min`` keeps only the
            # probabilities of the tokens in the batch; a lone drafter leaves ``method`` unset.
            probs = list(draft.probs[:len(tokens)]) if tokens and draft.probs is not None else None
            method = (draft.method or drafter.name) if tokens else ""
            yield Step(index, n_past - len(target), pending, list(tokens), probs, method,
                       target, accepted, committed, "".join(text), t1 - t0, t2 - t1, stop)
            index += 1
    finally:
        # What the KV cache holds for the next answer (one copy per answer, not per
        # step); positions a failed step left beyond it are trimmed by sync_kv.
        session.kv_tokens = history[:n_past]
    tail = stream.flush()            # empty unless the loop ended before a verify step
    stats.decode_tokens = generated
    stats.decode_time = time.perf_counter() - t_decode
    stats.total_time = time.perf_counter() - t_start
    stats.stop_reason = stop
    if tail or stop in ("user", "context_length"):
        yield Step(index, n_past, history[n_past] if n_past < len(history) else -1, [], None, "",
                   [], 0, [], tail, 0.0, 0.0, stop)


class _Nothing:
    name = ""

    def begin(self, *a):
        pass

    def propose(self, *a):
        return EMPTY

    def observe(self, *a):
        pass


_NoDrafter = _Nothing()
