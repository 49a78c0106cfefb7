"""A fake Hugging Face Hub on 127.0.0.1, for tests that must never touch the real one.

It serves what ``geniex.store.hub`` uses, shaped like the real Hub:

- ``GET /api/models/{org}/{repo}/tree/{rev}?recursive=true``: a paginated listing
  (``Link: <...>; rel="next"``) with sizes, git ``oid`` and ``lfs.oid`` (sha256);
- ``GET /{org}/{repo}/resolve/{rev}/{path}``: small files directly, LFS files by a 302
  to ``/cdn/{sha256}``, which honours ``Range``;
- errors with ``X-Error-Code`` (RepoNotFound, EntryNotFound, GatedRepo).

Faults to inject: ``cut(repo, path, times)`` closes the connection halfway through a
file, ``wrong_sha(repo, path)`` lists a wrong sha256, ``gate(repo, token)`` answers 401
without that token, ``throttle`` slows the CDN (seconds per 4 kB block). A hostile hub:
``links[repo]`` is a ``Link: rel="next"`` sent with every listing page, ``raw_listing[repo]``
the JSON served as the whole listing, ``bombs[(repo, path)]`` (path None: the listing)
a number of zero bytes served gzip-compressed, ``redirects[(repo, path)]`` a URL the
file's resolve answers 302 with. Every request is appended to ``requests`` as ``(path,
range header or None)`` and to ``auth`` as ``(path, Authorization header or None)``.

Usage::

    with FakeHub() as hub:
        hub.add_repo("org/repo", {"m-Q4_0.gguf": make_gguf("m", "Q4_0")})
        env = {"HF_ENDPOINT": hub.url}
"""
import hashlib
import json
import os
import re
import socket
import tempfile
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import gguf
import numpy as np
import pytest

BLOCK = 4096
_LFS_SUFFIXES = (".gguf", ".bin", ".safetensors", ".onnx")
_FILE_TYPES = {name.replace("MOSTLY_", ""): int(v) for name, v in gguf.LlamaFileType.__members__.items()}


def make_gguf(name="tiny", precision="Q4_0", floats=8192, seed=0):
    """Bytes of a small valid GGUF: llama metadata and one F32 tensor (~``4*floats`` bytes).

    ``precision`` goes into ``general.file_type`` when llama.cpp knows it.
    """
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(path, "llama")
        writer.add_name(name)
        writer.add_context_length(64)
        writer.add_embedding_length(64)   # enough of a model to pass geniex's header checks
        writer.add_block_count(1)
        if precision and precision.upper() in _FILE_TYPES:
            writer.add_file_type(_FILE_TYPES[precision.upper()])
        data = np.random.default_rng(seed).standard_normal(floats).astype(np.float32)
        writer.add_tensor("token_embd.weight", data.reshape(-1, 64))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


def git_oid(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """The fake Hub; a context manager that starts and stops the server thread."""

    def __init__(self, page_size=3):
        self.repos = {}  # repo_id -> {path: bytes}
        self.tokens = {}  # repo_id -> the token it needs
        self.cuts = {}  # (repo_id, path) -> cuts still to make
        self.bad_sha = set()  # (repo_id, path)
        self._throttle_changed = threading.Condition()
        self.throttle = 0.0
        self.page_size = page_size
        self.links = {}        # repo_id -> Link URL sent with every listing page
        self.raw_listing = {}  # repo_id -> JSON served as the whole listing
        self.bombs = {}        # (repo_id, path or None) -> zero bytes served gzip-compressed
        self.redirects = {}    # (repo_id, path) -> URL the resolve answers 302 with
        self.requests = []
        self.auth = []
        self._cdn = {}  # sha256 -> (repo_id, path)
        self._lock = threading.Lock()
        self._server = None

    @property
    def throttle(self):
        """Seconds the CDN pauses after each 4 kB block (0: none)."""
        return self._throttle

    @throttle.setter
    def throttle(self, seconds):
        # A pause under way ends when the throttle changes: a test that lowers it to let
        # a crawling download finish does not wait out the block it is pausing after.
        with self._throttle_changed:
            self._throttle = seconds
            self._throttle_changed.notify_all()

    def _pause(self):
        """The CDN's pause after a block: ``throttle`` seconds, or until it changes."""
        with self._throttle_changed:
            if self._throttle:
                self._throttle_changed.wait(self._throttle)

    # -- setup ----------------------------------------------------------------------

    def add_repo(self, repo_id, files):
        """Serve ``files`` (``{path: bytes}``) as the repo ``repo_id``."""
        self.repos[repo_id] = dict(files)
        for path, data in files.items():
            self._cdn[hashlib.sha256(data).hexdigest()] = (repo_id, path)

    def gate(self, repo_id, token):
        self.tokens[repo_id] = token

    def cut(self, repo_id, path, times=1):
        self.cuts[(repo_id, path)] = times

    def wrong_sha(self, repo_id, path):
        self.bad_sha.add((repo_id, path))

    def cdn_gets(self, repo_id, path):
        """The Range headers (None = whole file) of CDN requests for one file."""
        key = f"/cdn/{hashlib.sha256(self.repos[repo_id][path]).hexdigest()}"
        return [rng for p, rng in self.requests if p == key]

    # -- lifecycle ------------------------------------------------------------------

    @property
    def url(self):
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self):
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self):
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- answers --------------------------------------------------------------------

    def listing(self, repo_id):
        entries, dirs = [], set()
        for path, data in sorted(self.repos[repo_id].items()):
            parts = path.split("/")
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
            entry = {"type": "file", "oid": git_oid(data), "size": len(data), "path": path}
            if path.endswith(_LFS_SUFFIXES):
                sha = hashlib.sha256(data).hexdigest()
                if (repo_id, path) in self.bad_sha:
                    sha = hashlib.sha256(data + b"tampered").hexdigest()
                entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
            entries.append(entry)
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)]
        return entries


class _Handler(BaseHTTPRequestHandler):
    hub = None  # set per server

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):
        url = urlsplit(self.path)
        with self.hub._lock:
            self.hub.requests.append((url.path, self.headers.get("Range")))
            self.hub.auth.append((url.path, self.headers.get("Authorization")))
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)$", url.path)
        if m:
            return self._tree(unquote(m.group(1)), parse_qs(url.query))
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", url.path)
        if m:
            return self._resolve(unquote(m.group(1)), unquote(m.group(3)))
        m = re.match(r"^/cdn/([0-9a-f]{64})$", url.path)
        if m and m.group(1) in self.hub._cdn:
            repo_id, path = self.hub._cdn[m.group(1)]
            return self._send_file(repo_id, path)
        self._error(404, "Not found")

    def _authorized(self, repo_id):
        if repo_id not in self.hub.repos:
            self._error(404, "Repository not found", "RepoNotFound")
            return False
        needed = self.hub.tokens.get(repo_id)
        given = self.headers.get("Authorization")
        if needed and given != f"Bearer {needed}":
            if given:
                self._error(401, "Invalid credentials in Authorization header")
            else:
                self._error(401, "Access to this repo is restricted", "GatedRepo")
            return False
        return True

    def _tree(self, repo_id, query):
        if not self._authorized(repo_id):
            return
        if (repo_id, None) in self.hub.bombs:
            return self._send_bomb(self.hub.bombs[(repo_id, None)])
        entries = self.hub.listing(repo_id)
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start:start + self.hub.page_size]
        headers = {}
        if start + self.hub.page_size < len(entries):
            nxt = f"{self.hub.url}{urlsplit(self.path).path}?recursive=true&cursor={start + self.hub.page_size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        if repo_id in self.hub.raw_listing:
            page, headers = self.hub.raw_listing[repo_id], {}
        if repo_id in self.hub.links:
            headers["Link"] = f'<{self.hub.links[repo_id]}>; rel="next"'
        self._send(200, json.dumps(page).encode(), "application/json", headers)

    def _send_bomb(self, size):
        # size zero bytes, deflated in 1 MiB steps (never held whole), sent as gzip.
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        block, left, parts = b"\0" * (1 << 20), size, []
        while left > 0:
            parts.append(packer.compress(block[:min(left, len(block))]))
            left -= len(block)
        parts.append(packer.flush())
        self._send(200, b"".join(parts), "application/json", {"Content-Encoding": "gzip"})

    def _resolve(self, repo_id, path):
        if not self._authorized(repo_id):
            return
        data = self.hub.repos[repo_id].get(path)
        if data is None:
            return self._error(404, "Entry not found", "EntryNotFound")
        if (repo_id, path) in self.hub.bombs:
            return self._send_bomb(self.hub.bombs[(repo_id, path)])
        if (repo_id, path) in self.hub.redirects:
            self.send_response(302)
            self.send_header("Location", self.hub.redirects[(repo_id, path)])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path.endswith(_LFS_SUFFIXES):
            self.send_response(302)
            self.send_header("Location", f"/cdn/{hashlib.sha256(data).hexdigest()}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send_file(repo_id, path)

    def _send_file(self, repo_id, path):
        data = self.hub.repos[repo_id][path]
        start, status = 0, 200
        m = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            if start >= len(data):
                return self._send(416, b"", "text/plain", {"Content-Range": f"bytes */{len(data)}"})
            status = 206
        body = data[start:]
        headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if status == 206 else {}
        with self.hub._lock:
            cut = self.hub.cuts.get((repo_id, path), 0) > 0
            if cut:
                self.hub.cuts[(repo_id, path)] -= 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        limit = len(body) // 2 if cut else len(body)
        try:
            for i in range(0, limit, BLOCK):
                self.wfile.write(body[i:min(i + BLOCK, limit)])
                if self.hub.throttle:
                    self.wfile.flush()
                    self.hub._pause()
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        if cut:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def _error(self, status, message, code=None):
        self._send(status, json.dumps({"error": message}).encode(), "application/json",
                   {"X-Error-Code": code} if code else {})

    def _send(self, status, body, content_type, headers=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)



@pytest.fixture
def fake_hub():
    """A running FakeHub, stopped after the test (a plugin fixture: tests/conftest.py)."""
    with FakeHub() as hub:
        yield hub
