"""Continuous batching: one ``llama_decode`` holds the rows of every slot in an answer.

A server with several slots (``geniex serve --parallel N``) answers each request on a
slot of its own: a sequence of the target context, with its own KV history, sampler,
drafter and draft policy, run by its own thread through the one accept loop
(:mod:`geniex.engine.loop`), exactly as a lone answer runs. The context that loop sees
is a :class:`SlotView`: its ``decode()`` does not call the library; it hands the rows
to the :class:`Batcher` and waits. Once every slot in an answer has handed its rows
over (its next token, its draft to verify, or a chunk of its prompt), one decode runs
them all, and each slot reads its rows' logits at its offset in that batch. A request
that arrives joins at the next decode; one that ends leaves, and the others go on.

Why an answer stays the same whatever runs beside it (measured on this library, demo
model, 4 sequences, to position 1,037, prompt chunks, verifies and trims mixed; every
logit row of sequence 0 compared bitwise with the same rows decoded without the
others): the context keeps one KV stream per sequence (``kv_unified`` off, the
library's default), so a sequence's cells stay in position order and the attention
kernel adds them up in the same order (with one unified cache, cells freed by another
sequence's rejected drafts are reused out of order: 16 of 65 steps differed); and with
a quantized KV cache a row's bits do not depend on how many rows share its batch
(geniex.llama.cache_types.shape_free), so neither another slot's rows nor the way the
library cuts the batch into micro-batches changes them.
"""
import contextlib
import ctypes
import queue
import threading

from geniex.llama.objects import Batch


class Batcher:
    """Gathers the busy slots' rows into one decode on the target context ``ctx``
    (made with ``n_seq_max`` = the slots and ``n_batch`` = their rows together).

    The decodes, the slots' drafting (:meth:`call`) included, run on one thread:
    ``submit(fn)`` hands ``fn`` to it (a server's worker gives its main thread, which
    loaded the model); without ``submit`` the batcher starts a thread of its own. The
    library's CPU backend keeps a team of OpenMP threads per calling thread, and a
    decode on one thread ran 1.4x slower once another thread had decoded (measured: four
    slots' rows in 55 ms instead of 38 ms)."""

    def __init__(self, ctx, n_slots, submit=None):
        self.ctx = ctx
        # Held by every library call on the target context: the decodes and drafting
        # here, a trim or a state saved or put back from a slot's thread.
        self.lock = threading.RLock()
        self.batch = Batch(ctx.n_batch)
        self._ids = [(ctypes.c_int32 * 1)(seq) for seq in range(n_slots)]
        self._id_ptrs = [ctypes.cast(ids, ctypes.POINTER(ctypes.c_int32)) for ids in self._ids]
        self._row_seq = [0] * ctx.n_batch        # which sequence's id each group row points at
        self._cond = threading.Condition()
        self._busy = set()                       # slots in an answer
        self._waiting = {}                       # slot -> its Batch, handed over for the next decode
        self._offsets = {}                       # slot -> its first row in the last decode
        self._last = {}                          # slot -> its rows, of the last decode
        self._last_rows = 0                      # rows of the last decode
        self._errors = {}
        self._scheduled = False                  # a decode was handed to the thread and has not run
        self._closed = False
        self.decodes = 0                         # decodes run (for /metrics)
        self.rows = 0                            # rows they held
        self.seats = 0                           # slots they served (seats / decodes: slots per decode)
        self._own = None
        if submit is None:
            self._own = queue.SimpleQueue()
            submit = self._own.put
            threading.Thread(target=self._serve, name="geniex-decode", daemon=True).start()
        self._submit = submit

    def enter(self, seq):
        """Slot ``seq`` starts an answer: the next decode waits for its rows too."""
        with self._cond:
            self._busy.add(seq)

    def leave(self, seq):
        """Slot ``seq`` ended its answer; the others may be waiting only for it."""
        with self._cond:
            self._busy.discard(seq)
            self._waiting.pop(seq, None)
            self._schedule()

    def busy(self):
        with self._cond:
            return len(self._busy)

    def company(self, seq):
        """``(rows, slots)``: what the other slots put in the last decode, what slot
        ``seq``'s next decode is likely to share (its draft policy prices a verify row at
        what the whole decode costs). Asked at every step: read without the lock and
        without allocating (an estimate; a decode running meanwhile changes it anyway)."""
        last, rows = self._last, self._last_rows
        own = last.get(seq)
        return (rows, len(last)) if own is None else (rows - own, len(last) - 1)

    @contextlib.contextmanager
    def aside(self, seq):
        """Slot ``seq`` stands out of the shared decodes for a while (its prompt is read
        in another context, geniex.engine.prompt_reader): the others decode meanwhile
        instead of waiting for its rows."""
        with self._cond:
            was = seq in self._busy
            self._busy.discard(seq)
            self._schedule()
        try:
            yield
        finally:
            if was:
                with self._cond:
                    self._busy.add(seq)

    def decode(self, seq, batch):
        """Decode slot ``seq``'s rows (``batch``, its own) with the other busy slots'
        rows; returns their first row's index in the decode that ran them."""
        with self._cond:
            if seq not in self._busy:
                raise RuntimeError(f"slot {seq} decodes outside an answer")
            self._waiting[seq] = batch
            self._schedule()
            # Done once a decode took the rows out (a slot that joins while a decode
            # runs waits for the next one).
            self._cond.wait_for(lambda: seq not in self._waiting or self._closed)
            error = self._errors.pop(seq, None)
            offset = self._offsets.get(seq, 0)
        if error is not None:
            raise error
        return offset

    def call(self, fn, *args):
        """``fn(*args)`` run on the decode thread (a drafter's decodes); its result."""
        job = [None, None, threading.Event()]

        def run():
            try:
                with self.lock:
                    job[0] = fn(*args)
            except BaseException as e:      # noqa: BLE001 - the caller hears of it
                job[1] = e
            job[2].set()
        self._submit(run)
        job[2].wait()
        if job[1] is not None:
            raise job[1]
        return job[0]

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._own is not None:
            self._own.put(None)

    def _serve(self):
        while True:
            fn = self._own.get()
            if fn is None:
                return
            fn()

    def _schedule(self):
        """Hand a decode to the thread once every busy slot has its rows waiting (the
        condition is held)."""
        if not self._scheduled and self._waiting and self._busy <= self._waiting.keys():
            self._scheduled = True
            self._submit(self._run)

    def _run(self):
        """One decode of every waiting slot's rows (on the decode thread)."""
        group = self.batch
        rows = 0
        with self._cond:
            waiting = dict(self._waiting)
        order = sorted(waiting)
        for seq in order:
            src = waiting[seq]
            n = src.struct.n_tokens
            group.tokens[rows:rows + n] = src.tokens[:n]
            group.pos[rows:rows + n] = src.pos[:n]
            group.logits[rows:rows + n] = src.logits[:n]
            ptr = self._id_ptrs[seq]
            for i in range(rows, rows + n):
                if self._row_seq[i] != seq:         # set a row's pointer only when it changes
                    group._seq_ptrs[i] = ptr
                    self._row_seq[i] = seq
            self._offsets[seq] = rows
            rows += n
        group.struct.n_tokens = rows
        self._last = {seq: waiting[seq].struct.n_tokens for seq in order}
        self._last_rows = rows
        error = None
        try:
            with self.lock:
                self.ctx.decode(group)
                # The library puts the output rows of a batch it cut out of order back in
                # order on the first read of logits, in place: read one here, before the
                # slots read theirs from their own threads at once.
                self.ctx.logits(int(group.logits[:rows].argmax()))
        except Exception as e:      # noqa: BLE001 - every slot of the decode hears of it
            error = e
        with self._cond:
            if error is not None:
                for seq in order:
                    self._errors[seq] = error
            self.decodes += 1
            self.rows += rows
            self.seats += len(order)
            for seq in order:
                self._waiting.pop(seq, None)
            self._scheduled = False
            self._cond.notify_all()
            self._schedule()        # (nothing waits yet, unless a slot left meanwhile)


class SlotView:
    """The target context as one slot's answer sees it: its own sequence ``seq`` and
    context length ``n_ctx``, its rows decoded through the :class:`Batcher`."""

    def __init__(self, batcher, seq, n_ctx, n_batch):
        self._batcher = batcher
        self._ctx = ctx = batcher.ctx
        self.seq = seq
        self.n_ctx = n_ctx
        self.n_ctx_all = ctx.n_ctx           # the context's, for a context made to read it (MTP)
        self.n_batch = n_batch
        self.n_ubatch = ctx.n_ubatch
        self.n_vocab = ctx.n_vocab
        self.model = ctx.model
        self.params = ctx.params
        self.type_k, self.type_v = ctx.type_k, ctx.type_v
        self.governor = None            # the real context's governor times the group decodes
        self._offset = 0

    @property
    def ptr(self):
        return self._ctx.ptr

    @property
    def decoded_any(self):
        return self._ctx.decoded_any

    def decode(self, batch):
        self._offset = self._batcher.decode(self.seq, batch)

    def logits(self, i):
        return self._ctx.logits(self._offset + i)

    def trim(self, p0):
        with self._batcher.lock:
            self._ctx.trim(p0, self.seq)

    def try_trim(self, p0):
        with self._batcher.lock:
            return self._ctx.try_trim(p0, self.seq)

    def clear(self):
        with self._batcher.lock:
            self._ctx.clear(self.seq)

    def save_state(self):
        with self._batcher.lock:
            return self._ctx.save_state(self.seq)

    def load_state(self, data):
        with self._batcher.lock:
            return self._ctx.load_state(data, self.seq)

    # MTP drafting reads the target's hidden state of one of this slot's rows.
    def require_nextn(self):
        self._ctx.require_nextn()

    def stage_nextn(self, on, masked):
        self._ctx.stage_nextn(on, masked)

    def copy_nextn_row(self, i, out):
        return self._ctx.copy_nextn_row(self._offset + i, out)
