"""How large a context a model may be opened with, checked before the library allocates.

llama.cpp allocates the whole KV cache when a context is made: a request for
``nctx: 131072`` on a small model took 2.9 GB, and ``nctx: 2147483648`` spent 38 s
before failing. Two limits, both from the GGUF header (milliseconds, nothing loaded):

- the model's trained context ``{arch}.context_length``: a larger context is refused
  when it was asked for, and the default is cut down to it (tiny test models train
  on 512 tokens while the default is 4096);
- a memory budget for the KV cache (``geniex serve --memory-budget``, env
  ``GENIEX_MEMORY_BUDGET``; default half of the machine's memory), estimated as
  llama.cpp sizes an f16 cache: ``nctx x layers x (K + V width) x 2 bytes``.

``open_session`` calls :func:`checked`; the server also calls :func:`context_size` on
a request before it leases a model, to answer a 400 naming ``nctx``.
"""
import dataclasses
import logging
import os
import re
from functools import lru_cache

from geniex.errors import ModelLoadError, UsageError
from geniex.llama.gguf_file import read_header

log = logging.getLogger(__name__)

BUDGET_ENV = "GENIEX_MEMORY_BUDGET"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text, what="--memory-budget"):
    """``"8G"``, ``"512M"``, ``"64K"``, ``"1048576"`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(text), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"{what} {text!r}: expected a size like 512M, 8G or a number of bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def physical_memory():
    """Bytes of RAM, or None when the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_budget():
    """``GENIEX_MEMORY_BUDGET`` if set, else half the machine's memory (None: no budget)."""
    raw = os.environ.get(BUDGET_ENV)
    if raw:
        return parse_size(raw, BUDGET_ENV)
    ram = physical_memory()
    return ram // 2 if ram else None


@lru_cache(maxsize=32)
def _header(path, _mtime_ns, _size):      # the file's version is part of the cache key
    return read_header(path)


def header_of(path):
    """The GGUF header of ``path``, read once per version of the file."""
    try:
        st = os.stat(path)
    except OSError:
        return read_header(path)         # says in one line what is wrong with the path
    return _header(str(path), st.st_mtime_ns, st.st_size)


def _per_layer(value, n_layer):
    if isinstance(value, list):
        return [int(v) for v in value][:n_layer] or [0]
    return [int(value or 0)] * max(n_layer, 1)


def kv_bytes_per_token(header):
    """Bytes of f16 K and V cache one context position costs (an upper bound for
    sliding-window and recurrent layers, which keep less)."""
    n_layer = int(header.arch_key("block_count") or 1)
    n_embd = int(header.arch_key("embedding_length") or 0)
    n_head = _per_layer(header.arch_key("attention.head_count") or 1, n_layer)
    n_head_kv = _per_layer(header.arch_key("attention.head_count_kv") or header.arch_key("attention.head_count") or 1,
                           n_layer)
    head = n_embd // max(max(n_head), 1)
    k = int(header.arch_key("attention.key_length") or head)
    v = int(header.arch_key("attention.value_length") or head)
    return sum(h * (k + v) for h in n_head_kv) * 2


def trained_context(header):
    """``{arch}.context_length`` of the header, or None if it does not say."""
    try:
        value = int(header.arch_key("context_length") or 0)
    except (TypeError, ValueError):
        return None
    return value or None


def context_size(model, nctx, explicit=True, budget=None, field="--nctx", slots=1, reader=False):
    """The context size to open ``model`` (a ResolvedModel) with.

    ``explicit``: the caller asked for ``nctx`` (a flag or request field), so more than
    the trained context is an error; a default is cut down to it instead. Raises
    UsageError naming ``field`` when ``nctx`` is beyond the trained context or its KV
    cache would exceed ``budget`` bytes (default :func:`default_budget`): one of
    ``nctx`` tokens per slot (``geniex serve --parallel``), and with ``reader`` another
    F16 one per slot that prompts are read in (``--prompt-kv f16``).
    """
    if nctx is None or nctx < 1:
        raise UsageError(f"{field} must be a positive number of tokens (got {nctx})")
    if getattr(model, "runtime", "llama_cpp") != "llama_cpp":
        return nctx                      # open_session refuses other runtimes with its own message
    try:
        header = header_of(model.path)
    except (OSError, ModelLoadError):
        return nctx                      # open_session reports the unreadable file
    trained = trained_context(header)
    if trained and nctx > trained:
        if explicit:
            raise UsageError(f"{field} {nctx} is more than {model.name} was trained for "
                             f"({trained} tokens); use at most {trained}")
        log.info("context cut from %d to %s's trained %d tokens", nctx, model.name, trained)
        nctx = trained
    budget = default_budget() if budget is None else budget
    per_token = kv_bytes_per_token(header) * (2 if reader else 1)
    slots = max(1, slots)
    if budget and per_token and nctx * per_token * slots > budget:
        fits = budget // (per_token * slots)
        each = f" for each of {slots} slots (geniex serve --parallel)" if slots > 1 else ""
        raise UsageError(f"{field} {nctx}{each} needs about {nctx * per_token * slots / 2**20:,.0f} MiB of KV "
                         f"cache, more than the memory budget of {budget / 2**20:,.0f} MiB ({BUDGET_ENV} or "
                         f"`geniex serve --memory-budget`); use at most {fits}"
                         f"{' or fewer slots' if slots > 1 else ''}{' (or --prompt-kv none)' if reader else ''}")
    return nctx


def checked(model, options, explicit=False, budget=None):
    """``options`` (LoadOptions) with ``nctx`` passed through :func:`context_size`
    (``open_session`` calls it on every model it opens)."""
    nctx = context_size(model, options.nctx, explicit=explicit, budget=budget, slots=options.parallel,
                        reader=options.prompt_kv == "f16")
    return options if nctx == options.nctx else dataclasses.replace(options, nctx=nctx)
