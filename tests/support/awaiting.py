"""Awaiting a state instead of sleeping on it: a test that orders events waits until
the state it needs holds (a thread is queued, a model is resident, a log line came),
however slow the machine, and fails with a clear message when it never does.

The timeout is a bound on a hang, never a measurement: nothing here asserts how fast
anything was."""
import time

POLL = 0.01      # seconds between looks


def until(predicate, timeout=60.0, what=None):
    """Call ``predicate()`` until it returns a true value, and return that value;
    fail with ``what`` (or the predicate's name) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {timeout:g} s for {what or predicate.__name__}")
        time.sleep(POLL)


def queued(lock, n, timeout=60.0):
    """Wait until ``n`` requests wait for a model cache's lease (anything with
    ``waiting()``)."""
    until(lambda: lock.waiting() == n, timeout, f"{n} waiting for a lease (now {lock.waiting()})")
