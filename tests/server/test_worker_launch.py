"""How the server starts a model's worker process (geniex.server.worker.worker_command):
the worker imports the same geniex as the server, and its sys.path is the
interpreter's own, the standard library first."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import geniex

pytestmark = pytest.mark.fast

PARENT = textwrap.dedent("""
    import json, sys, sysconfig
    site_dir = sys.argv[1]
    # Where an installed geniex sits: after the standard library, as site-packages is.
    stdlib = sysconfig.get_paths()["stdlib"]
    at = max(i for i, p in enumerate(sys.path) if p.startswith(stdlib) or p.endswith(".zip")) + 1
    sys.path.insert(at, site_dir)
    import geniex.server.worker as worker
    process = worker._Process()
    process.send(("exit",))
    message = process.replies.get(timeout=120)
    print(json.dumps({"geniex": worker.__file__, "pid": process.pid, "end": list(message)}))
""")


def test_the_worker_imports_the_servers_geniex_and_the_standard_library_first(tmp_path):
    # A stand-in for an installed geniex: a site-packages folder holding a copy of the
    # package and a module named like a standard one (as an old backport would be). The
    # worker once had that folder on its PYTHONPATH, ahead of the standard library, and
    # imported the stand-in instead of the standard `queue`.
    site_dir = tmp_path / "site-packages"
    shutil.copytree(Path(geniex.__file__).parent, site_dir / "geniex",
                    ignore=shutil.ignore_patterns("__pycache__"))
    marks = tmp_path / "marks"
    init = site_dir / "geniex" / "__init__.py"
    init.write_text(init.read_text() + textwrap.dedent("""
        import os as _os
        with open(_os.environ["GENIEX_TEST_MARKS"], "a") as _f:
            _f.write(f"{_os.getpid()} geniex {__file__}\\n")
    """))
    (site_dir / "queue.py").write_text(textwrap.dedent("""
        import os
        with open(os.environ["GENIEX_TEST_MARKS"], "a") as f:
            f.write(f"{os.getpid()} shadowed queue\\n")
        raise ImportError("the standard library's queue was shadowed")
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["GENIEX_TEST_MARKS"] = str(marks)
    p = subprocess.run([sys.executable, "-c", PARENT, str(site_dir)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert Path(out["geniex"]).is_relative_to(site_dir)         # the parent's geniex is the stand-in
    assert out["end"] == ["died", 0], p.stderr                  # the worker started and ended cleanly
    lines = marks.read_text().splitlines()
    assert not [line for line in lines if "shadowed" in line], lines
    assert f"{out['pid']} geniex {site_dir / 'geniex' / '__init__.py'}" in lines   # the worker's geniex too
