"""A small client for the Hugging Face Hub's HTTP API (only what pulling needs).

Endpoints used, as the Hub serves them (and as ``huggingface_hub`` calls them):

- ``GET {endpoint}/api/models/{org}/{repo}/tree/{revision}?recursive=true`` lists every
  file with its ``size``; LFS files also carry ``lfs.oid``, their sha256, and other
  files a git blob ``oid`` (sha1 of ``"blob <size>\\0" + content``). The answer is
  paginated: the next page, if any, is in the ``Link: <...>; rel="next"`` header.
  We prefer it to ``/api/models/{repo}?blobs=true`` because that one stops being
  complete for large repos.
- ``GET {endpoint}/{org}/{repo}/resolve/{revision}/{path}`` downloads a file; for LFS
  files it redirects to a CDN, which honours ``Range``. ``requests`` follows the
  redirect and drops our ``Authorization`` header when the host, port or scheme changes.

What a hub sends is not trusted: the token is sent only to the endpoint's own origin
(scheme, host and port), never to a ``Link`` or anywhere else; pagination stays on that
origin, for at most :data:`MAX_PAGES` pages, none twice; a listing page and a small file
are read up to a bound after decompression (:data:`MAX_LISTING_PAGE`, :data:`MAX_SMALL_FILE`),
so a gzip bomb stops there; every listing entry is checked field by field, and names
that reach a message are escaped (no terminal escape sequences).

Failures carry ``X-Error-Code`` (``RepoNotFound``, ``GatedRepo``, ``EntryNotFound``,
``RevisionNotFound``); the Hub answers 401 rather than 404 for a missing repo when no
token is sent, so the code is read before the status.
"""
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

import requests

from geniex.errors import shown
from geniex.store.errors import HubError, HubUnreachable

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
# (connect, read) seconds: a stalled CDN read fails and is resumed rather than hanging.
TIMEOUT = (10, 60)
TOKEN_HINT = "set GENIEX_HFTOKEN or HF_TOKEN, or log in with `hf auth login`"
MAX_PAGES = 1000                 # listing pages of one repo (the Hub sends 1000 files a page)
MAX_LISTING_PAGE = 32 << 20      # bytes of one listing page, decompressed
MAX_SMALL_FILE = 1 << 20         # bytes of a small file read whole (config.json)
MAX_PATH = 1024                  # characters of one file path in a listing
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class RemoteFile:
    """One file of a Hub repo: path inside the repo, size, and its checksums."""

    path: str
    size: int
    sha256: str | None = None  # LFS files
    git_oid: str | None = None  # other files: git blob sha1


def find_token(environ=None):
    """The Hub token: ``GENIEX_HFTOKEN`` > ``HF_TOKEN`` > the Hub client's token file.

    The token file is ``$HF_HOME/token`` (``~/.cache/huggingface/token`` by default),
    where ``hf auth login`` writes it.
    """
    env = os.environ if environ is None else environ
    for var in ("GENIEX_HFTOKEN", "HF_TOKEN"):
        if env.get(var, "").strip():
            return env[var].strip()
    home = Path(env.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    try:
        return (home / "token").read_text().strip() or None
    except OSError:
        return None


class Hub:
    """Talks to one Hub endpoint (``HF_ENDPOINT`` by default, like the Hub's client)."""

    def __init__(self, endpoint=None, token=None, revision=DEFAULT_REVISION):
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.token = token if token is not None else find_token()
        self.revision = revision
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "geniex"
        # The token is added per request, to the endpoint's own origin only (_get): a
        # session-wide header would go wherever a Link header points.
        self._origin = origin(self.endpoint)

    def list_files(self, repo_id):
        """Every file of ``repo_id`` at our revision, as RemoteFiles sorted by path."""
        url = f"{self.endpoint}/api/models/{repo_id}/tree/{quote(self.revision, safe='')}"
        params = {"recursive": "true"}
        files, seen = [], set()
        while url:
            if len(seen) >= MAX_PAGES:
                raise HubError(f"the listing of {repo_id} on {self.endpoint} goes on for more than {MAX_PAGES} "
                               "pages; refusing to follow it further")
            response = self._get(url, repo_id, params=params, stream=True)
            seen.add(response.url)      # as requested, query included
            entries = self._json(response, MAX_LISTING_PAGE, f"the listing of {repo_id}")
            if not isinstance(entries, list):
                raise HubError(f"{self.endpoint} did not answer like a Hugging Face Hub (the listing of {repo_id} "
                               "is not a JSON list); check HF_ENDPOINT")
            files.extend(f for f in (_remote_file(e, repo_id, self.endpoint) for e in entries) if f is not None)
            url = self._next_page(response, repo_id, seen)
            params = None  # the next link carries its own query
        return sorted(files, key=lambda f: f.path)

    def _next_page(self, response, repo_id, seen):
        link = response.links.get("next", {}).get("url")
        if not link:
            return None
        url = urljoin(response.url, link)
        if origin(url) != self._origin:
            raise HubError(f"the listing of {repo_id} on {self.endpoint} continues on another server "
                           f"({shown(url)}); refusing to follow it")
        if url in seen:
            raise HubError(f"the listing of {repo_id} on {self.endpoint} links back to a page it already sent; "
                           "refusing to go round in circles")
        return url

    def _json(self, response, limit, what):
        """The response's JSON, read (decompressed) up to ``limit`` bytes."""
        data = _read_limited(response, limit, f"{what} from {self.endpoint}")
        try:
            return json.loads(data)
        except ValueError:
            raise HubError(f"{self.endpoint} did not answer like a Hugging Face Hub ({what} is not JSON); "
                           "check HF_ENDPOINT") from None

    def file_url(self, repo_id, path):
        """The download URL of one repo file."""
        return f"{self.endpoint}/{repo_id}/resolve/{quote(self.revision, safe='')}/{quote(path)}"

    def get_bytes(self, repo_id, path, limit=MAX_SMALL_FILE):
        """A small file's content (e.g. ``config.json``), at most ``limit`` bytes decompressed."""
        response = self._get(self.file_url(repo_id, path), repo_id, what=path, stream=True)
        return _read_limited(response, limit, f"{shown(path)} of {repo_id}")

    def open(self, repo_id, path, start=0):
        """A streaming response for one file, from byte ``start`` (a ``Range`` request).

        The caller checks ``status_code``: 206 means the range was honoured, 200 that
        the server sent the whole file, 416 that ``start`` is at or past the end.
        """
        # identity: a compressed body would not line up with byte offsets in the file.
        headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={start}-"} if start else {})}
        return self._get(self.file_url(repo_id, path), repo_id, what=path, headers=headers, stream=True, ok=(416,))

    def _get(self, url, repo_id, what=None, ok=(), headers=None, **kwargs):
        headers = dict(headers or {})
        if self.token and origin(url) == self._origin:
            # requests drops it again on a redirect to another host, port or scheme.
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = self.session.get(url, timeout=TIMEOUT, allow_redirects=True, headers=headers, **kwargs)
        except requests.RequestException as e:
            raise HubUnreachable(f"cannot reach {self.endpoint}: {_reason(e)}; check the network (or HF_ENDPOINT)") from None
        if response.status_code < 400 or response.status_code in ok:
            return response
        response.close()
        transient = response.status_code == 429 or response.status_code >= 500
        raise (HubUnreachable if transient else HubError)(self._explain(response, repo_id, what))

    def _explain(self, response, repo_id, what):
        code = response.headers.get("X-Error-Code", "")
        what = shown(what) if what else what
        status = response.status_code
        where = f"{repo_id} on {self.endpoint}"
        if code == "RepoNotFound" or (status == 404 and not what):
            return f"{where} does not exist (HTTP {status}); check the name (private repos also need a token: {TOKEN_HINT})"
        if code == "RevisionNotFound":
            return f"{where} has no revision {self.revision!r} (HTTP {status})"
        if code == "EntryNotFound" or status == 404:
            return f"{what} is not in {where} (HTTP {status}); it may have been removed since the listing, pull again"
        if status in (401, 403) or code == "GatedRepo":
            if not self.token:
                return f"{where} is gated or private and needs a token (HTTP {status}): accept its terms on the Hub, then {TOKEN_HINT}"
            if status == 401:
                return f"the Hub rejected the token for {where} (HTTP 401): it is wrong or expired; {TOKEN_HINT}"
            return f"access to {where} is denied (HTTP 403): the repo is gated and this token's account has not been granted access, or the token cannot read it"
        if status == 429:
            return f"the Hub is rate-limiting requests for {where} (HTTP 429); wait a minute and pull again"
        return f"the Hub answered HTTP {status} for {what or 'the file list of'} {where}; try again later"


def origin(url):
    """``(scheme, host, port)`` of a URL, the port made explicit: the token's boundary."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port


def _read_limited(response, limit, what):
    """A streamed response's body, decompressed, refusing more than ``limit`` bytes (a
    gzip bomb stops here, not in memory)."""
    chunks, total = [], 0
    with response:
        try:
            for chunk in response.iter_content(1 << 16):
                total += len(chunk)
                if total > limit:
                    raise HubError(f"{what} is larger than {limit:,} bytes (after decompression); refusing it")
                chunks.append(chunk)
        except requests.RequestException as e:
            raise HubUnreachable(f"reading {what} failed: {_reason(e)}") from None
    return b"".join(chunks)


def _remote_file(entry, repo_id, endpoint):
    """A listing entry as a RemoteFile (None for a folder); HubError naming the field
    that is malformed."""
    def bad(why, value=None):
        shown_value = f" {_as_json(value)}" if value is not None or why.startswith(("path", "size")) else ""
        return HubError(f"the listing of {repo_id} on {endpoint} has a malformed entry ({why}{shown_value}); "
                        "check HF_ENDPOINT")
    if not isinstance(entry, dict):
        raise bad("not a JSON object")
    if entry.get("type") != "file":
        return None
    path = entry.get("path")
    if not isinstance(path, str) or not path or len(path) > MAX_PATH:
        raise bad("path", path)
    if any(not c.isprintable() for c in path):
        raise bad("control characters in path", path)
    lfs = entry.get("lfs")
    if lfs is not None and not isinstance(lfs, dict):
        raise bad(f"lfs of {shown(path)} is not an object")
    size = (lfs or entry).get("size", entry.get("size"))
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise bad(f"size of {shown(path)}", size)
    sha256 = lfs.get("oid") if lfs else None
    git_oid = None if lfs else entry.get("oid")
    for name, value, length in (("lfs.oid", sha256, 64), ("oid", git_oid, 40)):
        if value is not None and not (isinstance(value, str) and len(value) == length and _HEX.match(value)):
            raise bad(f"{name} of {shown(path)}", value)
    return RemoteFile(path=path, size=size, sha256=sha256, git_oid=git_oid)


def _as_json(value):
    return shown(json.dumps(value), limit=60)


def _reason(error):
    # requests nests the socket error in a long repr; "[Errno 111] Connection refused"
    # is the part a user can act on.
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(error))
    if m:
        return m.group(1).strip()
    if isinstance(error, requests.Timeout):
        return "timed out"
    return type(error).__name__
