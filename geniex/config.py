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
    """Physical core count (hyper-threads share a core's FPUs, so they do not help decode)."""
    try:
        cores = set()
        with open("/proc/cpuinfo") as f:
            phys = core = None
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip():
                    if core is not None:
                        cores.add((phys, core))
                    phys = core = None
            if core is not None:
                cores.add((phys, core))
        if cores:
            return min(len(cores), os.cpu_count() or len(cores))
    except OSError:
        pass
    return os.cpu_count() or 1
