"""Start a real ``geniex serve`` on a free loopback port for the reliability tools."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_server(data_dir, extra, nctx):
    """``(process, base URL)`` of a server with its own data dir; its log goes to
    ``data_dir/server.log``. Exits with a message when it does not start."""
    env = {**os.environ, "GENIEX_DATADIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("GENIEX_HOST", None)
    log = open(Path(data_dir) / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "geniex", "--log", "info", "serve", "--host", "127.0.0.1:0",
                             "--nctx", str(nctx), *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=log, text=True)
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not match:
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r} (see {log.name})")
    return proc, match.group(0)
