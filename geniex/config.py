"""Process-wide settings resolved from flags and environment variables."""
import os
from pathlib import Path


def data_dir(flag_value=None):
    """The store root: ``--data-dir`` > ``GENIEX_DATADIR`` > ``~/.cache/geniex``."""
    value = flag_value or os.environ.get("GENIEX_DATADIR") or "~/.cache/geniex"
    return Path(value).expanduser()


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
