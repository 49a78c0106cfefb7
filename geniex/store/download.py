"""Resumable, verified downloads into the store.

One file at a time, the way ``huggingface_hub`` does it:

1. lock ``<file>.lock`` (``filelock``), so two pulls never write the same bytes; the
   second one waits, then finds the file in place and skips it;
2. append to ``<file>.partial``, resuming with ``Range`` from its current size (after a
   cut connection, in this process, or after Ctrl-C, in the next pull);
3. check size and checksum, hashing as bytes arrive (a resumed file hashes its prefix
   first, so nothing is read twice);
4. ``os.replace`` the partial onto the final name: the file appears whole or not at all.

A file that fails the check is deleted, never moved into place.
"""
import errno
import os
import re
import shutil
import stat
import sys
import time

import requests
from tqdm import tqdm

from geniex import files
from geniex.errors import shown
from geniex.store.checksums import Digest, file_matches
from geniex.store.errors import DownloadError, HubUnreachable
from geniex.store.locking import discard, file_lock
from geniex.store.display import human_size, is_terminal
from geniex.store.manifest import LOCK_SUFFIX, PARTIAL_SUFFIX

# Bytes per read. A cut connection loses the block being read, so keep it modest.
CHUNK = 1 << 16
RETRIES = 5
RETRY_PAUSE = 0.5  # seconds, times the attempt number


def partial_path(dest):
    return dest.with_name(dest.name + PARTIAL_SUFFIX)


def lock_path(dest):
    return dest.with_name(dest.name + LOCK_SUFFIX)


def fetch(hub, repo_id, remote, dest, out=sys.stderr, retries=RETRIES):
    """Download ``remote`` (a RemoteFile of ``repo_id``) to ``dest``.

    Returns False if ``dest`` already held exactly that file (nothing downloaded).
    Raises DownloadError (or HubError) with a one-line message; a KeyboardInterrupt
    leaves the partial file for the next pull to resume.
    """
    lock = lock_path(dest)
    waiting = lambda: print(f"another pull is downloading {shown(remote.path)}; waiting for it...", file=out, flush=True)  # noqa: E731
    with file_lock(lock, on_wait=waiting):
        if dest.exists() and file_matches(dest, remote):
            discard(lock)
            return False
        _download(hub, repo_id, remote, partial_path(dest), out, retries)
        try:
            os.replace(partial_path(dest), dest)
        except PermissionError:
            # Windows: the old file is open in another process (a model being served);
            # the verified partial stays, so the next pull just moves it into place.
            raise DownloadError(f"cannot replace {dest}: another process has it open (on Windows, a model "
                                f"being served or run cannot be replaced); stop that process and pull again") from None
        discard(lock)
    return True


class _State:
    """Bytes written to the partial file so far, and the hash of exactly those bytes."""

    def __init__(self, remote, partial):
        self.remote, self.partial = remote, partial
        self.restart_from(_resume_point(partial, remote))

    def restart_from(self, have):
        """Trust the first ``have`` bytes on disk: re-hash them (only after a surprise)."""
        self.have = have
        self.digest = Digest.for_remote(self.remote)
        if self.digest and have:
            self.digest.update_from_file(self.partial, have)

    def in_sync(self):
        try:
            return self.partial.stat().st_size == self.have
        except FileNotFoundError:
            return self.have == 0


def _download(hub, repo_id, remote, partial, out, retries):
    """Fill ``partial`` with the verified bytes of ``remote``."""
    state = _State(remote, partial)
    _check_room(partial, remote.size - state.have, remote)
    show_bar = is_terminal(out)
    if not show_bar:
        resumed = f", resuming at {human_size(state.have)}" if state.have else ""
        print(f"downloading {shown(remote.path)} ({human_size(remote.size)}{resumed})", file=out, flush=True)
    bar = tqdm(total=remote.size, initial=state.have, unit="B", unit_scale=True,
               desc=_short(remote.path), file=out, disable=not show_bar, leave=True, dynamic_ncols=True)
    try:
        if remote.size == 0:
            files.open_for_writing(partial).close()     # an empty file is whole at once
        attempt = 0
        while state.have < remote.size:
            try:
                _transfer(hub, repo_id, state, bar)
            except (requests.RequestException, HubUnreachable) as e:
                attempt += 1
                if attempt > retries:
                    raise DownloadError(f"downloading {shown(remote.path)} kept failing ({_brief(e)}); "
                                        f"run the same pull again to resume from {human_size(state.have)}") from None
                if not state.in_sync():
                    state.restart_from(_resume_point(partial, remote))
                where = f"resuming at {human_size(state.have)}" if state.have else "starting over"
                bar.write(f"{shown(remote.path)}: {_brief(e)}; {where}", file=out)
                time.sleep(RETRY_PAUSE * attempt)
    finally:
        bar.close()
    _verify(partial, remote, state.digest)


def _resume_point(partial, remote):
    """Bytes already in ``partial`` worth keeping (none if it is longer than the file, or
    not a regular file of ours: a symlink or FIFO planted there is removed, never
    written through)."""
    try:
        st = os.lstat(partial)
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(st.st_mode) or st.st_size > remote.size:
        partial.unlink()
        return 0
    return st.st_size


def _check_room(partial, needed, remote):
    """Refuse at once a download the disk cannot hold (a listing may claim any size)."""
    try:
        free = shutil.disk_usage(partial.parent).free
    except OSError:
        return
    if needed > free:
        raise DownloadError(f"{shown(remote.path)} needs {human_size(needed)} more but {partial.parent} has "
                            f"{human_size(free)} free; free some space, or check the Hub's listing")


def _transfer(hub, repo_id, state, bar):
    """One request: append what the server sends to the partial file."""
    remote, partial = state.remote, state.partial
    response = hub.open(repo_id, remote.path, start=state.have)
    with response:
        if state.have and not _honours_range(response, state.have):
            # The server ignored (or refused) our range: start over from byte 0.
            partial.unlink(missing_ok=True)
            state.restart_from(0)
            bar.reset(total=remote.size)
            if response.status_code != 200:
                return
        try:
            with files.open_for_writing(partial, append=bool(state.have)) as f:
                for block in response.iter_content(CHUNK):
                    f.write(block)
                    state.have += len(block)
                    if state.digest:
                        state.digest.update(block)
                    bar.update(len(block))
                    if state.have > remote.size:
                        break  # more than the listing said: let verification reject it
                f.flush()
                os.fsync(f.fileno())
        except requests.RequestException:
            raise  # a network failure (requests' errors are OSErrors too): retried above
        except OSError as e:
            raise _write_error(e, partial, remote.size - state.have) from None
    if state.have < remote.size:
        raise requests.ConnectionError("the connection closed early")


def _honours_range(response, start):
    if response.status_code != 206:
        return False
    m = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return bool(m) and int(m.group(1)) == start


def _verify(partial, remote, digest):
    size = partial.stat().st_size
    if size != remote.size:
        partial.unlink(missing_ok=True)
        raise DownloadError(f"{shown(remote.path)} came out as {size} bytes but the Hub lists {remote.size}; "
                            "discarded the download, pull again")
    if digest and not digest.ok():
        partial.unlink(missing_ok=True)
        raise DownloadError(f"{shown(remote.path)} failed its {digest.kind} check (got {digest.actual[:12]}…, "
                            f"expected {digest.expected[:12]}…); discarded the download. Pull again; if it "
                            "fails again the Hub's copy changed or is damaged")


def _write_error(error, path, missing):
    if error.errno == errno.ENOSPC:
        return DownloadError(f"disk full while writing {path} ({human_size(missing)} still to come); "
                             "free some space, then run the same pull to resume")
    return DownloadError(f"cannot write {path}: {error.strerror or error}")


def _brief(error):
    if isinstance(error, requests.exceptions.ChunkedEncodingError):
        return "the connection closed mid-file"
    if isinstance(error, requests.Timeout):
        return "timed out"
    text = str(error)
    return text if len(text) < 120 else type(error).__name__


def _short(path):
    name = shown(path.rsplit("/", 1)[-1], limit=1000)
    return name if len(name) <= 40 else name[:18] + "…" + name[-21:]

