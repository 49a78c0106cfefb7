"""Real servers on a free loopback port for the server and ``run`` tests:
:class:`AppServer` serves ``create_app()`` in a thread of the test process (most
tests: validation, guards, shapes, answers), :class:`Server` runs ``geniex serve`` in
a subprocess where the process matters (signals, the CLI, disconnects). ``--host
127.0.0.1:0`` lets the OS pick the port; the server prints the address it got on its
first line."""
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import requests
from referencing import Registry, Resource

from geniex.server.validation import schemas

ROOT = Path(__file__).resolve().parents[2]
DEMO = "demo/SmolLM2-135M-Instruct:Q4_1"


def seed_calibration(data_dir):
    """Start a server's data dir with the suite's calibration cache (the default data
    dir's ``calibration.json``, see ``shared_fixtures.calibration_cache``) when it has
    none, so a speculative load reads the demo model's curves instead of measuring them
    again; a dir that already has a cache, or a run that has measured none yet, is left
    as it is (the load then calibrates, as on a user's first run)."""
    suite = os.environ.get("GENIEX_DATADIR")
    if not suite:
        return
    source, target = Path(suite) / "calibration.json", Path(data_dir) / "calibration.json"
    if source.is_file() and not source.is_symlink() and Path(data_dir).is_dir() \
            and not os.path.lexists(target) and Path(data_dir).resolve() != Path(suite).resolve():
        shutil.copyfile(source, target)


def calibrate_as(cache, copy, original):
    """Give the model file ``copy`` what ``original`` has in the calibration cache
    ``cache`` (a data dir's ``calibration.json``; nothing happens where it has none of it):
    its verify cost curves and the prompt reader's verdict. For a copy of the demo model
    with metadata spliced in (tests/support/gguf_edit.py: tool templates, pooling and FIM
    tokens): it holds the original's tensors, so a batch costs on it what it costs on the
    original, and its cells convert as the original's do. A load with slots measures the
    curve of a file it does not find (for predictions, even when nothing drafts: 213 rows,
    2.5 s of a 3.2 s load on one CPU), and a load over 512 tokens checks the reader, where
    the suite does both once per run (shared_fixtures.calibration_cache); the curve only
    prices drafts, the tokens are the same whatever it says."""
    from geniex.speculative.policy import CalibrationCache, model_key
    try:
        data = json.loads(Path(cache).read_text())
    except (OSError, ValueError):
        return
    old, new, kept = model_key(original), model_key(copy), CalibrationCache(Path(cache))
    for key, value in data.items():
        if not isinstance(value, dict) or value.get("stalled"):
            continue
        if key.startswith(old) and "costs" in value:
            kept.put(new + key[len(old):], ({int(r): float(c) for r, c in value["costs"].items()},
                                            float(value["one_row"])))
        elif key.startswith("reader|" + old):
            kept.put_record("reader|" + new + key[len("reader|" + old):], value)


# Seconds before a test gives up on an answer: a guard against a hang, not a speed bound.
# An answer that loads a model and decodes 80 tokens took over 120 s at a load average of
# 13 on the 2-core machine (the suite shares it with other runs).
ANSWER_TIMEOUT = 300


class Http:
    """HTTP helpers over ``self.url`` (both kinds of server below)."""

    def get(self, path, **kw):
        return requests.get(self.url + path, timeout=60, **kw)

    def post(self, path, body, **kw):
        return requests.post(self.url + path, json=body, timeout=ANSWER_TIMEOUT, **kw)

    def chat(self, body, **kw):
        return self.post("/v1/chat/completions", body, **kw)

    def health(self):
        return self.get("/health").json()

    def stream(self, path, body, **kw):
        """POST with ``stream: true``; returns the decoded events (``[DONE]`` seen)."""
        with requests.post(self.url + path, json={**body, "stream": True}, stream=True, timeout=ANSWER_TIMEOUT,
                           **kw) as r:
            assert r.status_code == 200, r.text
            assert r.headers["Content-Type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines(decode_unicode=True) if line]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        return [json.loads(line[5:]) for line in lines if line.startswith("data:") and "[DONE]" not in line]


class AppServer(Http):
    """The app of ``create_app(config)`` served by waitress in a thread of this process
    on a free loopback port: real HTTP and the real engine, without a process start.
    ``fields`` are ServerConfig fields (``AppServer(data_dir, nctx=1024)`` sets the
    default context through ``defaults``, ``parallel=1`` the slots)."""

    def __init__(self, data_dir, store=None, nctx=None, parallel=None, **fields):
        from geniex.server.placement import Defaults
        from geniex.server.app import ServerConfig, create_app
        from geniex.server.serving import addresses_of, make_server
        seed_calibration(data_dir)
        config = ServerConfig(data_dir=data_dir, bind_host="127.0.0.1", **fields)
        if nctx is not None or parallel is not None:
            config.defaults = dataclasses.replace(config.defaults, **{k: v for k, v in (("nctx", nctx), ("parallel", parallel))
                                                                    if v is not None})
        self._log = _LogLines()
        self.app = create_app(config, store)
        self.cache = self.app.extensions["geniex.answerer"].cache
        self.server = make_server(self.app, "127.0.0.1", 0, config)
        self.url = addresses_of(self.server)[0]
        self.host = self.url.split("://", 1)[1]
        self._thread = threading.Thread(target=self.server.run, name="test-server", daemon=True)
        self._thread.start()

    def close(self):
        """Stop answering, close every connection (the loop ends with an empty map),
        join the worker threads and free the model."""
        from geniex.server.serving import close_all
        self.cache.stop()
        close_all(self.server)
        self._thread.join(30)
        self.cache.close()
        self._log.close()

    @property
    def stderr(self):
        """The server's log at INFO, as ``geniex --log info serve`` would print it (the
        whole process's ``geniex`` log while this server runs)."""
        return self._log.text()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _LogLines(logging.Handler):
    """Collects the ``geniex`` logger tree's INFO records while installed (llama.cpp's
    own chatter only from WARNING on, as ``geniex`` prints it unless asked)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self._lines = []
        self._logger = logging.getLogger("geniex")
        self._native = logging.getLogger("geniex.llama.cpp")
        self._levels = self._logger.level, self._native.level
        self._logger.addHandler(self)
        self._logger.setLevel(min(self._levels[0] or logging.INFO, logging.INFO))
        self._native.setLevel(max(self._levels[1], logging.WARNING))

    def emit(self, record):
        self._lines.append(self.format(record) + "\n")

    def text(self):
        return "".join(self._lines)

    def close(self):
        self._logger.removeHandler(self)
        self._logger.setLevel(self._levels[0])
        self._native.setLevel(self._levels[1])
        super().close()


class Server(Http):
    """``python -m geniex serve`` with its own data dir; use as a context manager."""

    def __init__(self, data_dir, *args, env=None, timeout=30):
        seed_calibration(data_dir)
        full_env = dict(os.environ)
        full_env.update({"GENIEX_DATADIR": str(data_dir), "PYTHONUNBUFFERED": "1"})
        full_env.pop("GENIEX_LOG", None)
        full_env.pop("GENIEX_HOST", None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "geniex", "--log", "info", "serve", "--host", "127.0.0.1:0", *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=ROOT)
        self._stderr = []
        threading.Thread(target=self._drain, daemon=True).start()
        self.first_line = line = self._first_line(timeout)
        match = re.search(r"https?://[\d.]+:\d+", line)
        if not match:
            self.stop()
            raise RuntimeError(f"the server did not start: {line!r}\n{self.stderr}")
        self.url = match.group(0)
        self.host = self.url.split("://", 1)[1]
        self.returncode = None

    def _first_line(self, timeout):
        box = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return box[0] if box else ""

    def _drain(self):
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self):
        return "".join(self._stderr)

    # -- stopping ----------------------------------------------------------------------
    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Signal the server and wait for it; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        return self.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def ok(r):
    """The JSON of a 200 answer (the test fails with the body otherwise)."""
    assert r.status_code == 200, r.text
    return r.json()


def chat_body(content="Say hello.", model=DEMO, max_tokens=8, **extra):
    return {"model": model, "messages": [{"role": "user", "content": content}],
            "max_completion_tokens": max_tokens, **extra}


def check_shape(obj, name):
    """Validate a response object against ``schemas/responses.json#/$defs/<name>``."""
    registry = Registry().with_resources((f, Resource.from_contents(s)) for f, s in schemas().items())
    jsonschema.Draft202012Validator({"$ref": f"responses.json#/$defs/{name}"}, registry=registry).validate(obj)
