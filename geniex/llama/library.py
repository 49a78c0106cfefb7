"""Find, load and check the prebuilt llama.cpp shared library.

Search order (the first that exists wins):
1. the file named by ``GENIEX_LLAMA_LIB``;
2. ``lib/`` at the top of the project checkout (or ``$GENIEX_LIB_DIR``): a user-supplied
   llama.cpp build such as a Snapdragon build with the Hexagon backend;
3. the shared object inside the ``xllamacpp`` wheel (found without importing it).

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
import sys
import tempfile
import threading
from pathlib import Path

from geniex.errors import LibraryError
from geniex.llama import api

EXPECTED_BUILD = 11549
WHEEL = "xllamacpp==2026.10.11549"
LIB_NAMES = {"linux": ["libllama.so"], "darwin": ["libllama.dylib"], "win32": ["llama.dll"]}

_native_log = logging.getLogger("geniex.llama.cpp")
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}

_lock = threading.Lock()
_loaded = None
# The last warnings/errors llama.cpp logged, kept even when its log is hidden, so that a
# failed load can say *why* in one line instead of "see the log".
recent_problems = collections.deque(maxlen=8)


class Library:
    """A loaded, checked library: every declared C function as an attribute."""

    def __init__(self, cdll, path, source):
        self.cdll = cdll
        self.path = path
        self.source = source
        self._missing = {}
        for name, (restype, argtypes) in api.FUNCTIONS.items():
            fn = getattr(cdll, name)
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)
        for name, (restype, argtypes) in api.OPTIONAL_FUNCTIONS.items():
            self._bind_optional(name, name, restype, argtypes)
        for name, (symbol, restype, argtypes) in api.MANGLED_FUNCTIONS.items():
            self._bind_optional(name, symbol, restype, argtypes)

    def _bind_optional(self, name, symbol, restype, argtypes):
        try:
            fn = getattr(self.cdll, symbol)
        except AttributeError:
            self._missing[name] = symbol
            return
        fn.restype, fn.argtypes = restype, argtypes
        setattr(self, name, fn)

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


def candidates():
    """Where we look for the library, in order: (source label, path)."""
    found = []
    env = os.environ.get("GENIEX_LLAMA_LIB")
    if env:
        found.append(("GENIEX_LLAMA_LIB", Path(env)))
    if os.environ.get("GENIEX_LIB_DIR"):
        lib_dirs = [Path(os.environ["GENIEX_LIB_DIR"])]
    else:
        # The checkout's lib/ (editable installs, running from the source tree), then ./lib.
        lib_dirs = [Path(__file__).resolve().parents[2] / "lib", Path.cwd() / "lib"]
    for lib_dir in dict.fromkeys(lib_dirs):
        for name in LIB_NAMES.get(sys.platform, LIB_NAMES["linux"]):
            found.append(("lib/", lib_dir / name))
    spec = importlib.util.find_spec("xllamacpp")
    if spec and spec.submodule_search_locations:
        for entry in Path(list(spec.submodule_search_locations)[0]).glob("xllamacpp*.so"):
            found.append((WHEEL.split("==")[0] + " wheel", entry))
        for entry in Path(list(spec.submodule_search_locations)[0]).glob("xllamacpp*.pyd"):
            found.append((WHEEL.split("==")[0] + " wheel", entry))
    return found


def _check_abi(cdll, path):
    """Refuse a library whose params structs are not laid out as in build b11549."""
    where = f"the llama.cpp library at {path}"
    for sym in list(api.FUNCTIONS):
        if not hasattr(cdll, sym):
            raise LibraryError(f"{where} is not build b{EXPECTED_BUILD}: it lacks {sym}; "
                               f"install {WHEEL} or put a b{EXPECTED_BUILD} build in lib/")
    probe_m = cdll.llama_model_default_params
    probe_m.restype, probe_m.argtypes = api.RawParams, []
    probe_c = cdll.llama_context_default_params
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
                           f"mis-laid structs. Install {WHEEL} or put a b{EXPECTED_BUILD} build in lib/")


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
    """The most recent warning/error line llama.cpp logged (cleared on read)."""
    msg = recent_problems[-1] if recent_problems else default
    recent_problems.clear()
    return msg


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
                    raise LibraryError(f"GENIEX_LLAMA_LIB names {path}, which does not exist")
                tried.append(str(path))
                continue
            try:
                # RTLD_GLOBAL: a lib/ build's ggml backends resolve ggml symbols through it.
                cdll = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise LibraryError(f"cannot load the llama.cpp library at {path}: {e}") from None
            _check_abi(cdll, path)
            lib = Library(cdll, path, source)
            lib.llama_log_set(_log_bridge, None)
            if source != WHEEL.split("==")[0] + " wheel" and lib.has("ggml_backend_load_all"):
                lib.ggml_backend_load_all()   # a user build may keep backends in separate files
            lib.llama_backend_init()
            _loaded = lib
            return lib
        raise LibraryError("no llama.cpp library found (looked in: " + ", ".join(tried) +
                           f"); install it with: pip install {WHEEL}")
