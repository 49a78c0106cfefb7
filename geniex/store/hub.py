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
  redirect and drops our ``Authorization`` header when the host changes.

Failures carry ``X-Error-Code`` (``RepoNotFound``, ``GatedRepo``, ``EntryNotFound``,
``RevisionNotFound``); the Hub answers 401 rather than 404 for a missing repo when no
token is sent, so the code is read before the status.
"""
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import requests

from geniex.store.errors import HubError, HubUnreachable

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
# (connect, read) seconds: a stalled CDN read fails and is resumed rather than hanging.
TIMEOUT = (10, 60)
TOKEN_HINT = "set GENIEX_HFTOKEN or HF_TOKEN, or log in with `hf auth login`"


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
        if self.token:
            self.session.headers["Authorization"] = f"Bearer {self.token}"

    def list_files(self, repo_id):
        """Every file of ``repo_id`` at our revision, as RemoteFiles sorted by path."""
        url = f"{self.endpoint}/api/models/{repo_id}/tree/{quote(self.revision, safe='')}"
        params = {"recursive": "true"}
        files = []
        while url:
            response = self._get(url, repo_id, params=params)
            try:
                entries = response.json()
            except ValueError:
                raise HubError(f"{self.endpoint} did not answer like a Hugging Face Hub (listing of {repo_id} is not JSON); check HF_ENDPOINT") from None
            for entry in entries:
                if entry.get("type") != "file":
                    continue
                lfs = entry.get("lfs") or {}
                files.append(RemoteFile(
                    path=entry["path"],
                    size=int(lfs.get("size", entry.get("size", 0))),
                    sha256=lfs.get("oid"),
                    git_oid=None if lfs else entry.get("oid"),
                ))
            url = response.links.get("next", {}).get("url")
            params = None  # the next link carries its own query
        return sorted(files, key=lambda f: f.path)

    def file_url(self, repo_id, path):
        """The download URL of one repo file."""
        return f"{self.endpoint}/{repo_id}/resolve/{quote(self.revision, safe='')}/{quote(path)}"

    def get_bytes(self, repo_id, path):
        """A small file's content (e.g. ``config.json``)."""
        return self._get(self.file_url(repo_id, path), repo_id, what=path).content

    def open(self, repo_id, path, start=0):
        """A streaming response for one file, from byte ``start`` (a ``Range`` request).

        The caller checks ``status_code``: 206 means the range was honoured, 200 that
        the server sent the whole file, 416 that ``start`` is at or past the end.
        """
        # identity: a compressed body would not line up with byte offsets in the file.
        headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={start}-"} if start else {})}
        return self._get(self.file_url(repo_id, path), repo_id, what=path, headers=headers, stream=True, ok=(416,))

    def _get(self, url, repo_id, what=None, ok=(), **kwargs):
        try:
            response = self.session.get(url, timeout=TIMEOUT, allow_redirects=True, **kwargs)
        except requests.RequestException as e:
            raise HubUnreachable(f"cannot reach {self.endpoint}: {_reason(e)}; check the network (or HF_ENDPOINT)") from None
        if response.status_code < 400 or response.status_code in ok:
            return response
        response.close()
        transient = response.status_code == 429 or response.status_code >= 500
        raise (HubUnreachable if transient else HubError)(self._explain(response, repo_id, what))

    def _explain(self, response, repo_id, what):
        code = response.headers.get("X-Error-Code", "")
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


def _reason(error):
    # requests nests the socket error in a long repr; "[Errno 111] Connection refused"
    # is the part a user can act on.
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(error))
    if m:
        return m.group(1).strip()
    if isinstance(error, requests.Timeout):
        return "timed out"
    return type(error).__name__
