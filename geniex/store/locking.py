"""Advisory file locks shared between geniex processes, on every platform.

The locks come from ``filelock`` (the library huggingface_hub uses): its
``ReadWriteLock`` keeps the lock in a small SQLite file, so shared (reader) and
exclusive (writer) holds work the same way on Linux, macOS and Windows, with no
``fcntl`` (POSIX only) or ``msvcrt`` (Windows only) code of ours.

Lock files may be deleted while held on POSIX systems (``remove`` deletes a whole model
folder). A process that was waiting on the old file would then hold a lock nobody else
can see while a newcomer locks a new file; so after locking we check that the path still
names the file we locked, and start over if not. Windows refuses to delete a file that
another process holds open, so there the question does not arise; :func:`discard`
removes a lock file when nobody holds it and leaves it in place otherwise.
"""
import os
import sqlite3
import stat
import warnings
from contextlib import contextmanager

from geniex.store.errors import StoreError

with warnings.catch_warnings():
    # Where fcntl is missing but the platform is not Windows, filelock warns that only
    # its "soft" lock is available; ReadWriteLock (SQLite) is all we use, and it needs
    # neither fcntl nor msvcrt, so the warning would only mislead.
    warnings.simplefilter("ignore", UserWarning)
    import filelock


class Busy(Exception):
    """A non-blocking lock attempt found the lock held by someone else."""


@contextmanager
def file_lock(path, shared=False, blocking=True, on_wait=None):
    """Hold a lock on ``path`` (created, with its folder, if missing) for the block.

    ``shared`` takes a reader lock (many holders), else an exclusive one. With
    ``blocking=False`` raises Busy at once if it is held; otherwise ``on_wait()`` is
    called once before blocking, so the caller can say what it is waiting for.
    """
    waited = False
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        _clear_the_way(path)
        before = _identity(path)
        lock = filelock.ReadWriteLock(path, is_singleton=False)
        acquire = lock.acquire_read if shared else lock.acquire_write
        try:
            try:
                acquire(blocking=False)
            except filelock.Timeout:
                if not blocking:
                    raise Busy(str(path)) from None
                if on_wait and not waited:
                    on_wait()
                    waited = True
                acquire(blocking=True)
        except OSError:
            lock.close()
            if _identity(path) == before:
                raise
            continue  # filelock saw the file deleted or replaced while it waited: start over
        except sqlite3.DatabaseError:
            # Not a lock file of ours (overwritten, damaged): nobody can hold a lock on
            # it, so it goes, and a fresh one is made.
            lock.close()
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                raise StoreError(f"{path} is not a lock file and cannot be removed: {e.strerror or e}") from None
            continue
        except BaseException:
            lock.close()
            raise
        after = _identity(path)
        if after is not None and (before is None or after == before):
            break
        # The file was deleted (or replaced) while we waited: what we hold guards nothing.
        lock.close()
    try:
        yield
    finally:
        lock.close()  # releases the hold and the SQLite connection

def discard(path):
    """Delete the lock file ``path`` if the platform lets us.

    POSIX deletes it even while another process has it open (the identity check in
    :func:`file_lock` makes that safe); Windows refuses while any process holds it
    open, and then the file simply stays for the next user (``geniex clean`` removes
    leftovers later).
    """
    try:
        path.unlink(missing_ok=True)
    except PermissionError:
        pass


def _clear_the_way(path):
    """A lock file is ours: anything else at its path (a symlink, which SQLite would
    write through; a FIFO, which would block it) is removed first."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise StoreError(f"{path} is a folder where the store keeps a lock file; remove it")
    path.unlink(missing_ok=True)


def _identity(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)

