"""The resident model: one at a time, answering as many requests at once as it has
slots (``geniex serve --parallel``), freed after ``keepalive`` idle seconds.

A request takes a :class:`Lease` on the resident model for as long as it uses it (a
streamed answer until its last event is sent or its client goes away). Leases are
granted first come, first served: the request at the head of the queue starts when the
resident model suits it and has a free slot, or, when it needs another model or other
load settings, once every lease on the resident one is back (the slots drain, then the
model is replaced). So a request never overtakes one that arrived before it, and a
reload is not starved by a stream of requests for the resident model.
"""
import collections
import logging
import threading
import time
from dataclasses import dataclass, replace

from geniex.engine import tasks
from geniex.server.validation import ApiError

log = logging.getLogger("geniex.server")

RETRY_AFTER = 2     # seconds a client told "busy" should wait before trying again
POLL = 0.25         # seconds between checks that a waiting request's client is still there


@dataclass(frozen=True)
class CacheKey:
    """What a resident model must match to be reused: the model, its load options and
    its speculative setup. ``spec=None`` (completions, which never draft) accepts any
    speculative setup of the same model."""

    model: str
    nctx: int
    ngl: int
    compute: tuple                   # device names as resolved (devices.chosen_names)
    cache_types: tuple               # (K, V) KV cache types
    spec: tuple | None
    any_load: bool = False           # any resident of the same model will do (tokenize, props, ...)

    def satisfied_by(self, resident):
        if resident is None:
            return False
        if self.any_load:
            return self.model == resident.model
        same = (self.model, self.nctx, self.ngl, self.compute, self.cache_types) == \
               (resident.model, resident.nctx, resident.ngl, resident.compute, resident.cache_types)
        return same and (self.spec is None or self.spec == resident.spec)

    def as_loaded(self):
        """The key of what a load for this key makes resident: a request that accepts any
        speculative setup (``spec=None``) loads the model without a drafter, which is the
        plain setup ``()``, so a plain chat after a completion or a /tokenize reuses it."""
        return replace(self, spec=() if self.spec is None else self.spec, any_load=False)


class Lease:
    """The turn on the resident model; :meth:`release` (or leaving the ``with``
    block) hands it to the next request. Releasing twice is harmless."""

    def __init__(self, cache, session, waited=0.0):
        self.session = session
        self._cache = cache
        self.released = False
        self.waited = waited            # seconds the request waited for its turn (queue wait)

    def run(self, task, cancel=None, timeout=None):
        """Run a task (:mod:`geniex.engine.tasks`) on the resident model: its events;
        ``timeout`` seconds bound it (a model in a worker process only)."""
        if timeout is None:
            return self.session.run(task, cancel)
        return self.session.run(task, cancel, timeout=timeout)

    def release(self):
        if not self.released:
            self.released = True
            self._cache._give_back()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class ModelCache:
    """Holds at most one loaded model (see the module doc).

    ``keepalive``: seconds a model may stay idle before it is freed; 0 frees it after
    every request, a negative value keeps it until the server stops. ``max_queue``:
    requests that may wait for a lease (None: any); one more is a 503.
    """

    def __init__(self, keepalive=300.0, max_queue=None):
        self.keepalive = keepalive
        self.max_queue = max_queue
        self.stopping = threading.Event()      # set at shutdown: answers in flight end
        self._cond = threading.Condition()
        self._queue = collections.deque()      # waiting requests, first come first
        self._out = 0                          # leases out
        self._loading = False                  # a lease is loading a model (nothing else starts)
        self._session = None
        self._key = None
        self._last_used = time.monotonic()
        self.loads = 0                          # models loaded since the start (/health)
        self.reloads = 0                        # of which replaced a resident model (/metrics)
        self._wake = threading.Event()
        self._closed = False
        # The keepalive thread starts with the first model load, so that making an app
        # (create_app) starts nothing until it serves.
        self._reaper = None

    def lease(self, key, load, cancel=None):
        """Wait for our turn, make sure the model for ``key`` is resident (calling
        ``load(previous)`` -> session if it is not), and return a :class:`Lease` on it.
        ``previous`` is the healthy resident session being replaced, or None: ``load``
        frees it before loading (one model in memory at a time), closing it or reusing
        its worker process (:meth:`~geniex.server.worker.WorkerSession.open`). When
        ``max_queue`` requests are already waiting, raises a 503 with ``Retry-After`` at
        once instead of queueing without bound.
        ``cancel()`` turning true while waiting (the client left) gives up the place."""
        asked = time.monotonic()
        must_load = self._admit(key, cancel)
        try:
            if self.stopping.is_set():
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            waited = time.monotonic() - asked
            if must_load:
                if self._session is not None and not getattr(self._session, "alive", True):
                    # Its worker process died under an earlier request: start a new one.
                    self._free("its worker process ended")
                if not key.satisfied_by(self._key):
                    previous = self._hand_over("another model or load setting was requested")
                    self.reloads += previous is not None
                    log.info("loading %s", key.model)
                    self._session = load(previous)
                    if self._reaper is None:
                        self._reaper = threading.Thread(target=self._reap, name="geniex-keepalive", daemon=True)
                        self._reaper.start()
                    self._key = key.as_loaded()
                    self.loads += 1
                with self._cond:
                    self._loading = False
                    self._cond.notify_all()
            return Lease(self, self._session, waited)
        except BaseException:
            if must_load:
                with self._cond:
                    self._loading = False
            self._give_back()
            raise

    def _admit(self, key, cancel):
        """Wait at the queue until the request may start; True when it must (re)load
        the model first (it then holds the only lease)."""
        me = object()
        with self._cond:
            if (self.max_queue is not None and len(self._queue) >= self.max_queue
                    and (self._queue or self._startable(key) is None)):
                log.warning("queue full (%d waiting): answered 503", self.max_queue)
                raise ApiError(503, f"the server is busy: {self.max_queue} requests are already waiting for the "
                               "model; retry later", code="server_busy", headers={"Retry-After": str(RETRY_AFTER)})
            self._queue.append(me)
            while True:
                start = self._startable(key) if self._queue[0] is me else None
                if start is not None:
                    break
                self._cond.wait(POLL if cancel is not None else None)
                if cancel is not None and cancel() and not (self._queue[0] is me and self._startable(key) is not None):
                    self._queue.remove(me)
                    self._cond.notify_all()    # the next in line may be free to go now
                    log.info("request cancelled (the client went away or the server is stopping) while it "
                             "waited for the model")
                    raise ApiError(503, "the request was cancelled while it waited for the model",
                                   code="request_cancelled")
            self._queue.popleft()
            self._out += 1
            self._loading = start
            self._cond.notify_all()            # the next in line may start too (another slot)
            return start

    def _startable(self, key):
        """None while a request for ``key`` must wait; else whether it must load (the
        condition is held)."""
        if self._loading:
            return None
        if self.stopping.is_set():
            return False
        session = self._session
        usable = session is not None and getattr(session, "alive", True) and (key is None or key.satisfied_by(self._key))
        if usable and self._out < self._capacity():
            return False
        if key is None:                         # no model needed, none to load (forget_drafts)
            return False if session is None and self._out == 0 else None
        return True if not usable and self._out == 0 else None

    def _capacity(self):
        """Leases the resident model takes at once: its slots."""
        slots = getattr(self._session, "slots", None)
        if isinstance(slots, int):
            return max(1, slots)
        return len(slots) if slots is not None else 1

    def forget_drafts(self, cancel=None):
        """Make the resident model's drafters forget what they learned from earlier answers
        (n-gram memory); returns the model's name, or None when no model is resident."""
        self._admit(None, cancel)
        try:
            session = self._session
            if session is None:
                return None
            for _ in session.run(tasks.ForgetDrafts()):
                pass
            return session.name
        finally:
            self._give_back()

    def resident(self):
        """The name of the resident model, or None."""
        session = self._session
        return session.name if session is not None else None

    def resident_nctx(self):
        """The resident model's context length, or None."""
        key = self._key
        return key.nctx if key is not None else None

    def waiting(self):
        """Requests waiting for a lease (llama.cpp's ``requests_deferred``)."""
        with self._cond:
            return len(self._queue)

    @property
    def busy(self):
        return self._out > 0

    def in_use(self):
        """Leases out (requests being answered)."""
        return self._out

    def slots(self):
        """The resident model's slot report (its worker's), or None."""
        session = self._session
        report = getattr(session, "status", None)
        return report() if callable(report) and session is not None else None

    def status(self):
        """What /health reports about the resident model."""
        session = self._session
        idle = None if session is None or self._out else round(time.monotonic() - self._last_used, 3)
        return {"model": session.name if session else None,
                "speculative": bool(session and session.speculative),
                "idle_seconds": idle, "keepalive": self.keepalive, "loads": self.loads,
                "worker_pid": getattr(session, "pid", None),
                "slots": self._capacity() if session is not None else None,
                "slots_busy": self._out, "waiting": self.waiting()}

    def stop(self):
        """Make answers in flight end at their next step (shutdown begins)."""
        self.stopping.set()
        with self._cond:
            self._cond.notify_all()

    def close(self, timeout=30.0):
        """Stop answering, wait for the leases to come back, free the model, end the
        keepalive thread."""
        self.stop()
        self._closed = True
        self._wake.set()
        with self._cond:
            drained = self._cond.wait_for(lambda: self._out == 0, timeout)
            if drained:
                self._out += 1
        if drained:
            try:
                self._free("the server is stopping")
            finally:
                self._give_back()
        else:
            # The model runs in a worker process: ending it cannot take the server down.
            from geniex.server import worker
            log.warning("an answer did not end within %.0f s; stopping its worker process", timeout)
            worker.kill_all()

    # -- internals ----------------------------------------------------------------
    def _give_back(self):
        with self._cond:
            self._out -= 1
            self._last_used = time.monotonic()
            if self.keepalive == 0 and self._out == 0 and not self._closed:
                self._free("keepalive is 0")
            self._cond.notify_all()
        self._wake.set()

    def _hand_over(self, why):
        """The resident session, no longer resident, for the next load to free or reuse."""
        session, self._session, self._key = self._session, None, None
        if session is not None:
            log.info("replacing %s (%s)", session.name, why)
        return session

    def _free(self, why):
        if self._session is not None:
            log.info("freeing %s (%s)", self._session.name, why)
            session, self._session, self._key = self._session, None, None
            session.close()

    def _deadline(self):
        if self._session is None or self._out or self.keepalive <= 0:
            return None
        return self._last_used + self.keepalive

    def _reap(self):
        # Sleeps until the resident model's idle deadline (or a change), then frees it
        # if nobody took or asked for a lease meanwhile.
        while not self._closed:
            deadline = self._deadline()
            self._wake.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            self._wake.clear()
            deadline = self._deadline()
            if self._closed or deadline is None or time.monotonic() < deadline:
                continue
            with self._cond:
                if self._out == 0 and not self._queue and self._deadline() is not None \
                        and time.monotonic() >= self._deadline():
                    self._free(f"idle for {self.keepalive:g} s")
