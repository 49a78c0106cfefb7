"""Process-wide settings resolved from flags and environment variables."""
import os
import sys
from pathlib import Path


def data_dir(flag_value=None):
    """The store root: ``--data-dir`` > ``GENIEX_DATADIR`` > the platform's default
    (:func:`default_data_dir`)."""
    value = flag_value or os.environ.get("GENIEX_DATADIR")
    return Path(value).expanduser() if value else default_data_dir()


def default_data_dir(platform=None, environ=None, home=None):
    """Where each platform keeps per-user caches of large downloads:

    - Linux and other POSIX: ``$XDG_CACHE_HOME/geniex``, else ``~/.cache/geniex``;
    - macOS: ``~/Library/Caches/geniex``;
    - Windows: ``%LOCALAPPDATA%\\geniex``, else ``~\\AppData\\Local\\geniex``.

    The arguments exist so each platform's rule can be checked on any machine.
    """
    platform = platform or sys.platform
    environ = os.environ if environ is None else environ
    home = Path(home) if home is not None else Path.home()
    if platform == "win32":
        base = environ.get("LOCALAPPDATA")
        return (Path(base) if base else home / "AppData" / "Local") / "geniex"
    if platform == "darwin":
        return home / "Library" / "Caches" / "geniex"
    base = environ.get("XDG_CACHE_HOME")
    # The XDG spec says a relative value is invalid and must be ignored.
    return (Path(base) if base and Path(base).is_absolute() else home / ".cache") / "geniex"


def physical_cores():
    """Physical cores this process may run on: its CPU affinity (``taskset``, a
    container's cpuset) where the platform has one, counted by core (hyper-threads share
    a core's FPUs, so they do not help decode). More decode threads than allowed CPUs
    is the worst case, not a small loss: OpenMP threads spin at every barrier waiting
    for a thread that has no CPU to run on (a prompt took 5x as long here)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        with open("/proc/cpuinfo") as f:
            counted = cores_in_cpuinfo(f.read(), allowed)
        if counted:
            return counted
    except OSError:
        pass
    return len(allowed) if allowed else (os.cpu_count() or 1)


def cores_in_cpuinfo(text, allowed=None):
    """The number of distinct (physical id, core id) pairs among the ``processor``
    entries of a Linux ``/proc/cpuinfo`` text that are in ``allowed`` (all when None);
    0 when the text has no core ids (some ARM kernels, containers)."""
    cores = set()
    for block in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "core id" not in fields or not fields.get("processor", "").isdigit():
            continue
        if allowed is not None and int(fields["processor"]) not in allowed:
            continue
        cores.add((fields.get("physical id"), fields["core id"]))
    return len(cores)
