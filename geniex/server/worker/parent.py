"""The server's side of a worker: starting it, loading a model in it, running tasks.

:class:`WorkerSession` is what the server's :class:`~geniex.server.cache.ModelCache`
holds: ``name``, ``speculative``, ``slots``, ``run(task, cancel)`` yielding the task's
events, ``status()`` and ``close()``. Several runs may be in flight at once on a model
loaded with slots: the reader thread of :class:`_Process` hands each run's replies to
that run's own queue.
"""
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from geniex import profile
from geniex.errors import LoadCancelled, LoadTimeout, ModelCrashed, ModelLoadError, RequestTimeout, ServerStopping
from geniex.server.worker.wire import CLOSE_WAIT, exit_text, read, rebuild, write

log = logging.getLogger("geniex.server")

POLL = 0.1                  # seconds between checks of a request's cancel() while it waits for the worker
GRACE = 15.0                # seconds past a request's deadline before its worker is killed
MIN_TIMEOUT = 60.0          # the default request timeout is never shorter (docs/isolation.md)
TIMEOUT_FACTOR = 4          # ... and covers this many times a full context of one-row decodes
# A load must end within LOAD_MIN seconds plus one per LOAD_RATE bytes of the files it
# reads (the model, its draft model, its projector): a slow disk's pace, so that only a
# load that hangs runs out (geniex serve --load-timeout sets another bound).
LOAD_MIN = 60.0
LOAD_RATE = 25e6
ORPHAN_KEEP = 30.0          # seconds a load left by its cancelled request is kept for the next one
DEATH_WAIT = 5.0            # seconds a killed worker is waited for (a hung read may keep it alive)
_live = set()               # every running worker, killed if the server process exits first
_live_lock = threading.Lock()


# The worker's first lines: import the ``geniex`` package from the folder given as the
# argument, and only that package, then run the worker. Its sys.path stays the
# interpreter's own (the standard library first), as the server's is.
_LAUNCH = """\
import importlib.machinery, importlib.util, sys
spec = importlib.machinery.PathFinder.find_spec("geniex", [sys.argv[1]])
module = sys.modules["geniex"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from geniex.server.worker.child import main
main()
"""


def worker_command():
    """The command that starts a worker: the server's interpreter, importing the same
    geniex as the server (a source checkout included), from the folder the server found
    it in. That folder is not put on the worker's PYTHONPATH: installed, it is
    site-packages, and PYTHONPATH goes ahead of the standard library, so a module there
    named like a standard one (an old backport: ``enum``, ``typing``) replaced it."""
    return [sys.executable, "-c", _LAUNCH, str(Path(__file__).resolve().parents[3])]


class _Process:
    """A worker process and a thread reading its replies into a queue; ``("died",
    returncode)`` is queued when its output ends."""

    def __init__(self):
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        kwargs = {}
        if os.name == "posix":
            kwargs["start_new_session"] = True      # Ctrl-C in a terminal goes to the server only
        else:
            kwargs["creationflags"] = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
        self.proc = subprocess.Popen(worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     **kwargs)
        self.pid = self.proc.pid
        self.stopped = False        # killed because the server is stopping
        self.replies = queue.Queue()        # replies to loads (and "died")
        self._runs = {}                     # run id (or ("status", id)) -> its own queue of replies
        self._runs_lock = threading.Lock()
        self.returncode = None              # once its end was read
        self._send_lock = threading.Lock()
        with _live_lock:
            _live.add(self)
        threading.Thread(target=self._read_replies, name=f"geniex-worker-{self.pid}", daemon=True).start()

    def _read_replies(self):
        try:
            while True:
                frame = read(self.proc.stdout)
                if frame is None:
                    break
                for message in frame:
                    if message[0] == "log":
                        _emit(message)
                    else:
                        self._route(message)
        except Exception as e:      # noqa: BLE001 - a broken worker is a dead one
            log.warning("worker %d sent a broken frame (%s); stopping it", self.pid, e)
            self.kill()
        returncode = self.proc.wait()
        # Closed here, once, by the one thread that read them (not whenever the garbage
        # collector gets to them); a send after this fails and reports the worker gone.
        with self._send_lock:
            for pipe in (self.proc.stdout, self.proc.stdin):
                try:
                    pipe.close()
                except OSError:
                    pass
        with self._runs_lock:
            self.returncode = returncode
            waiting = list(self._runs.values())
        for q in waiting:
            q.put(("died", returncode))
        self.replies.put(("died", returncode))
        with _live_lock:
            _live.discard(self)

    def _route(self, message):
        """A run's reply (or a status reply) to its queue; a load's to :attr:`replies`."""
        kind = message[0]
        key = None
        if kind in ("event", "end") or (kind == "error" and len(message) == 3):
            key = message[1]
        elif kind == "status":
            key = ("status", message[1])
        if key is None:
            self.replies.put(message)
            return
        with self._runs_lock:
            q = self._runs.get(key)
        if q is not None:
            q.put(message)                  # (the tail of a run nobody reads any more is dropped)

    def register(self, key):
        """A queue for the replies of run ``key`` (``("died", code)`` too, if the worker
        ends first); :meth:`unregister` when done."""
        q = queue.Queue()
        with self._runs_lock:
            if self.returncode is not None:
                q.put(("died", self.returncode))
            self._runs[key] = q
        return q

    def unregister(self, key):
        with self._runs_lock:
            self._runs.pop(key, None)

    def send(self, message):
        """False when the worker is gone (its stdin is closed)."""
        try:
            with self._send_lock:
                write(self.proc.stdin, message)
            return True
        except (OSError, ValueError):
            return False

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass


class WorkerSession:
    """A loaded model in a worker process, used like a Session by the server's cache.

    :meth:`open` starts the worker and loads the model; a load the library refuses is
    the :class:`~geniex.errors.ModelLoadError` it would be in one process, and a load
    that kills the worker is one too (naming the model and how the worker ended).
    """

    def __init__(self, process, name, info):
        self._process = process
        self.name = name
        self.pid = process.pid
        self.speculative = bool(info.get("speculative"))
        self.spec_notes = list(info.get("spec_notes") or ())
        self.device_note = info.get("device_note")
        self.nctx = info.get("nctx")
        # One-row decode seconds measured at load: the default request timeout comes from it.
        self.row_seconds = float(info.get("row_seconds") or 0.0)
        self.slots = int(info.get("slots") or 1)    # answers it runs at once (serve --parallel)
        self.crashed = None             # how the worker ended, once it died under a request
        self.handed_over = False        # its process went on to load the next model
        self._runs = 0
        self._active = set()            # run ids whose end has not been read yet
        self._lock = threading.Lock()

    @classmethod
    def open(cls, target, options, previous=None, cancel=None, load_timeout=None):
        """Load ``target`` (a ResolvedModel) with ``options`` (LoadOptions) in a worker.
        ``previous``, the session this one replaces (or None), is freed first: a healthy
        worker is reused (it closes its model and loads the new one in place, without a
        new process, its imports and library load), one that crashed, was killed or is
        still busy ends and a new worker starts (docs/isolation.md).

        The load is bounded: ``load_timeout`` seconds (0: no bound; None:
        :func:`load_bound`); a load over it has its worker
        killed, a :class:`~geniex.errors.LoadTimeout`. ``cancel()`` turning true (the
        client went away, the server is stopping) stops the wait, a
        :class:`~geniex.errors.LoadCancelled`; the load goes on in the background and the
        next load of the same model with the same options picks it up (a client that
        gives up before a long load ends and asks again does not start it over each
        time); a load of anything else ends it."""
        bound = load_bound(target, options) if load_timeout is None else (load_timeout or None)
        orphan = _take_orphan()
        if orphan is not None and previous is None and orphan.loads(target, options):
            process, deadline, reply, note = orphan.process, orphan.deadline, orphan.reply, " (picked up)"
            log.info("%s: picking up its load left by a cancelled request (worker process %d)",
                     target.name, process.pid)
        else:
            if orphan is not None:
                orphan.discard("another load was asked for")
            process = previous._hand_over() if previous is not None else None
            note = " (reloaded in place)" if process is not None else ""
            if process is None:
                process = _Process()
            level = logging.getLogger("geniex").getEffectiveLevel()
            native = logging.getLogger("geniex.llama.cpp").getEffectiveLevel()
            deadline = None if bound is None else time.monotonic() + bound
            reply = None
            process.send(("load", target, options, level, native))
        while True:
            message = reply if reply is not None else _next_reply(process, deadline, cancel)
            reply = None
            kind = message[0]
            if kind == "loaded":
                log.info("%s: loaded in worker process %d%s", target.name, process.pid, note)
                return cls(process, target.name, message[1])
            if kind == "error" and len(message) == 2:      # (a run's error names its run)
                process.send(("exit",))
                _reap(process)
                raise rebuild(message[1], target.name)
            if kind == "died":
                how = exit_text(message[1])
                if process.stopped:
                    raise ServerStopping(f"the server is stopping: {target.name} was loading, and its worker "
                                         "process was stopped")
                log.warning("%s: the worker process %d ended (%s) while loading it", target.name, process.pid, how)
                raise ModelLoadError(
                    f"{target.name} could not be loaded: llama.cpp ended the process loading it ({how}). The file "
                    "passed geniex's checks but the library cannot use it: it is damaged or not supported by this "
                    "llama.cpp build; download or convert it again")
            if kind == "cancelled":
                _leave_orphan(_Orphan(process, target, options, deadline))
                log.info("%s: the request was cancelled while the model loaded; the load goes on, for the next "
                         "request of this model", target.name)
                raise LoadCancelled(f"{target.name}: the request was cancelled while the model loaded (the client "
                                    "went away or the server is stopping)")
            if kind == "overdue":
                log.warning("%s: the load did not end within %.0f s; stopping worker process %d",
                            target.name, bound, process.pid)
                process.kill()
                _await_death(process)
                raise LoadTimeout(
                    f"{target.name}: the model did not load within {bound:.0f} s (geniex serve --load-timeout; by "
                    f"default {LOAD_MIN:.0f} s plus {1e9 / LOAD_RATE:.0f} s per GB of model files): its worker "
                    "process was stopped; the server is up and the next request loads the model again")

    @property
    def alive(self):
        return self.crashed is None and not self.handed_over and self._process.alive()

    def default_timeout(self):
        """Seconds that fit the longest answer this model allows: a full context of
        one-row decodes, :data:`TIMEOUT_FACTOR` times over (drafts that are all
        rejected, a cache that grows slower toward its end), at least :data:`MIN_TIMEOUT`."""
        return max(MIN_TIMEOUT, TIMEOUT_FACTOR * (self.nctx or 0) * self.row_seconds)

    def run(self, task, cancel=None, timeout=None):
        """Run ``task`` in the worker: its events, as :func:`geniex.engine.tasks.run`
        yields them. ``cancel()`` turning true ends the answer at its next step;
        ``timeout`` (seconds from now) ends it as a timeout (see the worker's run), and a
        worker that does not end it within :data:`GRACE` more is killed. Several runs
        may be in flight at once (a model loaded with slots answers them together)."""
        with self._lock:
            self._runs += 1
            run_id = self._runs
            self._active.add(run_id)
        replies = self._process.register(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        ended = False
        try:
            if not self._process.send(("run", run_id, task, timeout)):
                ended = True
                raise self._died(self._wait_death(replies), task)
            cancelled = False
            produced = False
            while True:
                if not cancelled and cancel is not None and cancel():
                    self._process.send(("cancel", run_id))
                    cancelled = True
                try:
                    message = replies.get(timeout=POLL)
                except queue.Empty:
                    if deadline is not None and time.monotonic() > deadline + GRACE:
                        ended = True
                        self._kill_overdue(task, timeout, produced)
                    continue
                kind = message[0]
                if kind == "died":
                    ended = True
                    raise self._died(message[1], task)
                if kind == "event":
                    produced = True
                    yield message[2]
                elif kind == "end":
                    ended = True
                    return
                elif kind == "error":
                    ended = True
                    raise rebuild(message[2], self.name)
        finally:
            if not ended:
                # Left early (the client went away, an error in the route): stop the
                # answer now, so its slot is free for the next request.
                self._process.send(("cancel", run_id))
                self._finish(run_id, replies)
            self._process.unregister(run_id)
            with self._lock:
                self._active.discard(run_id)

    def _finish(self, run_id, replies):
        """Read a cancelled run's messages up to its end."""
        deadline = time.monotonic() + GRACE
        while True:
            try:
                message = replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                log.warning("%s: the worker did not end a cancelled answer within %.0f s; stopping it",
                            self.name, GRACE)
                self._process.kill()
                self.crashed = "killed: a cancelled answer did not end"
                return
            if message[0] == "died":
                self.crashed = exit_text(message[1])
                return
            if message[0] in ("end", "error"):
                return
            if message[0] == "event" and getattr(message[2], "stats", None) is not None and message[2].stats.stop_reason:
                # The cancelled answer's profile: how far it got before its client left.
                stats = message[2].stats
                log.info("%s: %s (stop: %s; the answer was left by its client)", self.name, profile.line(stats),
                         stats.stop_reason)

    def status(self, wait=2.0):
        """The worker's report of its slots, prompt cache and decodes (None if it does
        not answer within ``wait`` seconds: it is loading or gone)."""
        with self._lock:
            self._runs += 1
            key = ("status", self._runs)
        replies = self._process.register(key)
        try:
            if not self._process.send(("status", key[1])):
                return None
            try:
                message = replies.get(timeout=wait)
            except queue.Empty:
                return None
            return message[2] if message[0] == "status" else None
        finally:
            self._process.unregister(key)

    def _kill_overdue(self, task, timeout, produced):
        log.warning("%s: the answer ran %.0f s past its %.0f s timeout; stopping worker process %d",
                    self.name, GRACE, timeout, self._process.pid)
        self._process.kill()
        _await_death(self._process)
        self.crashed = "killed after its timeout"
        raise RequestTimeout(f"{self.name}: the request did not end within its time limit of {timeout:.0f} s "
                             f"(geniex serve --request-timeout); {'its answer was cut' if produced else 'nothing was produced'}"
                             " and the model's worker was restarted")

    @staticmethod
    def _wait_death(replies):
        while True:
            message = replies.get()
            if message[0] == "died":
                return message[1]

    def _died(self, returncode, task):
        how = exit_text(returncode)
        self.crashed = how
        if self._process.stopped:
            return ServerStopping(f"the server is stopping: the answer did not end in time, and {self.name}'s "
                                  "worker process was stopped")
        log.error("%s: the worker process %d ended (%s) while answering a %s; the next request starts a new one",
                  self.name, self._process.pid, how, type(task).__name__)
        return ModelCrashed(f"{self.name} crashed while answering: llama.cpp ended its worker process ({how}). "
                            "The server is up and the next request loads the model again; if this repeats for "
                            "the same request, the model file or this request triggers a library bug",
                            model=self.name)

    def _hand_over(self):
        """This session's worker process for the next load, or None after ending it
        (a worker that crashed, was killed, or is still in an answer is not reused)."""
        process = self._process
        if self.alive and not self._active and not process.stopped:
            self.handed_over = True         # this session answers no more; close() leaves the process be
            return process
        self.close()
        return None

    def close(self):
        """Free the model and end the worker (killed if it does not end in time)."""
        if self.handed_over:
            return
        process = self._process
        if process.alive():
            with self._lock:
                active = list(self._active)
            for run_id in active:
                process.send(("cancel", run_id))
            process.send(("exit",))
        _reap(process)


def load_bound(target, options):
    """Seconds a load of ``target`` with ``options`` may take by default:
    :data:`LOAD_MIN`, plus the bytes of every file it reads (the model's files, its
    projector, the draft model) at :data:`LOAD_RATE`."""
    paths = {Path(f) for f in (getattr(target, "files", None) or [target.path])}
    spec = getattr(options, "spec", None)
    for extra in (getattr(target, "mmproj", None), getattr(spec, "draft_path", None)):
        if extra:
            paths.add(Path(extra))
    size = 0
    for path in paths:
        try:
            size += path.stat().st_size if path.is_file() else 0
        except OSError:
            pass
    return LOAD_MIN + size / LOAD_RATE


def _next_reply(process, deadline, cancel):
    """The worker's next reply to a load; ``("overdue",)`` once ``deadline`` has passed,
    ``("cancelled",)`` once ``cancel()`` is true (each checked every :data:`POLL`)."""
    while True:
        try:
            return process.replies.get(timeout=POLL)
        except queue.Empty:
            pass
        if deadline is not None and time.monotonic() > deadline:
            return ("overdue",)
        if cancel is not None and cancel():
            return ("cancelled",)


def _await_death(process, seconds=DEATH_WAIT):
    """Wait (a while) for a killed worker's end to be read: a worker blocked in a read
    the kernel does not interrupt (a hung network mount) dies only once the read
    returns, and nobody waits for it beyond ``seconds`` (it stays among the workers
    :func:`kill_all` kills)."""
    until = time.monotonic() + seconds
    while True:
        try:
            message = process.replies.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            log.warning("worker process %d did not end within %.0f s of being killed; leaving it", process.pid,
                        seconds)
            return None
        if message[0] == "died":
            return message[1]


# -- a load left by its cancelled request -----------------------------------------------------
_orphan = None              # at most one: any other load ends it
_orphan_lock = threading.Lock()


class _Orphan:
    """A load whose request was cancelled while it ran, kept for the next request of the
    same model. A thread of its own reads the load's reply and enforces its deadline
    until a load picks it up (:meth:`WorkerSession.open`) or ends it; a load nobody
    picks up within :data:`ORPHAN_KEEP` seconds of its end is ended."""

    def __init__(self, process, target, options, deadline):
        self.process = process
        self.name = target.name
        self.key = (str(target.path), options)
        self.deadline = deadline
        self.reply = None           # the load's reply, once read
        self.taken = False          # picked up or discarded: the thread stops reading
        self._thread = threading.Thread(target=self._watch, name=f"geniex-load-{process.pid}", daemon=True)

    def loads(self, target, options):
        return self.key == (str(target.path), options)

    def _watch(self):
        ended = None
        while not self.taken:
            if self.reply is None:
                message = _next_reply(self.process, self.deadline, lambda: self.taken)
                if message[0] in ("loaded", "died") or (message[0] == "error" and len(message) == 2):
                    self.reply, ended = message, time.monotonic()
                elif message[0] == "overdue":
                    self._drop(f"its load did not end in time (worker process {self.process.pid} killed)", kill=True)
                    return
            else:
                time.sleep(POLL)
                if self.reply[0] != "loaded" or time.monotonic() - ended > ORPHAN_KEEP:
                    self._drop("no request picked up its load", kill=False)
                    return

    def _drop(self, why, kill):
        global _orphan
        with _orphan_lock:
            if self.taken:
                return
            self.taken = True
            if _orphan is self:
                _orphan = None
        log.info("%s: dropping the load left by a cancelled request: %s", self.name, why)
        self._end(kill)

    def discard(self, why):
        """End it (taken by :func:`_take_orphan` first)."""
        log.info("%s: ending the load left by a cancelled request: %s", self.name, why)
        self._thread.join()
        self._end(kill=True)

    def take(self):
        """Stop the thread: the caller reads the process's replies from now on
        (:attr:`reply` first, if the thread read it)."""
        self._thread.join()

    def _end(self, kill):
        kind = self.reply[0] if self.reply is not None else None
        if kind == "died":
            return
        if kind is None or kill:
            self.process.kill()
            _await_death(self.process)
        else:                       # loaded, or refused the model: a live worker, told to exit
            self.process.send(("exit",))
            _reap(self.process)


def _leave_orphan(orphan):
    global _orphan
    with _orphan_lock:
        previous, _orphan = _orphan, orphan
        if previous is not None:
            previous.taken = True
    if previous is not None:
        previous.discard("another load was left")
    orphan._thread.start()


def _take_orphan():
    """The load left by a cancelled request, if any, its thread stopped."""
    global _orphan
    with _orphan_lock:
        orphan, _orphan = _orphan, None
        if orphan is None or orphan.taken:
            return None
        orphan.taken = True
    orphan.take()
    return orphan


def _reap(process):
    try:
        process.proc.wait(CLOSE_WAIT)
    except subprocess.TimeoutExpired:
        log.warning("worker process %d did not end within %.0f s; killing it", process.pid, CLOSE_WAIT)
        process.kill()
        process.proc.wait()


def kill_all(stopping=False):
    """Kill every worker still running: the server process is about to exit, or
    (``stopping``) an answer did not end in time after a stop signal."""
    with _live_lock:
        workers = list(_live)
    for process in workers:
        process.stopped = process.stopped or stopping
        process.kill()


def _emit(message):
    """Log a record the worker forwarded, through the server's own handlers (its
    ``--log`` level, a test's capture), as if the server had logged it."""
    _, level, name, text = message
    logger = logging.getLogger(name)
    if logger.isEnabledFor(level):
        logger.log(level, "%s", text)
