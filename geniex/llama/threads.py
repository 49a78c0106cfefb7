"""Every core while the machine is quiet, one thread while a neighbour holds a core.

ggml's CPU backend runs a decode on OpenMP threads that meet at a barrier after every
graph node, spinning while they wait (the default, active wait policy). On a quiet
machine that is the fastest way to decode. When another process holds a core, a
spinning thread and the thread it waits for share one core, and a 15 ms decode takes
0.5-1 s (tools/BENCHMARKS.md, "Busy machines"). A passive wait policy removes the stalls
but makes every barrier a sleep and a wake-up, which cost a third of the speed of a
quiet two-thread decode, so geniex keeps the active policy and watches instead.

:class:`ThreadGovernor` times each small decode against the fastest recent one. Two
decodes in a row that take :data:`SLOW` times longer mean a busy neighbour: the context
drops to one thread (``llama_set_n_threads``, no reallocation) for a while, then tries
every core again, waiting twice as long after each failed try. With a quantized KV cache
the thread count does not change a single bit of the logits (tests/test_kv_cache_types.py),
so switching never changes the answer.
"""
import time

SLOW = 4.0            # a decode this many times slower than the fastest recent one is a stall
ROW_COST = 0.3        # extra cost of a batch row, in one-row decodes (only to compare sizes)
MAX_ROWS = 16         # larger batches (prompt chunks) are not compared: they scale differently
FIRST_REST = 32       # decodes on one thread before trying every core again
MAX_REST = 2048


CALM = 256            # normal decodes on every core after which the back-off is forgotten


class ThreadGovernor:
    """Moves a context between every core and one thread by the time its decodes take.

    Attach with ``ctx.governor = ThreadGovernor(ctx, threads, threads_batch)``;
    :meth:`geniex.llama.objects.Context.decode` then reports each decode's time.
    """

    def __init__(self, ctx, threads, threads_batch):
        self.ctx = ctx
        self.full = (threads, threads_batch)
        self.single = False
        self.fastest = None            # seconds of the fastest recent one-row-equivalent decode
        self.strikes = 0
        self.normal = 0
        self.rest = FIRST_REST
        self.left = 0
        self.switches = 0              # how often it dropped to one thread (for --verbose)

    def observe(self, rows, seconds):
        """A decode of ``rows`` rows took ``seconds``."""
        if self.single:
            self.left -= 1
            if self.left <= 0:
                self.single = False
                self.strikes = self.normal = 0
                self.ctx.set_threads(*self.full)
            return
        if rows > MAX_ROWS:
            return
        per_row = seconds / (1 + ROW_COST * (rows - 1))
        if self.fastest is None or per_row < self.fastest:
            self.fastest = per_row
        elif per_row > SLOW * self.fastest:
            self.strikes += 1
            if self.strikes >= 2:          # two in a row: a neighbour, not a hiccup
                self._to_single()
            return
        else:
            # Later positions cost a little more: let the reference follow normal decodes.
            self.fastest += 0.02 * (per_row - self.fastest)
        self.strikes = 0
        self.normal += 1
        if self.normal >= CALM:
            self.rest = FIRST_REST

    def _to_single(self):
        self.single = True
        self.switches += 1
        self.left = self.rest
        self.rest = min(self.rest * 2, MAX_REST)
        self.ctx.set_threads(1, 1)
