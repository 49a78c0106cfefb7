"""Every core while the machine is quiet, one thread while a neighbour holds a core.

ggml's CPU backend runs a decode on OpenMP threads that meet at a barrier after every
graph node, spinning while they wait (the default, active wait policy). On a quiet
machine that is the fastest way to decode. When another process holds a core, a
spinning thread and the thread it waits for share one core, and a decode on every core
can take several times as long as on one thread (8-10x with a busy loop on one of two
cores: tools/bench/BENCHMARKS.md, "Busy neighbour"). A passive wait policy removes the
stalls but makes every barrier a sleep and a wake-up, which costs much of a quiet
two-thread decode's speed, so geniex keeps the active policy and measures instead.

:class:`ThreadGovernor` keeps a running estimate of the time per decoded row on every core
and on one thread. It decodes on the faster one, and every so often tries the other for a
few decodes (:data:`PROBE_LEN`; one, when that one is clearly slower, :data:`ABORT`) to
refresh its estimate; it switches when the other is clearly faster (:data:`MARGIN`). A
probe runs on one-row decodes only: it starts at the next one-row decode once due, and
ends before a batch of several rows (a verify batch of 8-16 rows on the slower setting
cost an answer several one-row decodes).
Probes grow rarer while the answer stays the same (up to every :data:`MAX_INTERVAL`
decodes), so on a quiet machine they cost well under 1%; a probe that loses by more
than :data:`ABORT` ends at its first decode (the one that wakes the threads) and puts the
next one four times as far (the every-core probes beside a busy neighbour cost 6x a
one-thread decode each), and a probe of every core waits while another task is runnable
(:func:`others_running`), while on every core a task runnable at two looks in a row brings
the next probe of one thread forward (a neighbour that arrives after a long quiet spell is
found within 2 x :data:`LOOK_EVERY` decodes, not :data:`MAX_INTERVAL`). Before the first answer, :meth:`ThreadGovernor.settle` times a
one-row decode on both settings and starts on the faster, so a short answer beside a
neighbour does not spend its first decodes finding out. The
thread count is changed with ``llama_set_n_threads`` (no reallocation). With a quantized
KV cache the thread count does not change a single bit of the logits
(tests/llama/test_kv_cache_types.py), so switching never changes an answer; the session
attaches a governor only then.
"""
import time

PROBE_EVERY = 24      # decodes between probes of the other setting, at first
FIRST_PROBE = 8       # ... except the first probe, this soon after the context's first decode
MAX_INTERVAL = 384    # ... and at most, after probes that changed nothing
PROBE_LEN = 4         # decodes per probe (the first is not measured)
MARGIN = 0.85         # switch when the other setting takes less than this share of the time
ABORT = 1.5           # a probe whose measured decode takes this many times the current
                      # setting's stops there (a busy neighbour makes every-core decodes 2-3x)
LOOK_EVERY = 2        # on every core, look this often (decodes) for another runnable task (a neighbour)
SETTLE_DECODES = 2    # measured decodes per setting before the first answer (a neighbour's
                      # time slices make a single one noisy)
ALPHA = 0.3           # weight of a new measurement in a running estimate
ROW_COST = 0.5        # extra cost of a batch row, in one-row decodes (only to compare sizes)
MAX_ROWS = 16         # larger batches (prompt chunks) are not measured: they scale differently


class ThreadGovernor:
    """Moves a context between every core and one thread by the time its decodes take.

    Attach with ``ctx.governor = ThreadGovernor(ctx, threads, threads_batch)``;
    :meth:`geniex.llama.objects.Context.decode` then reports each decode's time.
    """

    def __init__(self, ctx, threads, threads_batch):
        self.ctx = ctx
        self.settings = {"all": (threads, threads_batch), "one": (1, 1)}
        self.mode = "all"              # the setting we decode on
        self.active = "all"            # the setting the context has now (differs while probing)
        self.estimate = {"all": None, "one": None}   # seconds per row
        self.count = PROBE_EVERY - FIRST_PROBE
        self.interval = PROBE_EVERY
        self.probe_left = 0
        self.due = False               # a probe waits for the next one-row decode
        self.skip = False
        self.seen = 0                  # looks in a row that found another runnable task
        self.switches = 0              # how often it changed setting (tests read it)

    def observe(self, rows, seconds):
        """A decode of ``rows`` rows took ``seconds``."""
        if self.skip:
            self.skip = False              # the first decode after a change wakes threads up
            current = self.estimate[self.mode]
            if self.probe_left and current is not None and seconds > ABORT * current * (1 + ROW_COST * (rows - 1)):
                # Even a wake-up decode this slow says enough: the probe loses.
                self.probe_left = 0
                self.interval = min(self.interval * 4, MAX_INTERVAL)
                self._use(self.mode)
                return
        elif rows <= MAX_ROWS:
            per_row = seconds / (1 + ROW_COST * (rows - 1))
            old = self.estimate[self.active]
            self.estimate[self.active] = per_row if old is None else old + ALPHA * (per_row - old)
        if self.probe_left:
            self.probe_left -= 1
            probe, current = self.estimate[self.active], self.estimate[self.mode]
            # Probing the every-core setting next to a busy neighbour costs 2-3 one-thread
            # decodes per decode: one measured decode that loses by that much is enough.
            if probe is not None and current is not None and probe > ABORT * current:
                self.probe_left = 0
                self.interval = min(self.interval * 2, MAX_INTERVAL)    # and doubled again below
            if not self.probe_left:
                self._decide()
            return
        self.count += 1
        if self.mode == "all" and self.count % LOOK_EVERY == 0:
            # On every core, a task runnable at two looks in a row is likely a neighbour
            # that arrived: try one thread now rather than after a long quiet interval.
            # Our own decode threads may still be spinning at their barrier, runnable:
            # only what runs beyond them is another task.
            self.seen = self.seen + 1 if (others_running() or 0) > self.settings["all"][0] - 1 else 0
        if self.count >= self.interval or self.seen >= 2:
            self.count = self.seen = 0
            self.due = True

    def settle(self, decode):
        """Start on the faster setting: ``decode()`` runs one one-row decode (the caller
        undoes it); called before the first answer, right after a decode on every core
        (the load's warm-up) so that every core's threads are awake."""
        other = "one" if self.mode == "all" else "all"
        times = {}
        for mode in (self.mode, other):
            self._use(mode)
            if self.skip:
                decode()                   # wakes the threads
                self.skip = False
            t0 = time.perf_counter()
            for _ in range(SETTLE_DECODES):
                decode()
            times[mode] = (time.perf_counter() - t0) / SETTLE_DECODES
        self.estimate.update(times)
        if times[other] < MARGIN * times[self.mode]:
            self.mode = other
            self.switches += 1
        self._use(self.mode)
        self.count = 0                     # measured now: the first probe comes a whole interval later

    def before(self, rows):
        """A decode of ``rows`` rows is about to run: start a due probe if it is one row,
        end a probe under way if it is several."""
        if rows > 1:
            if self.probe_left:
                self.probe_left = 0
                self._decide()
        elif self.due:
            self.due = False
            other = "one" if self.mode == "all" else "all"
            if other == "all" and (others_running() or 0) > 0:
                # Another task is runnable right now: every core would share one with it,
                # and the probe would cost several one-thread decodes to learn that.
                return                     # (counted from here: a whole interval later)
            self.estimate[other] = None    # a probe measures afresh: the machine may have changed
            self._use(other)
            self.probe_left = PROBE_LEN

    def _decide(self):
        probed, current = self.active, self.mode
        a, b = self.estimate[current], self.estimate[probed]
        if a is not None and b is not None and b < MARGIN * a:
            self.mode = probed
            self.switches += 1
            self.interval = PROBE_EVERY
        elif b is not None:
            self.interval = min(self.interval * 2, MAX_INTERVAL)
        # (b is None: a batch ended the probe before it measured a decode; the next one
        # comes after the same interval.)
        self._use(self.mode)

    def _use(self, mode):
        if mode != self.active:
            self.ctx.set_threads(*self.settings[mode])
            self.active = mode
            self.skip = True


def others_running():
    """How many tasks besides the caller are runnable right now, machine-wide (Linux's
    /proc/loadavg), or None where the system does not say. A busy neighbour is one."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0]) - 1
    except (OSError, ValueError, IndexError):
        return None
