"""The server's models run in a worker process it supervises, as Ollama runs llama.cpp
in a runner subprocess (docs/isolation.md).

llama.cpp ends the process on some inputs it does not check (``GGML_ASSERT`` aborts,
out-of-range reads on a malformed file); geniex validates what it can first
(:mod:`geniex.llama.gguf_file`), and what it cannot is contained here: a model is
loaded and answers in its own process, so an abort ends that process (the request it
was answering gets a clear error naming the model) and the server, its other clients
and the next request carry on: the next request starts a new worker.

The parent side is :class:`WorkerSession`, which the server's
:class:`~geniex.server.cache.ModelCache` holds as it would hold a
:class:`~geniex.engine.session.Session`: ``name``, ``speculative``, ``run(task,
cancel)`` yielding the task's events (:mod:`geniex.engine.tasks`, plain picklable
dataclasses), and ``close()``. ``geniex infer`` and the Python API keep the model in
their own process (a crash there is the user's own command).

The wire: length-prefixed pickled frames over the worker's stdin (commands) and a
duplicate of its stdout (replies; its own stdout then goes to stderr, so a stray print
from the library cannot corrupt a frame). Each reply frame is a *list* of messages: a
sender thread in the worker writes whatever the answer produced since its last write
in one frame, so a fast answer goes over in batches and a slow one piece by piece,
without waiting on a timer. A cancel (client gone, server stopping) goes to a reader
thread of the worker at once and ends the answer at its next step, as in one process.

The worker is not a sandbox: it runs as the same user with the same files. It keeps a
library abort from becoming a remote kill switch for the server, nothing more.
"""
import importlib
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from geniex import profile
from geniex.errors import (GenieXError, LoadCancelled, LoadTimeout, ModelCrashed, ModelLoadError,
                           RequestTimeout, ServerStopping)

log = logging.getLogger("geniex.server")

_HEADER = struct.Struct("<I")
MAX_FRAME = 1 << 30         # a frame larger than this is a broken worker, not an answer
POLL = 0.1                  # seconds between checks of a request's cancel() while it waits for the worker
GRACE = 15.0                # seconds past a request's deadline before its worker is killed
CLOSE_WAIT = 10.0           # seconds a closing worker may take to free its model before it is killed
MIN_TIMEOUT = 60.0          # the default request timeout is never shorter (docs/isolation.md)
TIMEOUT_FACTOR = 4          # ... and covers this many times a full context of one-row decodes
# A load must end within LOAD_MIN seconds plus one per LOAD_RATE bytes of the files it
# reads (the model, its draft model, its projector): a slow disk's pace, so that only a
# load that hangs runs out (geniex serve --load-timeout sets another bound).
LOAD_MIN = 60.0
LOAD_RATE = 25e6
ORPHAN_KEEP = 30.0          # seconds a load left by its cancelled request is kept for the next one
DEATH_WAIT = 5.0            # seconds a killed worker is waited for (a hung read may keep it alive)

PROBE = "Hello, world!\n\t0123456789 {}[]<>\"'\\ été 中文 😀"   # tokenized once at load

_live = set()               # every running worker, killed if the server process exits first
_live_lock = threading.Lock()


# -- framing -----------------------------------------------------------------------------
def _write(stream, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream):
    """One frame, or None at the end of the stream (the other side is gone)."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME:
        raise EOFError(f"a frame of {size} bytes")
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def _error_payload(exc):
    """An exception as data: a GenieXError keeps its class and fields (the server maps it
    to its status); anything else is a bug, kept as its text."""
    if isinstance(exc, GenieXError):
        kind = type(exc)
        return ("known", kind.__module__, kind.__qualname__, exc.args, dict(vars(exc)))
    return ("bug", f"{type(exc).__name__}: {exc}")


def _rebuild(payload, model):
    if payload[0] == "known":
        _, module, qualname, args, fields = payload
        try:
            kind = getattr(importlib.import_module(module), qualname)
        except (ImportError, AttributeError):
            kind = None
        if isinstance(kind, type) and issubclass(kind, GenieXError):
            exc = kind.__new__(kind)
            exc.args = tuple(args)
            vars(exc).update(fields)
            return exc
        return GenieXError(*args)
    return RuntimeError(f"{model}: the worker failed: {payload[1]}")


def exit_text(returncode):
    """How a worker ended, in words: ``SIGABRT``, ``exit status 3``, ``0xC0000409``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    if returncode > 0xFFFF:                     # a Windows exception code
        return f"0x{returncode:08X}"
    return f"exit status {returncode}"


# -- the parent side -----------------------------------------------------------------------
# The worker's first lines: import the ``geniex`` package from the folder given as the
# argument, and only that package, then run the worker. Its sys.path stays the
# interpreter's own (the standard library first), as the server's is.
_LAUNCH = """\
import importlib.machinery, importlib.util, sys
spec = importlib.machinery.PathFinder.find_spec("geniex", [sys.argv[1]])
module = sys.modules["geniex"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from geniex.server.worker import main
main()
"""


def worker_command():
    """The command that starts a worker: the server's interpreter, importing the same
    geniex as the server (a source checkout included), from the folder the server found
    it in. That folder is not put on the worker's PYTHONPATH: installed, it is
    site-packages, and PYTHONPATH goes ahead of the standard library, so a module there
    named like a standard one (an old backport: ``enum``, ``typing``) replaced it."""
    return [sys.executable, "-c", _LAUNCH, str(Path(__file__).resolve().parents[2])]


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
        self.replies = queue.Queue()
        self._send_lock = threading.Lock()
        with _live_lock:
            _live.add(self)
        threading.Thread(target=self._read_replies, name=f"geniex-worker-{self.pid}", daemon=True).start()

    def _read_replies(self):
        try:
            while True:
                frame = _read(self.proc.stdout)
                if frame is None:
                    break
                for message in frame:
                    if message[0] == "log":
                        _emit(message)
                    else:
                        self.replies.put(message)
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
        self.replies.put(("died", returncode))
        with _live_lock:
            _live.discard(self)

    def send(self, message):
        """False when the worker is gone (its stdin is closed)."""
        try:
            with self._send_lock:
                _write(self.proc.stdin, message)
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
        self.crashed = None             # how the worker ended, once it died under a request
        self.handed_over = False        # its process went on to load the next model
        self._runs = 0
        self._active = None             # the run id whose end has not been read yet

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
                raise _rebuild(message[1], target.name)
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
        ``timeout`` (seconds from now) ends it as a timeout (see :func:`_serve_run`),
        and a worker that does not end it within :data:`GRACE` more is killed."""
        self._finish_previous()
        self._runs += 1
        run_id = self._active = self._runs
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._process.send(("run", run_id, task, timeout)):
            self._active = None
            raise self._died(self._wait_death(), task)
        cancelled = False
        produced = False
        try:
            while True:
                if not cancelled and cancel is not None and cancel():
                    self._process.send(("cancel", run_id))
                    cancelled = True
                try:
                    message = self._process.replies.get(timeout=POLL)
                except queue.Empty:
                    if deadline is not None and time.monotonic() > deadline + GRACE:
                        self._kill_overdue(task, timeout, produced)
                    continue
                kind = message[0]
                if kind == "died":
                    self._active = None
                    raise self._died(message[1], task)
                if message[1] != run_id:
                    continue                    # the tail of an earlier run
                if kind == "event":
                    produced = True
                    yield message[2]
                elif kind == "end":
                    self._active = None
                    return
                elif kind == "error":
                    self._active = None
                    raise _rebuild(message[2], self.name)
        finally:
            if self._active == run_id:
                # Left early (the client went away, an error in the route): stop the
                # answer now, so the next request starts on a quiet worker.
                self._process.send(("cancel", run_id))
                self._finish_previous()

    def _finish_previous(self):
        """Read an earlier run's messages up to its end (after a cancel)."""
        run_id = self._active
        if run_id is None:
            return
        deadline = time.monotonic() + GRACE
        while self._active == run_id:
            try:
                message = self._process.replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                log.warning("%s: the worker did not end a cancelled answer within %.0f s; stopping it",
                            self.name, GRACE)
                self._process.kill()
                self._active = None
                self.crashed = "killed: a cancelled answer did not end"
                return
            if message[0] == "died":
                self._active = None
                self.crashed = exit_text(message[1])
            elif message[1] != run_id:
                continue
            elif message[0] in ("end", "error"):
                self._active = None
            elif message[0] == "event" and getattr(message[2], "stats", None) is not None and message[2].stats.stop_reason:
                # The cancelled answer's profile: how far it got before its client left.
                stats = message[2].stats
                log.info("%s: %s (stop: %s; the answer was left by its client)", self.name, profile.line(stats),
                         stats.stop_reason)

    def _kill_overdue(self, task, timeout, produced):
        log.warning("%s: the answer ran %.0f s past its %.0f s timeout; stopping worker process %d",
                    self.name, GRACE, timeout, self._process.pid)
        self._process.kill()
        _await_death(self._process)
        self._active = None
        self.crashed = "killed after its timeout"
        raise RequestTimeout(f"{self.name}: the request did not end within its time limit of {timeout:.0f} s "
                             f"(geniex serve --request-timeout); {'its answer was cut' if produced else 'nothing was produced'}"
                             " and the model's worker was restarted")

    def _wait_death(self):
        while True:
            message = self._process.replies.get()
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
        if self.alive and self._active is None and not process.stopped:
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
            if self._active is not None:
                process.send(("cancel", self._active))
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


# -- the worker side ---------------------------------------------------------------------
class _Forward(logging.Handler):
    """The worker's log goes to the server as ``("log", level, logger, text)`` messages,
    so it reaches the server's handlers (not only the worker's inherited stderr)."""

    def __init__(self, sender):
        super().__init__()
        self._sender = sender
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record):
        try:
            self._sender.put(("log", record.levelno, record.name, self.format(record)))
        except Exception:       # noqa: BLE001 - logging never breaks an answer
            self.handleError(record)


class _Sender:
    """Writes queued messages to the parent from its own thread: whatever accumulated
    since the last write goes as one frame (batches when the answer is fast)."""

    def __init__(self, stream):
        self._stream = stream
        self._cond = threading.Condition()
        self._pending = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="geniex-worker-sender", daemon=True)
        self._thread.start()

    def put(self, message):
        with self._cond:
            self._pending.append(message)
            self._cond.notify()

    def _loop(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                batch, self._pending = self._pending, []
                closed = self._closed
            if batch:
                try:
                    _write(self._stream, batch)
                except (OSError, ValueError):
                    os._exit(0)             # the server is gone
            if closed:
                return

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()


class _Worker:
    def __init__(self, commands, sender):
        self.commands = commands
        self.sender = sender
        self.session = None
        self.current = None             # the run id being answered
        self.cancel = threading.Event()
        # A cancel can be read before the main thread starts its run (the server sends
        # both back to back): kept here until that run starts, under the lock.
        self.early = None
        self._lock = threading.Lock()

    def read(self, stdin):
        """The reader thread: a cancel acts at once, other commands queue for the main
        thread; the end of stdin (the server went away) cancels and exits."""
        while True:
            try:
                message = _read(stdin)
            except Exception:           # noqa: BLE001 - a broken pipe is a gone server
                message = None
            if message is None:
                self.cancel.set()
                self.commands.put(("exit",))
                # Leave even if an answer does not reach its next step soon.
                threading.Timer(CLOSE_WAIT, os._exit, (0,)).start()
                return
            if message[0] == "cancel":
                with self._lock:
                    if message[1] == self.current:
                        self.cancel.set()
                    else:
                        self.early = message[1]     # its run is queued, not started yet
                continue
            self.commands.put(message)

    def serve(self):
        while True:
            message = self.commands.get()
            kind = message[0]
            if kind == "exit":
                if self.session is not None:
                    self.session.close()
                    self.session = None
                return
            if kind == "load":
                self.load(*message[1:])
            elif kind == "run":
                self.run(*message[1:])

    def load(self, target, options, level, native):
        from geniex.engine.session import open_session
        root = logging.getLogger("geniex")
        if not any(isinstance(h, _Forward) for h in root.handlers):
            root.addHandler(_Forward(self.sender))
        root.propagate = False
        root.setLevel(level)
        logging.getLogger("geniex.llama.cpp").setLevel(native)
        if self.session is not None:
            # Reloaded in place: the model it replaces is freed first, as a new process would.
            session, self.session = self.session, None
            session.close()
        try:
            self.session = open_session(target, options)
            # A vocabulary llama.cpp cannot tokenize ordinary text with (an SPM vocabulary
            # without byte tokens aborts on the first newline) fails here, at load, where
            # it is a load error, rather than in every request.
            self.session.vocab.tokenize(PROBE, add_special=True, parse_special=False)
            info = {"speculative": self.session.speculative, "spec_notes": self.session.spec_notes,
                    "device_note": self.session.device_note, "nctx": self.session.n_ctx,
                    "row_seconds": _row_seconds(self.session)}
        except Exception as e:          # noqa: BLE001 - every failure goes back to the server
            if not isinstance(e, GenieXError):
                log.exception("loading %s failed", target.name)
            self.sender.put(("error", _error_payload(e)))
            return
        self.sender.put(("loaded", info))

    def run(self, run_id, task, timeout):
        from geniex.engine import tasks
        with self._lock:
            self.cancel.clear()
            self.current = run_id
            if self.early == run_id:
                self.cancel.set()
            self.early = None
        deadline = None if timeout is None else time.monotonic() + timeout
        over = []

        def cancel():
            if self.cancel.is_set():
                return True
            if deadline is not None and time.monotonic() > deadline:
                over.append(True)
                return True
            return False

        try:
            for event in tasks.run(self.session, task, cancel):
                if over and isinstance(event, tasks.Done) and event.stats.stop_reason == "user":
                    if not event.stats.decode_tokens:
                        raise RequestTimeout(f"the request did not end within its time limit of {timeout:g} s "
                                             "(geniex serve --request-timeout): nothing was produced")
                    event.stats.stop_reason = "time_limit"     # finish_reason "length"
                self.sender.put(("event", run_id, event))
        except Exception as e:          # noqa: BLE001 - every failure goes back to the server
            from geniex.errors import Cancelled
            if over and isinstance(e, Cancelled):
                e = RequestTimeout(f"the request did not end within its time limit of {timeout:g} s "
                                   f"(geniex serve --request-timeout): nothing was produced; its prompt was "
                                   f"processed up to {e.done} of {e.total} tokens")
            elif not isinstance(e, GenieXError):
                log.exception("a %s failed", type(task).__name__)
            self.sender.put(("error", run_id, _error_payload(e)))
        else:
            self.sender.put(("end", run_id))
        finally:
            self.current = None


def _row_seconds(session):
    """Seconds of one one-row decode on this model (after the load's warm-up), for the
    default request timeout; the context is left empty, as the load leaves it."""
    tok = session.vocab.bos if session.vocab.bos >= 0 else 0
    t0 = time.perf_counter()
    for pos in range(2):
        session.ctx.decode(session.batch.fill([tok], pos))
    seconds = (time.perf_counter() - t0) / 2
    session.ctx.clear()
    return seconds


def main():
    """The worker process: commands on stdin, replies on (a duplicate of) stdout."""
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # the server decides when we stop
    stdin = sys.stdin.buffer
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray output goes to stderr, not into frames
    worker = _Worker(queue.Queue(), _Sender(replies))
    threading.Thread(target=worker.read, args=(stdin,), name="geniex-worker-reader", daemon=True).start()
    worker.serve()
    worker.sender.close()
    # Leave without the interpreter's teardown: the model is freed, and nothing else
    # needs finalizing (daemon threads may still sit in a read).
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
