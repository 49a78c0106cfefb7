"""Running where GenieX users are (issue 13): a user's own split llama.cpp build, the
first run with no library at all, no POSIX-only modules (``fcntl``), consoles that
cannot encode everything, each platform's data dir, and the CLI's global flags.

What cannot exist on this Linux machine (a Windows DLL, a Hexagon NPU) is simulated as
narrowly as possible and each test says how; everything else is the real library, the
real CLI as a subprocess and the real server.
"""
import ast
import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakehub import make_gguf
from geniex import config
from geniex.errors import LibraryError
from geniex.llama import api, devices, library
from geniex.store.locking import Busy, file_lock

ROOT = Path(__file__).resolve().parents[2]


def _wheel_so():
    files = library._wheel_files()
    if not files:
        pytest.fail("the xllamacpp wheel's library is needed for these tests (pip install xllamacpp)")
    return files[0]


def _run(args, env=None, python_flags=(), timeout=300):
    full = {k: v for k, v in os.environ.items() if not k.startswith("GENIEX_")}
    full.update(env or {})
    return subprocess.run([sys.executable, *python_flags, *args], capture_output=True, text=True,
                          env=full, cwd=ROOT, timeout=timeout)


# -- symbols resolved across the files of a split build -----------------------------------

# Which file of an official llama.cpp b11549 release exports which of our functions:
# llama_* live in llama.dll; the backend registry (ggml-backend-reg.cpp) in ggml.dll;
# devices and backend objects (ggml-backend.cpp) in ggml-base.dll.
GGML_FILE = {"ggml_backend_dev_count", "ggml_backend_dev_get", "ggml_backend_load_all",
             "ggml_backend_load_all_from_path", "ggml_backend_reg_count", "ggml_backend_reg_get"}


class ExportView:
    """The real library, seen through one file's export table: only ``names`` are
    reachable, as through a Windows DLL handle; every call goes to real code."""

    def __init__(self, cdll, names):
        self._cdll, self._names = cdll, set(names)

    def __getattr__(self, symbol):
        if symbol not in self._names:
            raise AttributeError(symbol)
        return getattr(self._cdll, symbol)


def test_each_function_is_bound_from_the_file_that_exports_it(tmp_path):
    """A Windows DLL split (llama.dll / ggml.dll / ggml-base.dll) cannot be loaded on
    Linux, and copies of one shared object each export everything. So this test gives
    the real library three *export views* with disjoint export sets, as the release's
    three DLLs have: the resolver has to find each function in the one view that
    exports it, and the calls (ABI check, device list) run the real library."""
    real = ctypes.CDLL(str(_wheel_so()), mode=ctypes.RTLD_GLOBAL)
    symbols = set(api.FUNCTIONS) | set(api.OPTIONAL_FUNCTIONS) | {s for s, _, _ in api.MANGLED_FUNCTIONS.values()}
    llama_syms = {s for s in symbols if not s.startswith("ggml_")}
    ggml_syms = symbols & GGML_FILE
    base_syms = {s for s in symbols if s.startswith("ggml_")} - GGML_FILE
    files = [library.LoadedFile(tmp_path / "llama.dll", ExportView(real, llama_syms)),
             library.LoadedFile(tmp_path / "ggml.dll", ExportView(real, ggml_syms)),
             library.LoadedFile(tmp_path / "ggml-base.dll", ExportView(real, base_syms))]
    library._check_abi(files, files[0].path)
    lib = library.Library(files, "GENIEX_LLAMA_LIB")
    assert lib.origin["llama_decode"].name == "llama.dll"
    assert lib.origin["ggml_backend_dev_count"].name == "ggml.dll"
    assert lib.origin["ggml_backend_dev_name"].name == "ggml-base.dll"
    assert lib.origin["ggml_backend_load_all_from_path"].name == "ggml.dll"
    assert {f.path.name: len(f.functions) > 0 for f in files} == {"llama.dll": True, "ggml.dll": True, "ggml-base.dll": True}
    # Real calls through the functions found in different files.
    found = devices.available(lib)
    assert any(d.is_cpu for d in found)
    rep = devices.report(lib)
    assert [b["name"] for b in rep["backends"]] == ["CPU"]
    # A function no file exports is a clear refusal naming every file searched.
    files[0] = library.LoadedFile(files[0].path, ExportView(real, llama_syms - {"llama_decode"}))
    with pytest.raises(LibraryError) as e:
        library._check_abi(files, files[0].path)
    assert "llama_decode" in str(e.value) and "ggml-base.dll" in str(e.value) and "b11549" in str(e.value)


def test_windows_loading_order_and_dll_search(tmp_path, monkeypatch):
    """The Windows branch of the loader, which cannot run here: ``sys.platform``,
    ``os.add_dll_directory`` and ``ctypes.CDLL`` are stand-ins that record what the
    loader does with a folder laid out like ``llama-b11549-bin-win-cpu-arm64.zip``."""
    for name in ("llama.dll", "ggml.dll", "ggml-base.dll", "ggml-cpu.dll", "libomp140.aarch64.dll"):
        (tmp_path / name).write_bytes(b"MZ")
    calls = []
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(os, "add_dll_directory", lambda d: calls.append(("add_dll_directory", d)) or d,
                        raising=False)
    monkeypatch.setattr(ctypes, "CDLL", lambda p, mode=0: calls.append(("CDLL", Path(p).name)) or object())
    monkeypatch.setenv("PATH", "C:\\Windows")
    monkeypatch.setenv("GENIEX_LLAMA_LIB", str(tmp_path))
    monkeypatch.setattr(library, "_dll_dirs", [])
    (source, path), = [c for c in library.candidates() if c[0] == "GENIEX_LLAMA_LIB"]
    assert path == tmp_path / "llama.dll"
    files = library._open(path, folder_build=True)
    # The folder is made searchable first, then dependencies load before llama.dll.
    assert calls == [("add_dll_directory", str(tmp_path)), ("CDLL", "ggml-base.dll"),
                     ("CDLL", "ggml.dll"), ("CDLL", "llama.dll")]
    assert [f.path.name for f in files] == ["llama.dll", "ggml.dll", "ggml-base.dll"]
    assert os.environ["PATH"].split(os.pathsep)[0] == str(tmp_path)


@pytest.fixture(scope="module")
def site_without_wheel(tmp_path_factory):
    """A copy of this environment's site-packages *as links*, minus xllamacpp: with
    ``python -S`` and this on PYTHONPATH, Python sees every package but the wheel,
    exactly as on Windows where the wheel is not installed. No geniex code knows."""
    import site
    view = tmp_path_factory.mktemp("site-without-xllamacpp")
    for sp in site.getsitepackages():
        for entry in Path(sp).iterdir():
            if entry.name.lower().startswith("xllamacpp") or (view / entry.name).exists():
                continue
            (view / entry.name).symlink_to(entry)
    return view


@pytest.fixture(scope="module")
def release_folder(tmp_path_factory):
    """A folder laid out like an unpacked Linux release (libllama.so, libggml.so,
    libggml-base.so), each name a symlink to the wheel's one library. Symlinks, not
    copies: the dynamic loader maps one file once, whereas three copies would put three
    sets of ggml's global state in one process and corrupt its heap at exit (tried)."""
    folder = tmp_path_factory.mktemp("llama-b11549-bin-ubuntu-x64")
    for name in ("libllama.so", "libggml.so", "libggml-base.so"):
        (folder / name).symlink_to(_wheel_so())
    return folder


@pytest.fixture
def no_wheel(site_without_wheel, release_folder, tmp_path):
    """Environment of a machine without the bundled library whose user set
    GENIEX_LLAMA_LIB to a release folder (run Python with ``-S``)."""
    return {"PYTHONPATH": os.pathsep.join([str(ROOT), str(site_without_wheel)]),
            "GENIEX_LIB_DIR": str(tmp_path / "empty-lib"), "GENIEX_DATADIR": str(tmp_path / "data"),
            "GENIEX_LLAMA_LIB": str(release_folder)}


def test_library_folder_via_env_loads_every_file_and_reports_them(no_wheel):
    proc = _run(["-m", "geniex", "devices", "--format", "json"], env=no_wheel, python_flags=["-S"])
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["found_via"] == "GENIEX_LLAMA_LIB"
    assert [Path(f["path"]).name for f in rep["files"]] == ["libllama.so", "libggml.so", "libggml-base.so"]
    assert rep["files"][0]["functions"] == len(api.FUNCTIONS) + sum(
        1 for n in [*api.OPTIONAL_FUNCTIONS, *api.MANGLED_FUNCTIONS] if n not in rep["missing_optional"])
    assert any(d["kind"] == "cpu" and d["backend"] == "CPU" for d in rep["devices"])
    text = _run(["-m", "geniex", "devices"], env=no_wheel, python_flags=["-S"]).stdout
    assert "libggml-base.so" in text and "no NPU (Hexagon HTP*) device" in text


def test_infer_and_serve_with_a_library_folder_and_no_wheel(no_wheel, tmp_path, monkeypatch):
    # Any model does (the library is the point): a tiny generated one, whose load costs a
    # fraction of the demo model's in each of the two processes.
    import tiny_gemma4
    from serverproc import Server, chat_body
    model = tiny_gemma4.write_target(tmp_path / "tiny.gguf")
    proc = _run(["-m", "geniex", "infer", str(model), "-p", "Say hello.", "--max-tokens", "6", "--seed", "1"],
                env=no_wheel, python_flags=["-S"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "Traceback" not in proc.stderr
    # serverproc starts sys.executable: make that "python -S" for this test.
    wrapper = tmp_path / "python-S"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(wrapper))
    with Server(tmp_path / "data", "--allow-paths", env=no_wheel) as server:
        r = server.chat(chat_body("Say hello.", model=str(model), max_tokens=4))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1


# -- the first run with no library at all ------------------------------------------------

@pytest.mark.parametrize("verb", [["infer", "-p", "hi"], ["devices"], ["serve", "--host", "127.0.0.1:0"]])
def test_first_run_without_any_library_says_what_to_get(site_without_wheel, tmp_path, verb):
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(site_without_wheel)]),
           "GENIEX_LIB_DIR": str(tmp_path), "GENIEX_DATADIR": str(tmp_path / "data")}
    check = _run(["-c", "import importlib.util; print(importlib.util.find_spec('xllamacpp'))"],
                 env=env, python_flags=["-S"])
    assert check.stdout.strip() == "None"
    proc = _run(["-m", "geniex", *verb], env=env, python_flags=["-S"], timeout=120)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: no llama.cpp library (build b11549) found"), lines
    assert "pip install xllamacpp==2026.10.11549" in lines[0]     # what Linux x86_64 is told


def test_the_message_names_each_platforms_download():
    win_arm = library.get_library_hint("win32", "ARM64")
    assert "llama-b11549-bin-win-cpu-arm64.zip" in win_arm and "hexagon" in win_arm
    assert "GENIEX_LLAMA_LIB" in win_arm and "llama.dll" in win_arm and "lib/" in win_arm
    win_x64 = library.get_library_hint("win32", "AMD64")
    assert "llama-b11549-bin-win-cpu-x64.zip" in win_x64 and "pip install" not in win_x64
    assert "releases/tag/b11549" in win_x64
    mac = library.get_library_hint("darwin", "arm64")
    assert "pip install xllamacpp==2026.10.11549" in mac and "macos-arm64" in mac
    assert "libllama.so" in library.get_library_hint("linux", "riscv64")


def test_a_missing_env_library_is_one_clear_error(cli, tmp_path):
    proc = cli("devices", env={"GENIEX_LLAMA_LIB": str(tmp_path / "nowhere")})
    assert proc.returncode == 1 and "GENIEX_LLAMA_LIB names" in proc.stderr and "does not exist" in proc.stderr


# -- no POSIX-only modules --------------------------------------------------------------

POSIX_ONLY = {"fcntl", "termios", "tty", "pty", "pwd", "grp", "resource", "posix", "syslog", "crypt"}
PORTABLE_SIGNALS = {"SIGINT", "SIGTERM", "SIG_DFL", "SIG_IGN"}   # all defined on Windows too


def _guarded(node, parents):
    for parent in parents:
        if isinstance(parent, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in parent.handlers):
            return True
    return False


def test_no_module_imports_a_posix_only_module_unguarded_or_uses_other_signals():
    problems = []
    for path in sorted((ROOT / "geniex").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node

        def chain(n):
            while n in parents:
                n = parents[n]
                yield n
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            if set(names) & POSIX_ONLY and not _guarded(node, chain(node)):
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {names}")
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "signal"
                    and node.attr.startswith("SIG") and node.attr not in PORTABLE_SIGNALS):
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno} uses signal.{node.attr}")
    assert not problems, problems


NO_FCNTL = textwrap.dedent('''
    # Test shim: make `import fcntl` fail as it does on Windows.
    import sys
    class _NoFcntl:
        def find_spec(self, name, path=None, target=None):
            if name == "fcntl":
                raise ModuleNotFoundError("No module named 'fcntl' (hidden by the test, as on Windows)", name=name)
            return None
    sys.modules.pop("fcntl", None)
    sys.meta_path.insert(0, _NoFcntl())
''')


def test_store_cli_and_server_work_without_fcntl(tmp_path, calibration_cache):
    """The store's locks, the CLI and the server in a Python (and every process it starts:
    PYTHONPATH is inherited) that cannot import ``fcntl``: a ``sitecustomize`` shim raises
    ModuleNotFoundError for it, which is what Windows does. One process runs the checks of
    tests/platform/without_fcntl.py (locks across processes; the store's pull, remove and
    clean, each of which locks; the CLI's pull and remove; the server answering), with
    UserWarning an error. (This was a nested pytest run of store, CLI and server tests,
    whose start, fixtures and CLI runs cost most of its time.) Its default data dir starts
    with the suite's calibration cache, which the server's data dir is seeded from
    (serverproc.seed_calibration): a load with slots measures the demo model's verify
    costs where it finds none (2.5 s on one CPU), though nothing here drafts."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(NO_FCNTL, encoding="utf-8")
    env = {"PYTHONPATH": os.pathsep.join([str(shim), str(ROOT), str(ROOT / "tests" / "support")]),
           "GENIEX_DATADIR": str(tmp_path / "default-data")}
    (tmp_path / "default-data").mkdir()
    shutil.copyfile(calibration_cache, tmp_path / "default-data" / "calibration.json")
    probe = _run(["-c", "import geniex.store, geniex.cli, geniex.server.app\n"
                        "try:\n    import fcntl\nexcept ImportError:\n    print('no fcntl')"], env=env)
    assert probe.stdout.strip() == "no fcntl", probe.stderr
    assert "Warning" not in probe.stderr, probe.stderr
    work = tmp_path / "work"
    work.mkdir()
    proc = _run(["-W", "error::UserWarning", str(Path(__file__).with_name("without_fcntl.py")), work],
                env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["ok no_fcntl", "ok locks_across_processes", "ok store_in_process",
                                        "ok cli_pull_and_remove", "ok server_answers", "all checks passed"]


# -- locks ------------------------------------------------------------------------------

HOLD = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from geniex.store.locking import file_lock
    with file_lock(Path(sys.argv[1]), shared=sys.argv[2] == "shared"):
        print("held", flush=True)
        sys.stdin.readline()
''')


def test_locks_shared_and_exclusive_across_processes(tmp_path):
    path = tmp_path / "models" / "org" / "repo" / ".pull.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), "shared"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with file_lock(path, shared=True, blocking=False):
            pass                                     # readers share
        with pytest.raises(Busy):
            with file_lock(path, blocking=False):    # a writer must wait
                pass
    finally:
        holder.communicate("\n", timeout=30)
    with file_lock(path, blocking=False):
        pass                                         # free again once the reader is gone


# -- consoles, data dirs, global flags ---------------------------------------------------

def test_output_cannot_crash_on_a_console_that_cannot_encode_it(cli, tmp_path):
    data = tmp_path / "dätä-模型"
    proc = cli("list", env={"PYTHONIOENCODING": "ascii", "GENIEX_DATADIR": str(data)})
    assert proc.returncode == 0, proc.stderr
    assert "Models cached in" in proc.stdout and "d?t?-??" in proc.stdout


def test_data_dir_defaults_follow_each_platform(tmp_path):
    home = tmp_path
    assert config.default_data_dir("linux", {}, home) == home / ".cache" / "geniex"
    assert config.default_data_dir("linux", {"XDG_CACHE_HOME": str(tmp_path / "xdg")}, home) == tmp_path / "xdg" / "geniex"
    assert config.default_data_dir("linux", {"XDG_CACHE_HOME": "relative"}, home) == home / ".cache" / "geniex"
    assert config.default_data_dir("darwin", {}, home) == home / "Library" / "Caches" / "geniex"
    assert config.default_data_dir("win32", {"LOCALAPPDATA": str(tmp_path / "Local")}, home) == tmp_path / "Local" / "geniex"
    assert config.default_data_dir("win32", {}, home) == home / "AppData" / "Local" / "geniex"


# Two sockets of two cores with two hyper-threads each: processors 0-3 are the first
# thread of each core, 4-7 their siblings (the numbering Linux gives x86 machines).
CPUINFO = "\n\n".join(f"processor\t: {p}\nphysical id\t: {(p % 4) // 2}\ncore id\t\t: {p % 2}\n"
                      for p in range(8))


@pytest.mark.fast
def test_cores_are_counted_among_the_cpus_the_process_may_use():
    assert config.cores_in_cpuinfo(CPUINFO) == 4
    assert config.cores_in_cpuinfo(CPUINFO, {0, 4}) == 1       # one core's two hyper-threads
    assert config.cores_in_cpuinfo(CPUINFO, {0, 1, 5}) == 2
    assert config.cores_in_cpuinfo(CPUINFO, {0, 2}) == 2       # same core id, other socket
    assert config.cores_in_cpuinfo("processor\t: 0\nBogoMIPS\t: 48.00\n") == 0   # no core ids: caller falls back
    assert config.cores_in_cpuinfo("Processor\t: ARMv7 rev 4\ncore id\t: 0\n") == 0     # an old ARM kernel's layout


def test_a_process_limited_to_one_cpu_decodes_on_one_thread(demo_model, tmp_path):
    """``taskset -c 0 geniex infer`` (or a container's cpuset) gets one thread by default:
    two OpenMP threads on one CPU spin at every barrier for the thread that cannot run."""
    if not hasattr(os, "sched_setaffinity"):     # macOS, Windows: every core is the process's
        assert config.physical_cores() >= 1
        return
    one_cpu = min(os.sched_getaffinity(0))
    env = {**os.environ, "GENIEX_DATADIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "geniex", "infer", demo_model, "-p", "Hi", "--max-tokens", "1",
                           "--verbose"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
                          preexec_fn=lambda: os.sched_setaffinity(0, {one_cpu}))
    assert proc.returncode == 0, proc.stderr
    assert "threads 1/1;" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["--version"], ["list", "--version"], ["pull", "--version"],
                                  ["infer", "-p", "x", "--version"]])
def test_version_anywhere_on_the_line_reports_the_library(args, capsys):
    # Where --version may stand is the parsing in geniex.cli.main, run in process (as an
    # embedding program would, tests/cli/test_cli_main.py); `geniex --version` as a
    # process is tests/cli/test_infer_cli.py::test_version_names_the_library.
    from geniex.cli import main
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("geniex ") and "llama.cpp library:" in out and "devices:" in out


def test_global_flags_after_the_verb(cli, tmp_path):
    proc = cli("list", "--data-dir", str(tmp_path / "elsewhere"), "--log", "error", "-v")
    assert proc.returncode == 0 and str(tmp_path / "elsewhere") in proc.stdout


# -- pull: explicit precision vs. the file, and re-pulls -----------------------------------

def test_pull_local_checks_the_precision_against_the_gguf(cli, tmp_path, data_dir):
    from geniex.store import Store
    src = tmp_path / "x-Q4_1.gguf"
    src.write_bytes(make_gguf("x", "Q4_1"))          # a small GGUF whose header says Q4_1
    bad = cli("pull", "org/x:Q8_0", "--local-path", src)
    assert bad.returncode == 1
    assert "is Q4_1 according to its GGUF header" in bad.stderr and "org/x:Q4_1" in bad.stderr
    # Nothing half-registered (what `geniex list` would print, read in process).
    assert not [row for row in Store(data_dir).list_models() if row["name"].startswith("org/x")]
    assert not any(data_dir.rglob("x-Q4_1.gguf"))
    first = cli("pull", "org/x:Q4_1", "--local-path", src)
    assert first.returncode == 0 and first.stdout.startswith("Pulled org/x:Q4_1")
    again = cli("pull", "org/x:Q4_1", "--local-path", src)
    assert again.returncode == 0 and again.stdout.startswith("org/x:Q4_1 is already present"), again.stdout
    assert "already present in the store" in again.stderr
    by_name = cli("pull", "org/x:Q4_1")
    assert by_name.returncode == 0 and by_name.stdout.startswith("org/x:Q4_1 is already present")


def test_remove_says_why_when_a_file_cannot_be_deleted(cli, tmp_path, data_dir):
    """Windows refuses to delete a file another process has open (a model being served).
    Here the same PermissionError comes from an immutable file (``chattr +i``), which
    even root cannot delete; skipped where the filesystem or user cannot set it. (A small
    GGUF of its own: the stored file must not be a hard link to anything else.)"""
    src = tmp_path / "y-Q4_1.gguf"
    src.write_bytes(make_gguf("y", "Q4_1"))
    assert cli("pull", "org/y:Q4_1", "--local-path", src).returncode == 0
    stored = next((data_dir / "models").rglob("y-Q4_1.gguf"))
    if subprocess.run(["chattr", "+i", str(stored)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a file undeletable here (chattr +i)")
    try:
        proc = cli("remove", "org/y:Q4_1", input="y\n")
        assert proc.returncode == 1
        assert "could not be deleted: another process has it open" in proc.stderr and "geniex clean" in proc.stderr
        # Still held: clean says so and carries on instead of failing.
        busy = cli("clean")
        assert busy.returncode == 0 and "another process has it open" in busy.stderr
    finally:
        subprocess.run(["chattr", "-i", str(stored)])
    assert cli("clean").returncode == 0
    assert not stored.exists()


# -- install markers ---------------------------------------------------------------------

def test_setup_cfg_markers_give_the_bundled_library_only_where_its_wheel_has_the_c_api():
    """Offline half of tools/release/check_platforms.py (CI runs the whole resolver): the
    ``xllamacpp`` requirement's marker, evaluated for each target's environment."""
    import configparser
    from packaging.requirements import Requirement
    from shared_fixtures import load_tool
    check_platforms = load_tool("release/check_platforms.py")
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    reqs = [Requirement(line) for line in cfg["options"]["install_requires"].splitlines()
            if line.strip() and not line.strip().startswith("#")]
    (lib,) = [r for r in reqs if r.name == "xllamacpp"]
    assert str(lib.specifier) == "==2026.10.11549"
    got = {p: lib.marker.evaluate(check_platforms.marker_env(p, "3.12")) for p in check_platforms.PLATFORMS}
    assert got == {p: want for p, (_, _, want) in check_platforms.PLATFORMS.items()}
    assert got == {"win_arm64": False, "win_amd64": False, "macos_arm64": True,
                   "linux_x86_64": True, "linux_aarch64": True}
    assert any(r.name == "filelock" for r in reqs)


def test_hub_repull_without_precision_says_already_present(cli, tmp_path):
    """Two pulls from the fake hub (tests/support/fakehub.py) with no precision given, so the
    store cannot short-cut by name: the second fetches no file and says so."""
    from fakehub import FakeHub, make_gguf
    with FakeHub() as hub:
        hub.add_repo("org/Tiny-GGUF", {"tiny-Q8_0.gguf": make_gguf("tiny", "Q8_0", seed=1)})
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "GENIEX_HFTOKEN": "", "HF_TOKEN": ""}
        first = cli("pull", "org/Tiny-GGUF", env=env)
        assert first.returncode == 0 and first.stdout.startswith("Pulled org/Tiny-GGUF:Q8_0"), first.stderr
        fetched = len(hub.cdn_gets("org/Tiny-GGUF", "tiny-Q8_0.gguf"))
        assert fetched >= 1
        again = cli("pull", "org/Tiny-GGUF", env=env)
        assert again.returncode == 0 and again.stdout.startswith("org/Tiny-GGUF:Q8_0 is already present"), again.stdout
        assert len(hub.cdn_gets("org/Tiny-GGUF", "tiny-Q8_0.gguf")) == fetched
