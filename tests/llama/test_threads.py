"""The thread governor: one thread while decodes on every core are slower, every core
otherwise; the answer never changes."""
import pytest

from geniex.llama import threads
from geniex.llama.threads import ThreadGovernor

# Answers that move between one thread and every core (tests/support/parallel.py).
pytestmark = pytest.mark.all_cores


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The governor's tests decide what the machine shows (other runnable tasks: none),
    whatever else runs beside the suite."""
    real = threads.others_running
    monkeypatch.setattr(threads, "others_running", lambda: 0)
    return real


class Recorder:
    """Stands in for a context's ``set_threads`` to record the governor's choices."""

    def __init__(self):
        self.calls = []

    def set_threads(self, n, nb):
        self.calls.append((n, nb))


def feed(g, times, n, rows=1):
    """``n`` decodes of ``rows`` rows taking ``times[setting the context has]`` seconds
    (told before and after, as Context.decode tells it)."""
    for _ in range(n):
        g.before(rows)
        g.observe(rows, times[g.active])


@pytest.mark.fast
def test_quiet_machine_stays_on_every_core_and_probes_ever_more_rarely():
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    feed(g, {"all": 0.006, "one": 0.007}, 2000)
    assert g.mode == "all" and g.switches == 0
    assert g.interval == threads.MAX_INTERVAL
    probes = ctx.calls.count((1, 1))
    assert probes * threads.PROBE_LEN < 2000 * 0.05       # few decodes spent probing


@pytest.mark.fast
def test_a_busy_neighbour_moves_it_to_one_thread_and_back():
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    feed(g, {"all": 0.006, "one": 0.007}, 50)
    feed(g, {"all": 0.020, "one": 0.0075}, 60)          # a neighbour arrives
    assert g.mode == "one" and ctx.calls[-1] == (1, 1)
    feed(g, {"all": 0.006, "one": 0.0075}, 400)         # it leaves
    assert g.mode == "all" and ctx.calls[-1] == (2, 2) and g.switches == 2


@pytest.mark.fast
def test_probes_run_on_one_row_decodes_only():
    """A verify batch of 8 rows on the probed (slower) setting costs an answer several
    one-row decodes: a due probe waits for a one-row decode, and a batch ends a probe."""
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    # One thread slower, but not by ABORT (which would end the probe at its first decode).
    quiet = {"all": 0.006, "one": 0.008}
    feed(g, quiet, threads.FIRST_PROBE)                 # a probe is due now...
    batch8 = {k: v * (1 + threads.ROW_COST * 7) for k, v in quiet.items()}
    feed(g, batch8, 5, rows=8)                          # ... and waits through batches
    assert ctx.calls == [] and g.active == "all"
    feed(g, quiet, 1)                                   # the next one-row decode starts it
    assert ctx.calls == [(1, 1)] and g.active == "one" and g.probe_left
    feed(g, batch8, 1, rows=8)                          # a batch ends it, on every core
    assert ctx.calls == [(1, 1), (2, 2)] and g.active == "all" and not g.probe_left
    assert g.mode == "all"
    # Over a speculative answer's mix of one-row steps and batches, no batch ran on one thread.
    ran = []
    for _ in range(300):
        for rows in (1, 1, 8, 1, 12):
            g.before(rows)
            ran.append((rows, g.active))
            g.observe(rows, quiet[g.active] * (1 + 0.5 * (rows - 1)))
    assert ("one", 1) in {(a, r) for r, a in ran}       # it still probed
    assert not [r for r, a in ran if r > 1 and a == "one"]


@pytest.mark.fast
def test_prompt_chunks_are_not_measured():
    g = ThreadGovernor(Recorder(), 2, 2)
    g.observe(512, 2.0)
    assert g.estimate == {"all": None, "one": None}


def test_switching_threads_mid_answer_keeps_the_answer(demo_model, monkeypatch):
    """With the default q8_0 cache, one thread and every core give bitwise the same
    logits: a governor that probes and switches all the time changes nothing."""
    from geniex.engine.loop import GenOptions
    from geniex.engine.sampling import SamplingParams
    from geniex.engine.session import LoadOptions, Session
    s = Session(demo_model, LoadOptions(nctx=1024, threads=2, threads_batch=2))
    try:
        assert s.ctx.governor is not None
        # A 512-cell KV window (where an F16 cache's one-row path changes: 257+ cached
        # cells, padded to 256, see tests/llama/test_kv_cache_types.py); the answers are
        # short, with a switch every few decodes from the first ones on: one-row decodes
        # on two threads are what a loaded machine makes slow.
        prompt = s.vocab.tokenize("The history of the lighthouse begins " * 60)[:260]
        s.ctx.governor = None
        ref = s.generate(prompt, GenOptions(max_tokens=40, sampling=SamplingParams())).run()
        monkeypatch.setattr(threads, "PROBE_EVERY", 2)
        monkeypatch.setattr(threads, "FIRST_PROBE", 2)
        monkeypatch.setattr(threads, "MAX_INTERVAL", 2)
        # Every probe wins, whatever it measured: switch each time. (A finite margin lost
        # probes on a busy machine, where a stalled two-thread decode of a short cache took
        # over 10 one-thread ones: 4 switches, not 5.)
        monkeypatch.setattr(threads, "MARGIN", float("inf"))
        # Probes of a fixed length, whatever the decodes take (a slow probe would end
        # early on a loaded machine): the number of switches follows from the length.
        monkeypatch.setattr(threads, "ABORT", float("inf"))
        monkeypatch.setattr(threads, "PROBE_LEN", 2)
        s.ctx.governor = ThreadGovernor(s.ctx, 2, 2)
        # The prompt stays cached (the second answer decodes only its last token): both
        # answers read the same cache, and the prompt is decoded once.
        gen = s.generate(prompt, GenOptions(max_tokens=40, sampling=SamplingParams()))
        got = gen.run()
        assert gen.stats.prompt_reused == len(prompt) - 1
        assert s.ctx.governor.switches >= 5
        assert got == ref
    finally:
        s.close()


def test_no_governor_with_an_f16_cache(demo_model):
    """An F16 cache's one-row decodes depend on the thread count past 512 cells: the
    thread count then stays as configured."""
    from geniex.engine.session import LoadOptions, Session
    s = Session(demo_model, LoadOptions(nctx=512, threads=2, threads_batch=2,
                                        cache_type_k="f16", cache_type_v="f16"))
    try:
        assert s.ctx.governor is None
    finally:
        s.close()


@pytest.mark.fast
def test_under_a_busy_neighbour_probes_of_every_core_stop_at_one_measured_decode():
    """The costly side of probing: next to a neighbour an every-core decode takes ~2.7x a
    one-thread decode, so the governor finds one thread early and then spends only two
    decodes (one to wake the threads, one measured) per probe of every core."""
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    on_all = 0
    for _ in range(600):
        on_all += g.active == "all"
        g.before(1)
        g.observe(1, {"all": 0.020, "one": 0.0075}[g.active])
    assert g.mode == "one"
    assert on_all <= threads.FIRST_PROBE + threads.PROBE_LEN + 2 * 6    # discovery + ~6 probes


@pytest.mark.fast
@pytest.mark.parametrize("times, start", [({"all": 0.006, "one": 0.011}, "all"), ({"all": 0.020, "one": 0.0075}, "one")])
def test_settle_starts_on_the_faster_setting(times, start):
    """Before the first answer: one-row decodes timed on both settings (after a wake-up
    decode on the other), so a short answer beside a busy neighbour starts on one thread."""
    import time
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    g.settle(lambda: time.sleep(times[g.active]))
    assert g.mode == start and g.active == start
    assert ctx.calls[0] == (1, 1) and ctx.calls[-1] == {"all": (2, 2), "one": (1, 1)}[start]


@pytest.mark.fast
def test_a_probe_that_loses_badly_ends_at_its_wake_up_decode_and_backs_off_fourfold():
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    busy = {"all": 0.045, "one": 0.0075}        # every core beside a neighbour: 6x one thread
    g.estimate["one"], g.mode = busy["one"], "one"
    g._use("one")
    g.skip = False
    interval = g.interval
    feed(g, busy, g.interval)                   # a probe of every core is due
    feed(g, busy, 1)                            # its first decode (the wake-up) ...
    assert g.active == "one" and not g.probe_left          # ... ended it
    assert g.interval == 4 * interval
    assert ctx.calls[-2:] == [(2, 2), (1, 1)]


@pytest.mark.fast
def test_a_probe_of_every_core_waits_while_another_task_is_runnable(monkeypatch):
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    g.estimate["one"], g.mode = 0.0075, "one"
    g._use("one")
    g.skip = False
    monkeypatch.setattr(threads, "others_running", lambda: 1)     # a neighbour runs
    feed(g, {"all": 0.045, "one": 0.0075}, 10 * threads.MAX_INTERVAL)
    assert ctx.calls == [(1, 1)]                                   # never tried every core
    monkeypatch.setattr(threads, "others_running", lambda: 0)     # it left
    feed(g, {"all": 0.004, "one": 0.0075}, g.interval + threads.PROBE_LEN + 1)
    assert g.mode == "all"


@pytest.mark.fast
def test_others_running_reads_the_machine(quiet_machine):
    import subprocess, sys
    n = quiet_machine()
    assert n is None or n >= 0
    if n is not None:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            import time
            time.sleep(0.3)
            assert quiet_machine() >= 1
        finally:
            busy.kill()
            busy.wait()


@pytest.mark.fast
def test_a_neighbour_arriving_after_a_long_quiet_spell_is_found_soon(monkeypatch):
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    feed(g, {"all": 0.006, "one": 0.011}, 3000)                    # quiet: probes as rare as they get
    assert g.interval == threads.MAX_INTERVAL and g.mode == "all"
    monkeypatch.setattr(threads, "others_running", lambda: 1)     # our own spinning thread only
    before = ctx.calls.count((1, 1))
    feed(g, {"all": 0.006, "one": 0.011}, 200)
    assert g.mode == "all" and ctx.calls.count((1, 1)) <= before + 1
    monkeypatch.setattr(threads, "others_running", lambda: 2)     # and a neighbour arrives
    slow = {"all": 0.045, "one": 0.0075}
    on_all = 0
    for _ in range(100):
        on_all += g.active == "all"
        g.before(1)
        g.observe(1, slow[g.active])
    assert g.mode == "one" and on_all <= 3 * threads.LOOK_EVERY     # two looks, then the probe
