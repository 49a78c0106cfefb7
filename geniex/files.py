"""Opening files another process or user may have planted (the store, the data dir).

A FIFO blocks ``open()`` until a writer comes and a device may never end, so only
regular files are opened, without blocking, and checked again on the open descriptor;
a symlink may lead outside the data dir, so store files are opened with ``O_NOFOLLOW``
(where the platform has it; elsewhere the path is checked with ``lstat`` first); and a
read is bounded, so a huge file is refused rather than read whole.
"""
import os
import stat

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class NotRegular(OSError):
    """The path is a folder, pipe, socket, device or (where refused) a symlink;
    ``kind`` says which, as words ("a folder", "a symlink", "a pipe, socket or device")."""

    def __init__(self, path, kind):
        super().__init__(f"{path} is {kind}, not a regular file")
        self.kind = kind


class TooLarge(OSError):
    """The file is larger than the caller reads."""


def open_regular(path, *, follow_symlinks=True, mode="rb"):
    """``path`` opened for reading only if it is a regular file (a file object).

    Raises FileNotFoundError, :class:`NotRegular` (a folder, FIFO, socket, device; a
    symlink when ``follow_symlinks`` is false) or another OSError.
    """
    if not follow_symlinks:
        _refuse_symlink(path)
    mode_bits = os.stat(path).st_mode
    if not stat.S_ISREG(mode_bits):
        raise NotRegular(path, _kind(mode_bits))
    flags = os.O_RDONLY | _NONBLOCK | _NOCTTY | _BINARY | (0 if follow_symlinks else _NOFOLLOW)
    fd = os.open(path, flags)
    return _checked(fd, path, mode)


def read_bounded(path, limit, *, follow_symlinks=False):
    """The bytes of the regular file ``path``; :class:`TooLarge` beyond ``limit`` bytes."""
    with open_regular(path, follow_symlinks=follow_symlinks) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{path} is larger than {limit:,} bytes")
    return data


def open_for_writing(path, append=False, exclusive=False):
    """``path`` opened for binary writing without following a symlink planted there
    (ELOOP instead), created if missing; refuses anything but a regular file."""
    if not _NOFOLLOW:
        _refuse_symlink(path)
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _BINARY | _NONBLOCK
    flags |= os.O_EXCL if exclusive else (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    return _checked(fd, path, "ab" if append else "wb")


def _checked(fd, path, mode):
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(path, _kind(st.st_mode))
        if _NONBLOCK and hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def _refuse_symlink(path):
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise NotRegular(path, "a symlink")
    except FileNotFoundError:
        pass


def is_regular(path):
    """True if ``path`` itself (not a symlink's target) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_real_dir(path):
    """True if ``path`` itself (not a symlink's target) is a folder."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _kind(mode_bits):
    if stat.S_ISDIR(mode_bits):
        return "a folder"
    if stat.S_ISLNK(mode_bits):
        return "a symlink"
    return "a pipe, socket or device"
