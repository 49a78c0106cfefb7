"""The checksums the Hub publishes, computed incrementally as bytes arrive.

LFS files (every GGUF) are checked against their sha256 (``lfs.oid``). Small files the
Hub keeps in git directly have only a git blob id: the sha1 of ``"blob <size>\\0"``
followed by the content.
"""
import hashlib

from geniex import files

READ_CHUNK = 1 << 20


class Digest:
    """A running hash of one file, and the value the Hub says it must end with."""

    def __init__(self, kind, expected, hasher):
        self.kind = kind
        self.expected = expected
        self._hasher = hasher

    @classmethod
    def for_remote(cls, remote):
        """The strongest check the Hub gives for ``remote``, or None if it gives none."""
        if remote.sha256:
            return cls("sha256", remote.sha256.lower(), hashlib.sha256())
        if remote.git_oid:
            hasher = hashlib.sha1(f"blob {remote.size}\0".encode())
            return cls("git blob id", remote.git_oid.lower(), hasher)
        return None

    def update(self, data):
        self._hasher.update(data)

    def update_from_file(self, path, limit=None):
        """Feed the first ``limit`` bytes (all if None) of ``path`` (a store file: a
        regular file, never through a symlink)."""
        with files.open_regular(path, follow_symlinks=False) as f:
            remaining = limit
            while remaining is None or remaining > 0:
                block = f.read(READ_CHUNK if remaining is None else min(READ_CHUNK, remaining))
                if not block:
                    break
                self.update(block)
                if remaining is not None:
                    remaining -= len(block)

    @property
    def actual(self):
        return self._hasher.hexdigest()

    def ok(self):
        return self.actual == self.expected


def sha256_of(path, progress=None, follow_symlinks=False):
    """sha256 of a whole regular file; ``progress(n)`` is called with each block's size.
    Store files are never read through a symlink; a user's own file may be one."""
    hasher = hashlib.sha256()
    with files.open_regular(path, follow_symlinks=follow_symlinks) as f:
        while block := f.read(READ_CHUNK):
            hasher.update(block)
            if progress:
                progress(len(block))
    return hasher.hexdigest()


def file_matches(path, remote):
    """True if the file at ``path`` is exactly ``remote`` (size, then checksum)."""
    if not files.is_regular(path):
        return False
    try:
        if path.stat().st_size != remote.size:
            return False
        digest = Digest.for_remote(remote)
        if digest is None:
            return True
        digest.update_from_file(path)
    except OSError:
        return False
    return digest.ok()
