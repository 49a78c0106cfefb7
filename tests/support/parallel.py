"""The suite on pytest-xdist workers, one CPU each (a pytest plugin, registered in
tests/conftest.py; setup.cfg's ``addopts`` asks for ``-n auto --dist loadfile``).

Decoding on this suite's 2-core machine scales well with threads (two threads decode
1.8x as fast as one), so two workers decoding at once gain little over one on both
cores; what they gain is the rest of a test's time (process starts, model loads, HTTP,
Python), through which one worker leaves the other core idle. Two rules make it work:

- **One CPU per worker.** A worker sets its CPU affinity to one CPU before anything is
  loaded. geniex's default thread count is the cores a process may run on
  (``geniex.config.physical_cores``), so in-process sessions, and the CLIs, servers and
  model workers the test starts (they inherit the affinity), decode on one thread.
  Two workers each decoding on both cores would put four OpenMP threads on two CPUs,
  each spinning at every barrier for a thread that cannot run: a prompt took 5x as long.
- **``@pytest.mark.all_cores``** marks a test whose point is decoding on several threads
  (the identity of speculative output on every core, thread switching, split attention):
  for its duration its worker may run on every CPU again, so the default is every core
  and explicit thread counts run in parallel. It shares the CPUs with the other worker's
  test; ``GOMP_SPINCOUNT`` (set here for every process of the run) makes an OpenMP thread
  waiting at a barrier sleep after a short spin instead of holding a CPU the thread it
  waits for needs. Numerics do not depend on timing, so sharing changes no token.

Measured with the README's test command from a clean clone on a 2-core VM decoding at half
the speed of the one in docs/development.md: 363-426 s this way (the VM drifts ~15% within
an hour), against 550-600 s in one process. Tried and dropped: all_cores tests run alone
while the other worker waits on a lock (428 s: a CPU sits idle meanwhile), and workers
not held to a CPU, one thread each through ``OMP_NUM_THREADS`` (430 s).

Without the affinity call (macOS, Windows) or with one CPU, ``-n auto`` starts no worker
and the suite runs in one process as before. Files that share a costly session-scoped
fixture go to one worker (:data:`SAME_WORKER`).
"""
import os

import pytest

# OpenMP's spin before a waiting thread sleeps, in iterations (libgomp's default is
# 300,000 unless a process has more threads than CPUs, when it drops to 1,000 on its own:
# the value here, for processes started while a test had every CPU).
SPIN = "1000"

# Files whose tests share a session-scoped fixture too costly to build twice: the
# identity bench (tests/speculative/conftest.py's ``long_bench``: a load and ~1,000-token
# prefill) serves both.
SAME_WORKER = {
    "tests/speculative/test_identity_long.py": "long_bench",
    "tests/speculative/test_identity_constrained.py": "long_bench",
}

# The files that take longest (``--durations``), handed out first: loadfile gives files to
# workers in collection order, and the 50-s slots identity file coming last left the other
# worker idle (measured 2026-12-04: 306 against 270 s of test time per worker).
HEAVY_FIRST = (
    "tests/speculative/test_identity_long.py", "tests/speculative/test_identity_constrained.py",
    "tests/speculative/test_slots_identity.py", "tests/engine/test_prompt_reader.py",
    "tests/server/test_tool_calls.py", "tests/speculative/test_speculative.py",
    "tests/server/test_llama_surface.py", "tests/llama/test_kv_cache_types.py", "tests/tools/test_bench.py",
)

_all_cpus = None        # the CPUs the run may use, in a worker that pinned itself
_own_cpu = None


def _can_pin():
    return hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1


def _set_affinity(cpus):
    """Every thread of this process (affinity is per thread on Linux: OpenMP's pool and
    the servers' threads keep the mask they were started with) may run on ``cpus``."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, ValueError):
            pass                # a thread that ended meanwhile


def pytest_configure(config):
    global _all_cpus, _own_cpu
    config.addinivalue_line("markers", "all_cores: decodes on several threads; under pytest-xdist its worker may "
                                       "use every CPU for the test's duration (tests/support/parallel.py)")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None and getattr(config.option, "numprocesses", None):
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN)       # the workers and all they start inherit it
    if worker is not None and _can_pin():
        allowed = sorted(os.sched_getaffinity(0))
        _all_cpus, _own_cpu = set(allowed), allowed[int(worker.lstrip("gw")) % len(allowed)]
        _set_affinity({_own_cpu})


def pytest_collection_modifyitems(config, items):
    """Under xdist, :data:`HEAVY_FIRST`'s files first (a stable sort: every worker
    collects the same order, and each file keeps its own)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return

    def rank(item):
        path = item.nodeid.split("::")[0]
        return HEAVY_FIRST.index(path) if path in HEAVY_FIRST else len(HEAVY_FIRST)
    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """One worker per CPU where a worker can be held to one; otherwise none (one process)."""
    return len(os.sched_getaffinity(0)) if _can_pin() else 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with :data:`SAME_WORKER`'s files as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            scope = super()._split_scope(nodeid)
            return SAME_WORKER.get(scope, scope)

    return SharedFixtureScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """An ``all_cores`` test (setup, call and teardown) runs with every CPU."""
    widen = _all_cpus is not None and item.get_closest_marker("all_cores") is not None
    if widen:
        _set_affinity(_all_cpus)
    try:
        yield
    finally:
        if widen:
            _set_affinity({_own_cpu})
