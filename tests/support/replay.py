"""A stand-in target that replays a known answer: the accept loop and the drafters run
without a model (the fast test tier; the benchmarks' exact counts of drafting,
``tools/bench/counts.py``, which puts this folder on its path for it alone).

The context's logits are one-hot on the next token of ``sequence`` (prompt + the
plain answer) at each row's position, so greedy decoding through
:func:`geniex.engine.loop.steps` reproduces the plain answer whatever the drafter
proposes, and acceptance is exactly what the real target would give the same drafts.
"""
import numpy as np

from geniex.llama.kv import KvHistory
from geniex.llama.objects import Batch


class ReplayContext:
    """Implements the part of :class:`geniex.llama.objects.Context` the loop uses."""

    def __init__(self, sequence, n_vocab, n_ctx=4096, n_batch=512):
        self.sequence = list(sequence)
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_ubatch = n_batch         # the target context's default micro-batch (q8_0 cache: the whole batch)
        self.rows = []               # positions of the last decoded batch
        self.decodes = []            # rows per decode, for tests and benchmarks
        self.kv_end = 0              # positions 0..kv_end-1 are "in the cache"
        self._buf = np.zeros(n_vocab, dtype=np.float32)
        self._hot = None

    def decode(self, batch):
        n = batch.struct.n_tokens
        if n > self.n_batch:
            raise AssertionError(f"batch of {n} rows exceeds n_batch {self.n_batch}")
        self.rows = [int(p) for p in batch.pos[:n]]
        if self.rows[0] != self.kv_end:
            raise AssertionError(f"decode at {self.rows[0]} but the cache ends at {self.kv_end}")
        self.kv_end = self.rows[-1] + 1
        self.decodes.append(n)

    def logits(self, i):
        if self._hot is not None:
            self._buf[self._hot] = 0.0
        nxt = self.rows[i] + 1
        if nxt >= len(self.sequence):
            raise RuntimeError("replay ran past the known answer")
        self._hot = self.sequence[nxt]
        self._buf[self._hot] = 1.0
        return self._buf

    def trim(self, p0):
        self.kv_end = min(self.kv_end, p0)

    def try_trim(self, p0):
        self.trim(p0)
        return True

    def clear(self):
        self.kv_end = 0


class ReplayVocab:
    """End tokens and one-byte pieces (token ``t`` prints ``chr(t % 94 + 33)``)."""

    def __init__(self, eog=frozenset()):
        self.eog = frozenset(eog)

    def piece(self, token):
        return bytes([token % 94 + 33])


class ReplayTarget:
    """What :func:`geniex.engine.loop.steps` needs: context, vocabulary, KV history, batch."""

    def __init__(self, sequence, n_vocab, eog=(), n_ctx=4096, n_batch=512):
        self.ctx = ReplayContext(sequence, n_vocab, n_ctx, n_batch)
        self.vocab = ReplayVocab(eog)
        self.kv = KvHistory(self.ctx)
        self.batch = Batch(max(n_batch, 512))

    def steps(self, prompt, opts, drafter=None, cancel=None, stats=None, policy=None):
        """Run the real loop on this replay."""
        from geniex.engine import loop
        from geniex.speculative.drafters.base import NO_DRAFTER
        return loop.steps(self.ctx, self.vocab, self.kv, self.batch, prompt, opts,
                          drafter or NO_DRAFTER, cancel, stats, policy or loop.FIXED)
