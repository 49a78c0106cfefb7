"""The store's locks, the CLI and the server in a Python that cannot import ``fcntl``.

Run by tests/platform/test_platforms.py::test_store_cli_and_server_work_without_fcntl as
``python -W error::UserWarning without_fcntl.py DIR`` with a ``sitecustomize`` shim on
PYTHONPATH that makes ``import fcntl`` fail as it does on Windows; every process this
starts inherits PYTHONPATH, so the shim applies to them too. (Not a test module: pytest
does not collect it.) Each check prints one ``ok ...`` line; any failure is an exception
and a non-zero exit. What can differ without ``fcntl`` is the locking (filelock's
ReadWriteLock on SQLite) and whatever imports it, so each check takes a lock or starts
a process that does: locks across processes, the store's pull / remove / clean (each
locks the model's folder), the CLI's pull and remove, and the server answering.
"""
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import geniex.cli  # noqa: F401  (the CLI's and the server's imports, under -W error::UserWarning)
import geniex.server.app  # noqa: F401
from fakehub import FakeHub, make_gguf
from geniex.store import Store
from geniex.store.errors import StoreError
from geniex.store.hub import Hub
from geniex.store.locking import Busy, file_lock
from serverproc import DEMO, AppServer, chat_body

ROOT = Path(__file__).resolve().parents[2]
REPO = "org/Tiny-GGUF"

HOLD = textwrap.dedent('''
    import sys
    from pathlib import Path
    from geniex.store.locking import file_lock
    with file_lock(Path(sys.argv[1]), shared=True):
        print("held", flush=True)
        sys.stdin.readline()
''')


def no_fcntl(work):
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return
    raise AssertionError("fcntl imported: the shim is not in place")


def locks_across_processes(work):
    """A reader in another process: readers share, a writer is Busy, then free."""
    path = work / "locks" / ".pull.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with file_lock(path, shared=True, blocking=False):
            pass
        try:
            with file_lock(path, blocking=False):
                raise AssertionError("a writer got the lock while another process reads")
        except Busy:
            pass
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    with file_lock(path, blocking=False):
        pass


def store_in_process(work):
    """Pull from the fake Hub, a second pull that finds it, remove refused while a pull
    holds the folder's lock, clean that skips a busy folder, then remove and clean."""
    data = work / "store"
    q4, q8 = make_gguf("tiny", "Q4_0", seed=1), make_gguf("tiny", "Q8_0", seed=3)
    with FakeHub() as hub:
        hub.add_repo(REPO, {"tiny-Q4_0.gguf": q4, "tiny-Q8_0.gguf": q8})
        store = Store(data, hub=Hub(endpoint=hub.url, token=""))
        model = store.pull(f"{REPO}:Q4_0", out=io.StringIO())
        assert model.path.read_bytes() == q4
        store.pull(f"{REPO}:Q8_0", out=io.StringIO())
        again = io.StringIO()
        store.pull(f"{REPO}:Q8_0", out=again)
        assert "already in the store" in again.getvalue(), again.getvalue()
    folder = store.models_dir / REPO
    (folder / "tiny-Q8_0.gguf.partial").write_bytes(b"x")
    with file_lock(folder / ".pull.lock", shared=True):
        try:
            store.remove(REPO)
            raise AssertionError("remove did not wait for the pull's lock")
        except StoreError as e:
            assert "a pull of org/Tiny-GGUF is running" in str(e), e
        assert store.clean() == []                      # the busy folder is skipped
    assert store.clean() == [folder / "tiny-Q8_0.gguf.partial"]
    assert [p.name for p in store.remove(f"{REPO}:Q4_0")] == ["tiny-Q4_0.gguf"]
    assert [r["precisions"] for r in store.list_models() if r["name"] == REPO] == [["Q8_0"]]
    store.remove(REPO)
    assert not (store.models_dir / "org").exists()


def cli(data, *args):
    env = {**os.environ, "GENIEX_DATADIR": str(data)}
    env.pop("GENIEX_LOG", None)
    proc = subprocess.run([sys.executable, "-m", "geniex", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    return proc


def cli_pull_and_remove(work):
    """The CLI's start, pull (a local file, checked against its header) and remove."""
    data, src = work / "cli-data", work / "x-Q4_1.gguf"
    src.write_bytes(make_gguf("x", "Q4_1"))
    assert cli(data, "pull", "org/x:Q4_1", "--local-path", src).stdout.startswith("Pulled org/x:Q4_1")
    assert "removed org/x:Q4_1" in cli(data, "remove", "org/x:Q4_1", "-y").stdout
    assert not list((data / "models").rglob("*.gguf"))


def server_answers(work):
    data = work / "serve-data"
    data.mkdir()
    with AppServer(data) as server:
        assert server.get("/health").status_code == 200
        assert DEMO in {m["id"] for m in server.get("/v1/models").json()["data"]}
        r = server.chat(chat_body("Say hello.", max_tokens=4))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    assert "Traceback" not in server.stderr, server.stderr


def main(work):
    work = Path(work)
    for check in (no_fcntl, locks_across_processes, store_in_process, cli_pull_and_remove, server_answers):
        check(work)
        print("ok", check.__name__, flush=True)
    print("all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
