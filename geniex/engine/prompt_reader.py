"""Prompts read at F16 speed, answers decoded on the exact quantized cache.

Why two caches. An answer decodes on a quantized KV cache (q8_0 by default) because only
there a one-row decode and every row of a verify batch are the same bits on any number
of threads (geniex.llama.cache_types.shape_free): that is what makes speculative output
identical to plain output. But ggml-cpu reads a many-row prompt 1.7x faster from an F16
cache, through a tiled flash-attention kernel it takes only for F16/F32 K and V
(measured: 1,536 tokens in 512-row calls, 2 threads, demo model: 258 against 150 tokens
per second). So a session whose target allows it (:func:`usable`) opens a second context
on the same weights, the *reader*, with an F16 cache and one sequence per slot. A prompt
is decoded there, and its cells are moved into the target's sequence through the
library's own sequence state, quantized and rotated as the target stores them
(geniex.llama.kv_state). The answer then starts, as always, by decoding the prompt's
last token on the target.

Why answers stay exact and do not depend on what was cached.
- Plain and speculative answers read a prompt the same way, so they start from the same
  cells: the identity of the accept loop is untouched.
- In the tiled kernel a row's result does not depend on the other rows of its call, as
  long as the call has at least :data:`READ_MIN` rows (the kernel's tile; fewer rows take
  another kernel). Measured: a 1,700-token prompt cut into calls of 64, 65, 70, 100, 200
  or 512 rows in any mix left bitwise the same cells; a 14-row call did not. So the
  reader never decodes fewer than READ_MIN rows at once: a short call is filled up with
  placeholder rows after the prompt's end (causal attention: no earlier row sees them),
  whose cells are removed after it (:func:`read_plan`).
- A prompt shorter than READ_MIN decodes on the target directly, as without a reader
  (filled up to a tile its read would cost more than it saves); its cells are reused for
  short prompts only, and a conversation that grows past READ_MIN is read from the start.
- What a fresh read of a prompt writes is therefore fixed, and a kept prefix is reused
  only where it is that: cells the reader wrote for the same tokens. Cells the target
  decoded itself (the answer, generated one verify at a time) are not what a read writes,
  so a conversation that comes back is read again from the end of its last prompt: its
  last answer and its new turn.
"""
import contextlib
import logging
import threading

import numpy as np

from geniex.errors import Cancelled, GenieXError
from geniex.llama import cache_types, kv_state
from geniex.llama.kv import KvHistory, common_prefix
from geniex.llama.objects import Batch, Context

log = logging.getLogger("geniex.engine")

VERSION = 1         # of the F16-to-target conversion: a load checks it again when it changes
READ_MIN = 64       # rows of the F16 kernel's query tile (ggml-cpu GGML_FA_TILE_Q)
READ_CHUNK = 512    # rows per reader decode, as llama.cpp's server cuts prompts
# The longest context per sequence that reads prompts on the target: the F16 kernel's
# gain grows with the cache it attends to (demo model, 2 threads, 512-row calls: 1.12x
# at 256 tokens, 1.26x at 512, 1.42x at 1,024), and under it does not pay for a second
# cache and the load-time check.
READ_FROM_CTX = 512
# The shortest conversation a slot reads its last answer of after it (catch_up): below
# it, reading the answer again when the conversation comes back costs little (attention
# over a short cache is cheap), and a server would spend idle time for nothing.
CATCH_UP_FROM = 512


def usable(model, type_k, type_v, spec_needs_rows, n_ctx):
    """Why a reader cannot serve a target of ``model`` with this cache and ``n_ctx``
    positions per sequence, or None if it can: it pays only for a quantized (shape-free)
    target cache and a context longer than :data:`READ_FROM_CTX`, and needs a plain KV
    cache (no recurrent or sliding-window layers, one RoPE axis) and drafters that do not
    read the target's hidden state of prompt rows (MTP, NextN)."""
    if n_ctx <= READ_FROM_CTX:
        return f"a context of {READ_FROM_CTX} tokens or fewer reads prompts at most 1.3x faster in F16"
    if not cache_types.shape_free(type_k, type_v):
        return "the target's cache is F16/F32 already"
    if model.recurrent:
        return "the model has recurrent layers"
    header = model.header
    if header.arch_key("attention.sliding_window") or header.arch_key("rope.dimension_sections"):
        return "the model has sliding-window attention or multi-axis RoPE"
    if spec_needs_rows:
        return "the drafter reads the target's hidden states of the prompt"
    return None


def read_plan(start, end, room, size=READ_CHUNK, least=READ_MIN):
    """How to read positions ``[start, end)`` in calls of ``least`` to ``size`` rows
    (or up to ``2 * least - 1`` where ``size`` is smaller) with ``room`` positions in
    the sequence: ``(start, chunks, pad)``. ``chunks`` are ``(position, rows)`` pairs;
    the last call is filled up with ``pad`` placeholder rows after ``end`` where a short
    read needs them and the sequence has room, else the read starts earlier (rows already
    read come out the same bits again)."""
    if start >= end:
        return start, [], 0
    if end - start < least:
        if room - start >= least:
            return start, [(start, end - start)], least - (end - start)
        start = max(0, end - least)
    out, pos = [], start
    while pos < end:
        n = min(size, end - pos)
        left = end - pos - n
        if 0 < left < least:
            if n - (least - left) >= least:
                n -= least - left       # leave the last call its least
            else:
                n += left               # too few for two calls: one
        out.append((pos, n))
        pos += n
    return start, out, 0


class PromptReader:
    """The F16 context prompts are read in, beside ``target`` (the target Context) on the
    same model: as many sequences and cells per sequence. ``run(fn, *args)`` runs library
    work on the thread that decodes (a batcher's :meth:`call`; default: here) and
    ``aside(seq)`` gives a context in which sequence ``seq`` stands out of the slots'
    shared decodes while it reads (default: nothing to step out of)."""

    def __init__(self, model, target, threads, run=None, aside=None):
        self._make = lambda: Context(model, n_ctx=target.n_ctx, n_batch=READ_CHUNK, n_ubatch=READ_CHUNK,
                                     n_seq_max=target.params.n_seq_max, n_threads=threads,
                                     n_threads_batch=threads, type_k="f16", type_v="f16")
        self._ctx = None            # made on first use, so a load that reads no prompt pays nothing
        self._lock = threading.Lock()
        self.batch = Batch(READ_CHUNK)
        self._batches = {0: self.batch}      # one per sequence: a Batch's rows carry its sequence id
        self._run = run or (lambda fn, *args: fn(*args))
        self._aside = aside or (lambda seq: contextlib.nullcontext())
        self.converter = None
        self.chunk = READ_CHUNK     # rows per decode (any size from READ_MIN gives the same cells)
        self.reads = 0              # prompts read (tests check the path was taken)
        self.rows = 0               # rows they decoded
        self.active = 0             # reads running now (a slot's catch-up gives way to others)

    @property
    def ctx(self):
        """The F16 context (made, with its KV cache, on first use: on the decoding thread)."""
        if self._ctx is None:
            with self._lock:            # two slots' first reads at once make one
                if self._ctx is None:
                    self._ctx = self._make()
        return self._ctx

    def trust(self, lib, target, rot_k, rot_v):
        """Take the converter a :meth:`calibrate` of this model proved before (its
        rotations, kept in the data dir), without decoding anything now."""
        self.converter = kv_state.Converter(lib, target.type_k, target.type_v, rot_k, rot_v)

    def calibrate(self, target, tokens):
        """Make the converter for ``target`` (an empty Context) and prove it on ``tokens``
        (a few of the model's tokens): the same tokens read here and turned, then one more
        decoded on the target, must give the target's own next-token choice with logits
        within rounding. Leaves both contexts empty; StateFormatError if anything is off."""
        n = len(tokens) - 1
        try:
            target.decode(self.batch.fill(tokens, 0, all_logits=True))
            direct = np.array(target.logits(n))
            own = kv_state.parse(target.save_state(0))
            self.converter = kv_state.Converter(target.model._lib, target.type_k, target.type_v,
                                                own.rot_k, own.rot_v)
            self.ctx.decode(self.batch.fill(tokens[:n], 0))
            target.clear()
            if not target.load_state(self.converter.convert(kv_state.parse(self.ctx.save_state(0))), 0):
                raise kv_state.StateFormatError("the target refused a turned state")
            target.decode(self.batch.fill(tokens[n:], n, all_logits=True))
            turned = np.array(target.logits(0))
        finally:
            target.clear()
            self.ctx.clear()
        spread = float(np.abs(direct).max()) or 1.0
        if int(turned.argmax()) != int(direct.argmax()) or float(np.abs(turned - direct).max()) > 0.05 * spread:
            self.converter = None
            raise kv_state.StateFormatError("cells turned from F16 do not give the target's own logits "
                                            f"(differ by up to {float(np.abs(turned - direct).max()):.3g})")

    def read(self, history, tokens, start, end, keep, cancel=None, progress=None, on_rows=None):
        """Read ``tokens[start:end]`` into ``history``'s sequence here (the cells before
        ``start`` are this sequence's already), then give the target's sequence cells
        ``[0, end)``: ``[0, keep)`` as it holds them, the rest turned from here.
        ``on_rows(logits, pos, n)``, if given, hears each call's rows (``logits(i)`` is row
        ``i``'s, at position ``pos + i``) before the next call."""
        with self._lock:
            self.active += 1
        try:
            self._read(history, tokens, start, end, keep, cancel, progress, on_rows)
        finally:
            with self._lock:
                self.active -= 1

    def _read(self, history, tokens, start, end, keep, cancel, progress, on_rows):
        seq = history.seq
        first, chunks, pad = read_plan(start, end, history.ctx.n_ctx, self.chunk)
        with self._aside(seq):
            self._run(lambda: self.ctx.trim(first, seq))     # (the first use makes the context there)
            del history.read[first:]
            for pos, n in chunks:
                if cancel is not None and cancel():
                    raise Cancelled(max(pos - start, 0), end - start)
                rows = tokens[pos:pos + n]
                self._run(self._decode, rows + rows[-1:] * pad if pos + n == end else rows, pos, seq,
                          on_rows and (lambda: on_rows(self.ctx.logits, pos, n)))
                if pad and pos + n == end:
                    self._run(self.ctx.trim, end, seq)      # the placeholders' cells
                history.read.extend(rows)
                if progress is not None:
                    progress(pos + n)
            f16 = kv_state.parse(self._run(self.ctx.save_state, seq))
        kept = None
        if keep:
            # The target's cells as last put there (saving them again costs a copy of the cache).
            kept = kv_state.parse(history.loaded if history.loaded is not None else history.ctx.save_state())
        blob = self.converter.convert(f16, kept, keep)
        history.loaded = None
        if not history.ctx.load_state(blob):
            raise GenieXError("the library refused the prompt's cells read in the F16 context")
        history.loaded = blob
        self.reads += 1
        self.rows += end - start

    def _decode(self, tokens, pos, seq, then=None):
        batch = self._batches.get(seq)
        if batch is None:
            batch = self._batches[seq] = Batch(READ_CHUNK, seq=seq)
        self.ctx.decode(batch.fill(tokens, pos, all_logits=then is not None))
        if then is not None:
            then()

    def clear(self, seq):
        if self._ctx is not None:
            self._run(self._ctx.clear, seq)

    def save(self, seq):
        return self._run(self.ctx.save_state, seq)

    def load(self, seq, data):
        return self._run(lambda: self.ctx.load_state(data, seq))

    def close(self):
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None


class ReadHistory(KvHistory):
    """A target sequence's KV history whose prompts the :class:`PromptReader` reads: the
    tokens the target holds (``tokens``), how many of its leading cells came from the
    reader (``converted``), and the tokens the reader's sequence holds (``read``)."""

    def __init__(self, ctx, reader, seq=0):
        super().__init__(ctx)
        self.reader, self.seq = reader, seq
        self.read = []
        self.converted = 0
        self.loaded = None          # the state last put into the target (its first cells are still these)
        self._plan = None

    def sync(self, tokens, keep_at_most):
        n = keep_at_most
        self._plan = None
        if n < READ_MIN:
            # A short prompt decodes on the target: filled up to a tile its read would cost
            # a 64-row call (5x a 10-row one on the demo model). Read cells are not what
            # that writes, so they are not kept for it.
            if self.converted:
                super().reset()
                self.converted, self.loaded = 0, None
            return super().sync(tokens, keep_at_most)
        keep = min(common_prefix(self.tokens, tokens), self.converted, n)
        if keep == n:                       # the whole prompt is held, as a read left it
            return super().sync(tokens, keep_at_most)
        start = min(common_prefix(self.read, tokens), n)
        self._plan = (start, keep)
        return start

    def fill(self, batch, tokens, start, end, cancel=None, progress=None, on_rows=None):
        if self._plan is None:
            return super().fill(batch, tokens, start, end, cancel, progress, on_rows)
        start, keep = self._plan
        self._plan = None
        self.reader.read(self, tokens, start, end, keep, cancel, progress, on_rows)
        self.tokens = list(tokens[:end])
        self.converted = end
        return None

    def behind(self):
        n = len(self.tokens)
        return n >= CATCH_UP_FROM and self.converted < n

    def catch_up(self, cancel=None):
        """Read what the target holds but decoded itself (the last answer) and put the
        read cells in place of its own, so the conversation, if it comes back, reads only
        its new turn; the cells are then what a fresh read of its tokens writes, as ever.
        ``cancel()`` true before a call stops it (errors.Cancelled); the target's cells are
        then untouched and the rows read so far are kept for the next try."""
        if not self.behind():
            return
        n = len(self.tokens)
        start = min(common_prefix(self.read, self.tokens), n)
        self.reader.read(self, self.tokens, start, n, self.converted, cancel)
        self.converted = n

    def reading(self):
        return self.reader.active

    def reset(self):
        super().reset()
        self.reader.clear(self.seq)
        self.read = []
        self.converted, self.loaded = 0, None

    def snapshot(self):
        return ReadSnapshot(self.ctx.save_state(), self.reader.save(self.seq) if self.read else b"",
                            list(self.read), self.converted)

    def restore(self, snap, tokens):
        if not self.ctx.load_state(snap.target):
            self.reset()
            return False
        self.tokens, self.converted, self.loaded = list(tokens), snap.converted, snap.target
        self.read = []
        if snap.read and self.reader.load(self.seq, snap.read):
            self.read = list(snap.read_tokens)
        else:
            self.reader.clear(self.seq)
        return True


class ReadSnapshot:
    """A saved conversation of a :class:`ReadHistory`: the target's state and the reader's."""

    def __init__(self, target, read, read_tokens, converted):
        self.target, self.read, self.read_tokens, self.converted = target, read, read_tokens, converted

    def __len__(self):
        return len(self.target) + len(self.read)
