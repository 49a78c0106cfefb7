"""Advisory file locks (``fcntl.flock``) shared between geniex processes.

Lock files may be deleted while held (a finished download removes its own, ``remove``
deletes a whole model folder). A process that opened the file just before the delete
would then lock an orphaned inode while a newcomer locks a new one, and both would
think they hold the lock; so after locking we check that the path still names the
inode we locked, and start over if not.
"""
import errno
import fcntl
import os
from contextlib import contextmanager


class Busy(Exception):
    """A non-blocking lock attempt found the lock held by someone else."""


@contextmanager
def file_lock(path, shared=False, blocking=True, on_wait=None):
    """Hold a lock on ``path`` (created, with its folder, if missing) for the block.

    ``shared`` takes a reader lock (many holders), else an exclusive one. With
    ``blocking=False`` raises Busy at once if it is held; otherwise ``on_wait()`` is
    called once before blocking, so the caller can say what it is waiting for.
    """
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    waited = False
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if not blocking:
                    raise Busy(str(path)) from None
                if on_wait and not waited:
                    on_wait()
                    waited = True
                fcntl.flock(fd, mode)
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file was replaced or deleted while we waited: retry
    try:
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _same_file(fd, path):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

