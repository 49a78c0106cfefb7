"""Find, load and check the prebuilt llama.cpp shared library.

Search order (the first that exists wins):
1. ``GENIEX_LLAMA_LIB``: the llama library file, or the folder of an unpacked llama.cpp
   release (``llama.dll`` / ``libllama.so`` / ``libllama.dylib`` and its ggml siblings);
2. ``lib/`` at the top of the project checkout (or ``$GENIEX_LIB_DIR``): a user-supplied
   llama.cpp build such as a Snapdragon build with the Hexagon backend;
3. the shared object inside the ``xllamacpp`` wheel (found without importing it), on the
   platforms where that wheel exports the C API (Linux x86_64/aarch64, macOS arm64).

Official llama.cpp release archives split the API across files: ``llama`` (the
``llama_*`` functions), ``ggml`` (the backend registry, ``ggml_backend_load_all*``) and
``ggml-base`` (devices, tensors), with backends (``ggml-cpu-*``, ``ggml-hexagon``,
``ggml-opencl`` ...) loaded at run time. On Windows a function can only be found in the
DLL that exports it, so every declared function is resolved from the first of these
files that exports it, and the backends are loaded from the library's own folder.

The library is loaded once per process. Before any function is used, the struct
layouts are checked against build b11549 by probing the library's default params;
a mismatch is refused with a message naming the file and the expected build.
"""
import collections
import contextlib
import ctypes
import importlib.util
import logging
import os
import platform
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from geniex.errors import LibraryError, shown
from geniex.llama import api

EXPECTED_BUILD = 11549
WHEEL = "xllamacpp==2026.10.11549"
WHEEL_SOURCE = "xllamacpp wheel"
RELEASES = f"https://github.com/ggml-org/llama.cpp/releases/tag/b{EXPECTED_BUILD}"
# The files of a split llama.cpp build, in the order symbols are looked up. Stems only:
# the platform adds prefix and suffix (``llama.dll``, ``libllama.so``, ``libllama.dylib``).
SPLIT_STEMS = ("llama", "ggml", "ggml-base")

_native_log = logging.getLogger("geniex.llama.cpp")
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}

_lock = threading.Lock()
_loaded = None
# The last warnings/errors llama.cpp logged, kept even when its log is hidden, so that a
# failed load can say *why* in one line instead of "see the log".
recent_problems = collections.deque(maxlen=8)


def _platform_key():
    if sys.platform == "win32":
        return "win32"
    if sys.platform == "darwin":
        return "darwin"
    return "linux"


def file_names(stem, key=None):
    """Names a split-build file may have here: ``llama`` -> ``llama.dll`` on Windows,
    ``libllama.so`` (then versioned ``libllama.so.*``) on Linux, ``libllama.dylib``
    (then ``libllama.*.dylib``) on macOS. Glob patterns for the versioned forms."""
    key = key or _platform_key()
    if key == "win32":
        return [f"{stem}.dll"]
    if key == "darwin":
        return [f"lib{stem}.dylib", f"lib{stem}.*.dylib"]
    return [f"lib{stem}.so", f"lib{stem}.so.*"]


def _find_in(folder, stem):
    for pattern in file_names(stem):
        hits = sorted(folder.glob(pattern)) if "*" in pattern else [folder / pattern]
        for hit in hits:
            if hit.is_file():
                return hit
    return None


@dataclass
class LoadedFile:
    """One shared library file geniex opened, and the declared functions bound from it."""

    path: Path
    handle: object
    functions: list = field(default_factory=list)


class Library:
    """A loaded, checked library: every declared C function as an attribute.

    ``files`` are the opened files in lookup order (the llama library first); each
    function is bound from the first file that exports it (:func:`resolve`).
    """

    def __init__(self, files, source):
        self.files = files
        self.path = files[0].path
        self.source = source
        self.origin = {}            # function name -> Path of the file it was bound from
        self._missing = {}
        for name, (restype, argtypes) in api.FUNCTIONS.items():
            self._bind(name, name, restype, argtypes, required=True)
        for name, (restype, argtypes) in api.OPTIONAL_FUNCTIONS.items():
            self._bind(name, name, restype, argtypes)
        for name, (symbol, restype, argtypes) in api.MANGLED_FUNCTIONS.items():
            self._bind(name, symbol, restype, argtypes)

    def _bind(self, name, symbol, restype, argtypes, required=False):
        found = resolve(self.files, symbol)
        if found is None:
            if required:
                raise LibraryError(_lacks(self.files, symbol))
            self._missing[name] = symbol
            return
        loaded, fn = found
        fn.restype, fn.argtypes = restype, argtypes
        setattr(self, name, fn)
        self.origin[name] = loaded.path
        loaded.functions.append(name)

    def has(self, name):
        """Whether an optional function (e.g. the MTP staging API) is exported."""
        return name not in self._missing and hasattr(self, name)

    def require(self, *names, capability):
        """Raise a LibraryError naming ``capability`` if any function is missing."""
        missing = [n for n in names if not self.has(n)]
        if missing:
            raise LibraryError(
                f"the llama.cpp library at {self.path} lacks {capability} "
                f"(missing symbols: {', '.join(self._missing.get(n, n) for n in missing)})")

    def system_info(self):
        """llama.cpp's one-line description of the CPU features and backends it uses."""
        return (self.llama_print_system_info() or b"").decode("utf-8", "replace").strip()


def resolve(files, symbol):
    """``(LoadedFile, function)`` for the first of ``files`` that exports ``symbol``, or None.

    A Windows DLL gives out only what it exports itself, so a function of
    ``ggml-base.dll`` is not reachable through ``llama.dll``'s handle; looking in every
    file of the build, in order, finds each function where it lives on every platform.
    """
    for loaded in files:
        try:
            return loaded, getattr(loaded.handle, symbol)
        except AttributeError:
            continue
    return None


def _lacks(files, symbol):
    where = ", ".join(str(f.path) for f in files)
    return (f"the llama.cpp library at {files[0].path} is not build b{EXPECTED_BUILD}: "
            f"{symbol} is exported by none of {where}; {get_library_hint()}")


def _wheel_files():
    try:
        spec = importlib.util.find_spec("xllamacpp")
    except (ImportError, ValueError):
        return []
    if not spec or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0])
    return sorted(folder.glob("xllamacpp*.so")) + sorted(folder.glob("xllamacpp*.pyd"))


def candidates():
    """Where we look for the library, in order: (source label, path)."""
    found = []
    env = os.environ.get("GENIEX_LLAMA_LIB")
    if env:
        path = Path(env).expanduser()
        if path.is_dir():
            path = _find_in(path, "llama") or path / file_names("llama")[0]
        found.append(("GENIEX_LLAMA_LIB", path))
    if os.environ.get("GENIEX_LIB_DIR"):
        lib_dirs = [Path(os.environ["GENIEX_LIB_DIR"]).expanduser()]
    else:
        # The checkout's lib/ (editable installs, running from the source tree), then ./lib.
        lib_dirs = [Path(__file__).resolve().parents[2] / "lib", Path.cwd() / "lib"]
    for lib_dir in dict.fromkeys(lib_dirs):
        found.append(("lib/", _find_in(lib_dir, "llama") or lib_dir / file_names("llama")[0]))
    for entry in _wheel_files():
        found.append((WHEEL_SOURCE, entry))
    return found


def get_library_hint(key=None, machine=None):
    """What to download or set to get a library on this platform (one paragraph)."""
    key = key or _platform_key()
    machine = (machine or platform.machine()).lower()
    arm = machine in ("arm64", "aarch64")
    tag = f"b{EXPECTED_BUILD}"
    if key == "win32":
        if arm:
            archive = (f"llama-{tag}-bin-win-cpu-arm64.zip (CPU), llama-{tag}-bin-win-opencl-adreno-arm64.zip "
                       f"(Adreno GPU) or a Hexagon (NPU) build such as llama-{tag}-bin-win-hexagon-arm64.zip")
        else:
            archive = f"llama-{tag}-bin-win-cpu-x64.zip (or the -vulkan-x64 / -cuda-*-x64 archive)"
        return (f"download {archive} from {RELEASES}, unpack it, and set GENIEX_LLAMA_LIB to the "
                f"folder that holds llama.dll (or copy that folder's files into lib/)")
    if key == "darwin":
        if arm:
            return (f"install it with: pip install {WHEEL}  (or download llama-{tag}-bin-macos-arm64.tar.gz "
                    f"from {RELEASES} and set GENIEX_LLAMA_LIB to the folder that holds libllama.dylib)")
        return (f"download llama-{tag}-bin-macos-x64.tar.gz from {RELEASES}, unpack it, and set "
                f"GENIEX_LLAMA_LIB to the folder that holds libllama.dylib")
    if machine in ("x86_64", "amd64", "aarch64", "arm64"):
        return f"install it with: pip install {WHEEL}  (or set GENIEX_LLAMA_LIB to a b{EXPECTED_BUILD} build's folder)"
    return (f"build llama.cpp {tag} as shared libraries and set GENIEX_LLAMA_LIB to the folder "
            f"that holds libllama.so")


def _open(path, folder_build):
    """Open ``path`` (and, for a folder build, its ggml siblings): the LoadedFiles in
    lookup order, the llama library first."""
    paths = [path]
    if folder_build:
        for stem in SPLIT_STEMS[1:]:
            sibling = _find_in(path.parent, stem)
            if sibling is not None and sibling != path:
                paths.append(sibling)
    if sys.platform == "win32" and folder_build:
        # Python 3.8+ no longer searches PATH or the current folder for a DLL's own
        # imports: name the build's folder so llama.dll finds ggml.dll beside it.
        _dll_dirs.append(os.add_dll_directory(str(path.parent)))
        # ggml loads its backends (ggml-cpu-*.dll, ggml-hexagon.dll) with a plain
        # LoadLibraryW, whose search ignores add_dll_directory but reads PATH: without
        # this, their own imports beside them (libomp140.*.dll, ...) would not be found.
        folder = str(path.parent)
        if folder not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
    files = []
    # Dependencies first (ggml-base, ggml, then llama), so each finds the others loaded.
    for p in reversed(paths):
        try:
            # RTLD_GLOBAL: backends loaded later resolve ggml symbols through these.
            handle = ctypes.CDLL(str(p), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
        except OSError as e:
            hint = ""
            if "libgomp" in str(e):
                hint = " (it needs the OpenMP runtime: on Debian/Ubuntu, apt-get install libgomp1)"
            elif sys.platform == "win32":
                hint = (" (keep every file of the release archive together in that folder; the CPU build "
                        "also needs the Microsoft Visual C++ runtime)")
            raise LibraryError(f"cannot load the llama.cpp library at {p}: {e}{hint}") from None
        files.insert(0, LoadedFile(p, handle))
    return files


_dll_dirs = []      # keeps os.add_dll_directory() registrations alive


def _check_abi(files, path):
    """Refuse a library whose params structs are not laid out as in build b11549."""
    where = f"the llama.cpp library at {path}"
    for sym in list(api.FUNCTIONS):
        if resolve(files, sym) is None:
            raise LibraryError(_lacks(files, sym))
    _, probe_m = resolve(files, "llama_model_default_params")
    _, probe_c = resolve(files, "llama_context_default_params")
    probe_m.restype, probe_m.argtypes = api.RawParams, []
    probe_c.restype, probe_c.argtypes = api.RawParams, []
    m = api.llama_model_params.from_buffer_copy(bytes(probe_m().raw)[:ctypes.sizeof(api.llama_model_params)])
    c = api.llama_context_params.from_buffer_copy(bytes(probe_c().raw)[:ctypes.sizeof(api.llama_context_params)])
    expected = [
        (m.n_gpu_layers, -1), (m.split_mode, 1), (m.load_mode, -1), (m.lazy_mode, 1),
        (m.use_extra_bufts, True), (m.load_mtp, False), (m.vocab_only, False),
        (c.n_ctx, 512), (c.n_batch, 2048), (c.n_ubatch, 512), (c.n_seq_max, 1),
        (c.n_outputs_max_per_seq, 1), (c.ctx_type, 0), (c.type_k, 1), (c.type_v, 1),
        (c.offload_kqv, True), (c.no_perf, True), (c.op_offload, True), (c.swa_full, True),
        (c.kv_unified, False), (c.ctx_other, None), (c.samplers, None),
    ]
    if any(got != want for got, want in expected):
        raise LibraryError(f"{where} has a different ABI from build b{EXPECTED_BUILD} "
                           f"(its default params are laid out differently); refusing to run with "
                           f"mis-laid structs. {get_library_hint()}")


@api.ggml_log_callback
def _log_bridge(level, text, _user):
    # Called from C for every llama.cpp / ggml log line. Keep it cheap when silent.
    if level in (3, 4):
        recent_problems.append((text or b"").decode("utf-8", "replace").strip())
    if not _native_log.isEnabledFor(_LEVELS.get(level, logging.DEBUG)):
        return
    msg = (text or b"").decode("utf-8", "replace").rstrip("\n")
    if msg:
        _native_log.log(_LEVELS.get(level, logging.DEBUG), msg)


@contextlib.contextmanager
def native_stderr():
    """Route what the library writes straight to stderr (a few MTP code paths print
    with fprintf instead of the log callback) into the ``geniex.llama.cpp`` logger, so
    the CLI's output stays clean unless ``--log`` asks for it. Only while that log is
    silent: otherwise our own log handler (also on fd 2) would be swallowed too."""
    if _native_log.isEnabledFor(logging.CRITICAL):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode("utf-8", "replace").splitlines():
                if line.strip():
                    _native_log.debug(line)


def last_problem(default="see --log info for llama.cpp's messages"):
    """The most recent warning/error line llama.cpp logged (cleared on read), passing
    over its closing "failed to load model" for the line that says why; escaped, since
    it may quote names from the model file."""
    lines = [line for line in recent_problems if line]
    specific = [line for line in lines if not line.endswith("failed to load model")]
    recent_problems.clear()
    return shown((specific or lines or [default])[-1], limit=300)


def load():
    """Load (once) and return the checked :class:`Library`; raises LibraryError."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        tried = []
        for source, path in candidates():
            if not path.is_file():
                if source == "GENIEX_LLAMA_LIB":
                    raise LibraryError(f"GENIEX_LLAMA_LIB names {os.environ['GENIEX_LLAMA_LIB']}, but "
                                       f"{path} does not exist; {get_library_hint()}")
                tried.append(str(path))
                continue
            folder_build = source != WHEEL_SOURCE
            files = _open(path, folder_build)
            _check_abi(files, path)
            lib = Library(files, source)
            lib.llama_log_set(_log_bridge, None)
            if folder_build:
                _load_backends(lib, path.parent)
            lib.llama_backend_init()
            _loaded = lib
            return lib
        raise LibraryError(f"no llama.cpp library (build b{EXPECTED_BUILD}) found; looked for "
                           + ", ".join(tried) + f". To get one: {get_library_hint()}")


def _load_backends(lib, folder):
    """Load the backends a split build keeps in separate files (ggml-cpu-*, ggml-hexagon,
    ggml-opencl, ...) from the library's own folder. ``ggml_backend_load_all`` alone would
    look beside the *executable* (python), which is not where a release was unpacked."""
    if lib.has("ggml_backend_load_all_from_path"):
        lib.ggml_backend_load_all_from_path(str(folder).encode("utf-8"))
    elif lib.has("ggml_backend_load_all"):
        lib.ggml_backend_load_all()
