"""The server's models run in a worker process it supervises, as Ollama runs llama.cpp
in a runner subprocess (docs/isolation.md).

llama.cpp ends the process on some inputs it does not check (``GGML_ASSERT`` aborts,
out-of-range reads on a malformed file); geniex validates what it can first
(:mod:`geniex.llama.gguf_file`), and what it cannot is contained here: a model is
loaded and answers in its own process, so an abort ends that process (the requests it
was answering get a clear error naming the model) and the server, its other clients
and the next request carry on: the next request starts a new worker.

Three rooms: :mod:`~geniex.server.worker.wire` (the frames and how errors cross),
:mod:`~geniex.server.worker.parent` (the server's side: :class:`WorkerSession`, loads,
runs, a load left by its cancelled request) and :mod:`~geniex.server.worker.child` (the
worker process itself). ``geniex infer`` and the Python API keep the model in their own
process (a crash there is the user's own command).

The worker is not a sandbox: it runs as the same user with the same files. It keeps a
library abort from becoming a remote kill switch for the server, nothing more.
"""
from geniex.server.worker.parent import (LOAD_MIN, LOAD_RATE, WorkerSession, _Process, kill_all, load_bound,
                                         worker_command)
from geniex.server.worker.wire import exit_text

__all__ = ["LOAD_MIN", "LOAD_RATE", "WorkerSession", "_Process", "exit_text", "kill_all", "load_bound",
           "worker_command"]
