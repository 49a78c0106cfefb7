"""The worker process: loads a model and runs the server's tasks on it.

Its main thread loads the model and does every decode: a model loaded with one slot
answers one run at a time on it; with slots (``geniex serve --parallel``) each run gets
a thread of its own, the answers' rows meet in one decode (geniex.engine.batcher), and
the main thread runs those decodes as they are handed to it. A reader thread takes the
commands: a cancel acts at once, a status request is answered at once (from whatever
thread is free), the rest go to the main thread in order.
"""
import logging
import os
import queue
import signal
import sys
import threading
import time

from geniex.errors import Cancelled, GenieXError, RequestTimeout
from geniex.server.worker.wire import CLOSE_WAIT, error_payload, read, write

log = logging.getLogger("geniex.server")

PROBE = "Hello, world!\n\t0123456789 {}[]<>\"'\\ été 中文 😀"   # tokenized once at load


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
                    write(self._stream, batch)
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
        self.commands = commands            # the main thread's queue: commands and decode jobs
        self.sender = sender
        self.session = None
        self._cancels = {}                  # run id -> its cancel Event, while it runs
        self._early = set()                 # run ids cancelled before they started
        self._lock = threading.Lock()
        self._threads = set()

    def read(self, stdin):
        """The reader thread: a cancel or a status request acts at once, other commands
        queue for the main thread; the end of stdin (the server went away) cancels every
        run and exits."""
        while True:
            try:
                message = read(stdin)
            except Exception:           # noqa: BLE001 - a broken pipe is a gone server
                message = None
            if message is None:
                with self._lock:
                    for event in self._cancels.values():
                        event.set()
                self.commands.put(("exit",))
                # Leave even if an answer does not reach its next step soon.
                threading.Timer(CLOSE_WAIT, os._exit, (0,)).start()
                return
            if message[0] == "cancel":
                with self._lock:
                    event = self._cancels.get(message[1])
                    if event is not None:
                        event.set()
                    else:
                        self._early.add(message[1])     # its run is queued, not started yet
                continue
            if message[0] == "status":
                self.sender.put(("status", message[1], self.status()))
                continue
            self.commands.put(message)

    def status(self):
        """What the server's /slots, /health and /metrics show of the model's slots."""
        session = self.session
        if session is None:
            return None
        slots = session.slots
        batcher = session.batcher
        return {"slots": slots.status() if slots is not None else None,
                "prompt_cache": session.prompt_cache.status(),
                "decodes": batcher.decodes if batcher is not None else None,
                "rows": batcher.rows if batcher is not None else None,
                "seats": batcher.seats if batcher is not None else None}

    def serve(self):
        """The main thread: loads, one-slot runs, and the slots' decodes."""
        while True:
            message = self.commands.get()
            if callable(message):
                message()               # a decode or a drafter's work (geniex.engine.batcher)
                continue
            kind = message[0]
            if kind == "exit":
                self._close()
                return
            if kind == "load":
                self.load(*message[1:])
            elif kind == "run":
                if self.session is not None and self.session.slots is not None:
                    thread = threading.Thread(target=self.run, args=message[1:], daemon=True,
                                              name=f"geniex-run-{message[1]}")
                    with self._lock:
                        self._threads.add(thread)
                    thread.start()
                else:
                    self.run(*message[1:])

    def _close(self):
        if self.session is None:
            return
        with self._lock:
            for event in self._cancels.values():
                event.set()
            threads = list(self._threads)
        # Runs on slots end at their next step; their decodes need this thread meanwhile.
        until = time.monotonic() + CLOSE_WAIT
        while any(t.is_alive() for t in threads) and time.monotonic() < until:
            try:
                job = self.commands.get(timeout=0.05)
            except queue.Empty:
                continue
            if callable(job):
                job()
        session, self.session = self.session, None
        session.close()

    def load(self, target, options, level, native):
        from geniex.engine.session import open_session
        root = logging.getLogger("geniex")
        if not any(isinstance(h, _Forward) for h in root.handlers):
            root.addHandler(_Forward(self.sender))
        root.propagate = False
        root.setLevel(level)
        logging.getLogger("geniex.llama.cpp").setLevel(native)
        self._close()       # reloaded in place: the model it replaces is freed first, as a new process would
        try:
            # The slots' decodes come back to this thread, the one that loads the model.
            self.session = open_session(target, options, submit=self.commands.put)
            # A vocabulary llama.cpp cannot tokenize ordinary text with (an SPM vocabulary
            # without byte tokens aborts on the first newline) fails here, at load, where
            # it is a load error, rather than in every request.
            self.session.vocab.tokenize(PROBE, add_special=True, parse_special=False)
            info = {"speculative": self.session.speculative, "spec_notes": self.session.spec_notes,
                    "device_note": self.session.device_note, "nctx": self.session.n_ctx,
                    "slots": len(self.session.slots) if self.session.slots is not None else 1,
                    "row_seconds": _row_seconds(self.session)}
        except Exception as e:          # noqa: BLE001 - every failure goes back to the server
            if not isinstance(e, GenieXError):
                log.exception("loading %s failed", target.name)
            self.sender.put(("error", error_payload(e)))
            return
        self.sender.put(("loaded", info))

    def run(self, run_id, task, timeout):
        from geniex.engine import tasks
        cancelled = threading.Event()
        with self._lock:
            self._cancels[run_id] = cancelled
            if run_id in self._early:
                self._early.discard(run_id)
                cancelled.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        over = []

        def cancel():
            if cancelled.is_set():
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
            if over and isinstance(e, Cancelled):
                e = RequestTimeout(f"the request did not end within its time limit of {timeout:g} s "
                                   f"(geniex serve --request-timeout): nothing was produced; its prompt was "
                                   f"processed up to {e.done} of {e.total} tokens")
            elif not isinstance(e, GenieXError):
                log.exception("a %s failed", type(task).__name__)
            self.sender.put(("error", run_id, error_payload(e)))
        else:
            self.sender.put(("end", run_id))
        finally:
            with self._lock:
                self._cancels.pop(run_id, None)
                self._threads.discard(threading.current_thread())


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
