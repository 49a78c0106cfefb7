"""Owners of llama.cpp objects: Model, Vocab, Context, Batch.

Each wraps one C pointer, frees it exactly once (``close()`` or garbage collection),
and turns the library's NULL / error-code returns into exceptions with a reason.
"""
import ctypes
import logging
import threading
import time

import numpy as np

from geniex.errors import ContextLengthExceeded, GenieXError, ModelLoadError
from geniex.llama import api, cache_types, library
from geniex.llama.gguf_file import read_header

log = logging.getLogger("geniex.llama")


def _defaults(fn, struct):
    return struct.from_buffer_copy(bytes(fn().raw)[:ctypes.sizeof(struct)])


class Vocab:
    """Tokenizer view of a model (owned by the model, never freed on its own)."""

    def __init__(self, lib, ptr):
        self._lib, self.ptr = lib, ptr
        self.n_tokens = lib.llama_vocab_n_tokens(ptr)
        self.has_tokenizer = lib.llama_vocab_type(ptr) != api.LLAMA_VOCAB_TYPE_NONE
        self.bos = lib.llama_vocab_bos(ptr)
        self.eos = lib.llama_vocab_eos(ptr)
        self.add_bos = bool(lib.llama_vocab_get_add_bos(ptr))
        self.add_eos = bool(lib.llama_vocab_get_add_eos(ptr))
        # Fill-in-the-middle tokens (-1 where the vocabulary has none), for /infill.
        self.fim = {name: getattr(lib, f"llama_vocab_fim_{name}")(ptr)
                    for name in ("pre", "suf", "mid", "pad", "rep", "sep")}
        # End-of-generation ids, looked up once so the decode loop tests set membership.
        self.eog = frozenset(t for t in range(self.n_tokens) if lib.llama_vocab_is_eog(ptr, t))
        self._pieces = {}
        self._buf = ctypes.create_string_buffer(256)
        self._buf_lock = threading.Lock()    # a server's slots read pieces from their own threads

    def tokenize(self, text, add_special=False, parse_special=True):
        """Text -> token ids. ``add_special`` adds BOS where the model wants it."""
        if not self.has_tokenizer:    # llama.cpp would abort (sessions refuse such a model first)
            raise GenieXError("the model has no tokenizer (tokenizer.ggml.model 'none'): it cannot read text")
        data = text.encode("utf-8")
        cap = len(data) + 8
        while True:
            out = (api.llama_token * cap)()
            n = self._lib.llama_tokenize(self.ptr, data, len(data), out, cap, add_special, parse_special)
            if n >= 0:
                return list(out[:n])
            cap = -n

    def piece(self, token):
        """The bytes a token stands for (special tokens rendered), cached per id."""
        cached = self._pieces.get(token)
        if cached is None:
            with self._buf_lock:
                cached = self._piece(token)
            self._pieces[token] = cached
        return cached

    def _piece(self, token):
        n = self._lib.llama_token_to_piece(self.ptr, token, self._buf, len(self._buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self.ptr, token, buf, len(buf), 0, True)
            return buf.raw[:n]
        return self._buf.raw[:n]

    def text(self, token):
        """The token's entry in the vocabulary (as stored, e.g. with U+2581 for spaces)."""
        raw = self._lib.llama_vocab_get_text(self.ptr, token)
        return (raw or b"").decode("utf-8", "replace")

    def detokenize(self, tokens):
        """Token ids -> text (special tokens rendered)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def attr(self, token):
        """The token's ``enum llama_token_attr`` bits (``api.LLAMA_TOKEN_ATTR_*``)."""
        return self._lib.llama_vocab_get_attr(self.ptr, token)

    def tokenize_address(self):
        """The address of the library's ``llama_tokenize`` (declared in :mod:`geniex.llama.api`),
        for a C library that tokenizes this vocabulary itself (llguidance, given
        :attr:`ptr` as the vocabulary)."""
        return ctypes.cast(self._lib.llama_tokenize, ctypes.c_void_p).value


class Model:
    """A loaded GGUF model. Check the file with :func:`read_header` first (done here)."""

    def __init__(self, path, *, devices=None, n_gpu_layers=-1, load_mtp=False, header=None):
        self._lib = lib = library.load()
        self.path = path
        self.header = header or read_header(path)
        params = _defaults(lib.llama_model_default_params, api.llama_model_params)
        params.n_gpu_layers = n_gpu_layers
        params.load_mtp = load_mtp
        self._devices = None
        if devices is not None:
            from geniex.llama.devices import null_terminated
            self._devices = null_terminated(devices)   # must outlive the load call
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        library.recent_problems.clear()
        with library.native_stderr():
            self.ptr = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise ModelLoadError(f"llama.cpp could not load {path}: {library.last_problem()}")
        self.vocab = Vocab(lib, lib.llama_model_get_vocab(self.ptr))
        self.n_embd = lib.llama_model_n_embd(self.ptr)
        self.n_embd_out = lib.llama_model_n_embd_out(self.ptr)
        self.n_layer = lib.llama_model_n_layer(self.ptr)
        self.n_ctx_train = lib.llama_model_n_ctx_train(self.ptr)
        # Recurrent state can only be rolled back as far as the context keeps snapshots.
        self.recurrent = bool(lib.llama_model_is_recurrent(self.ptr) or lib.llama_model_is_hybrid(self.ptr))
        self.architecture = self.header.architecture

    def describe(self):
        """llama.cpp's short description, e.g. ``llama 135M Q4_1``."""
        buf = ctypes.create_string_buffer(256)
        self._lib.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    @property
    def size_bytes(self):
        return int(self._lib.llama_model_size(self.ptr))

    def chat_template(self):
        """The model's own chat template string, or None."""
        raw = self._lib.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", "replace") if raw else None

    @property
    def n_params(self):
        return int(self._lib.llama_model_n_params(self.ptr))

    @property
    def n_cls_out(self):
        """Outputs of a classifier head (a reranker's scores); 0 without one."""
        return int(self._lib.llama_model_n_cls_out(self.ptr))

    def n_layer_nextn(self):
        return self._lib.llama_model_n_layer_nextn(self.ptr)

    def close(self):
        """Free the model (idempotent). Contexts made from it must be closed first."""
        if getattr(self, "ptr", None):
            self._lib.llama_model_free(self.ptr)
            self.ptr = None

    __del__ = close


class Batch:
    """A reusable llama_batch over numpy arrays we own (no per-step allocation).

    ``n_embd > 0`` also allocates an embedding array: MTP draft rows carry a token and
    a hidden state at once, which ``llama_batch_init`` cannot provide.
    """

    def __init__(self, capacity, n_embd=0, seq=0):
        self.capacity = capacity
        self.tokens = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        self._seq0 = (ctypes.c_int32 * 1)(seq)      # every row's sequence (a server slot's)
        self._seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(*([self._seq0] * capacity))
        self.embd = np.zeros((capacity, n_embd), dtype=np.float32) if n_embd else None
        self.struct = api.llama_batch(
            0,
            self.tokens.ctypes.data_as(ctypes.POINTER(api.llama_token)),
            self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if n_embd else None,
            self.pos.ctypes.data_as(ctypes.POINTER(api.llama_pos)),
            self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            self._seq_ptrs,
            self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def fill(self, tokens, start_pos, all_logits=False):
        """Rows ``tokens`` at consecutive positions from ``start_pos``; logits on every
        row if ``all_logits``, else on the last row only."""
        n = len(tokens)
        if n > self.capacity:
            raise ValueError(f"batch of {n} rows exceeds capacity {self.capacity}")
        self.tokens[:n] = tokens
        self.pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.logits[:n] = 1 if all_logits else 0
        self.logits[n - 1] = 1
        self.struct.n_tokens = n
        return self


class Context:
    """An inference context (KV cache, logits) on a model.

    Sequence 0 unless told otherwise: a server with several slots gives each its own
    sequence (``n_seq_max`` > 1), and the library keeps each sequence's cells in a KV
    stream of its own (``kv_unified`` off), so a sequence's cells stay in position order
    whatever the others do (geniex.engine.batcher).

    ``type_k``/``type_v`` are the KV cache element types, as llama.cpp names them
    (``f16``, ``q8_0``, ... see :mod:`geniex.llama.cache_types`) or ggml type ids. None
    means: the ``other`` context's types when there is one (an MTP assistant reads the
    target's KV and must use its types), else the library's default (f16).
    """

    def __init__(self, model, *, n_ctx, n_batch=512, n_ubatch=32, n_threads=1, n_threads_batch=1,
                 ctx_type=api.LLAMA_CONTEXT_TYPE_DEFAULT, other=None, n_seq_max=1, n_rs_seq=0,
                 type_k=None, type_v=None, embeddings=False):
        self._lib = lib = model._lib
        self.model = model
        self.type_k, self.type_v = self._cache_types(model, other, type_k, type_v)
        params = _defaults(lib.llama_context_default_params, api.llama_context_params)
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = min(n_ubatch, n_batch)
        params.n_seq_max = n_seq_max
        # Recurrent-state snapshots per sequence: how many positions a hybrid/recurrent
        # model's KV can be rolled back by (0 = none; attention-only models ignore it).
        params.n_rs_seq = n_rs_seq
        params.n_threads = n_threads
        params.n_threads_batch = n_threads_batch
        params.ctx_type = ctx_type
        # Never turn flash attention off: with it off, multi-row batches sum attention in
        # another order than one-row decodes (docs/speculative.md, "Identical output").
        params.flash_attn_type = api.LLAMA_FLASH_ATTN_TYPE_AUTO
        # With AUTO and a quantized V cache the library turns flash attention on outright
        # (no device probe): "enabling flash_attn since it is required for quantized V cache".
        params.type_k, params.type_v = self.type_k, self.type_v
        params.ctx_other = other.ptr if other is not None else None
        # An embeddings context outputs pooled vectors (the model's pooling) instead of logits.
        params.embeddings = embeddings
        self.params = params
        library.recent_problems.clear()
        with library.native_stderr():
            self.ptr = lib.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise ModelLoadError(f"llama.cpp could not create a context for {model.path}: "
                                 f"{library.last_problem()}")
        self.other = other
        self.n_ctx = lib.llama_n_ctx(self.ptr)
        self.n_batch = lib.llama_n_batch(self.ptr)
        self.n_ubatch = lib.llama_n_ubatch(self.ptr)
        self.mem = lib.llama_get_memory(self.ptr)
        self.n_vocab = model.vocab.n_tokens
        self._views = {}
        self.decoded_any = False
        self.governor = None           # a ThreadGovernor, where the owner wants one

    @staticmethod
    def _cache_types(model, other, type_k, type_v):
        """Resolve and check the K/V cache types before the library sees them: an unknown
        name or a combination llama.cpp refuses becomes a GenieXError naming the fix."""
        resolved = []
        for which, given in (("k", type_k), ("v", type_v)):
            if given is None:
                given = getattr(other, f"type_{which}") if other is not None else cache_types.F16
            resolved.append(cache_types.parse(given))
        tk, tv = resolved
        if other is not None and (tk, tv) != (other.type_k, other.type_v):
            raise GenieXError(
                f"a context reading another context's KV cache must use its cache types "
                f"(K {cache_types.name_of(other.type_k)}, V {cache_types.name_of(other.type_v)}), "
                f"not K {cache_types.name_of(tk)}, V {cache_types.name_of(tv)}")
        # flash_attn=True: this class never turns it off (see flash_attn_type below).
        cache_types.check(tk, tv, header=model.header, flash_attn=True)
        return tk, tv

    def set_threads(self, n_threads, n_threads_batch):
        """Threads for one-row decodes and for multi-row batches from the next decode on
        (``llama_set_n_threads``; cheap, no reallocation)."""
        self._lib.llama_set_n_threads(self.ptr, n_threads, n_threads_batch)

    @property
    def threads(self):
        """(one-row decode threads, batch threads) as the library holds them."""
        return self._lib.llama_n_threads(self.ptr), self._lib.llama_n_threads_batch(self.ptr)

    def decode(self, batch):
        """Run one batch; raises ContextLengthExceeded when the KV cache has no room.
        With a :attr:`governor` (geniex.llama.threads), it hears of the decode's rows before
        and of its time after."""
        gov = self.governor
        t0 = 0.0
        if gov is not None:
            gov.before(batch.struct.n_tokens)
            t0 = time.perf_counter()
        rc = self._lib.llama_decode(self.ptr, batch.struct)
        if rc != 0:
            if rc == 1:
                raise ContextLengthExceeded(f"the context ({self.n_ctx} tokens) is full")
            raise GenieXError(f"llama_decode failed (code {rc}): {library.last_problem()}")
        self.decoded_any = True
        if gov is not None:
            gov.observe(batch.struct.n_tokens, time.perf_counter() - t0)

    def logits(self, i):
        """Row ``i`` of the last batch's output logits as a read-only numpy view.

        Views are cached by address: the library reuses its output buffer, so the hot
        loop does not build a new array object per token.
        """
        ptr = self._lib.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise GenieXError(f"no logits for batch row {i}: {library.last_problem()}")
        addr = ctypes.addressof(ptr.contents)
        view = self._views.get(addr)
        if view is None:
            view = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            view.flags.writeable = False
            if len(self._views) > 256:
                self._views.clear()
            self._views[addr] = view
        return view

    @property
    def pooling_type(self):
        """The context's pooling (api.LLAMA_POOLING_TYPE_*; the model's own by default)."""
        return int(self._lib.llama_pooling_type(self.ptr))

    def embedding(self, n, row=None):
        """A copy of the last decode's embedding: sequence 0 pooled (``row`` None), or
        output row ``row`` (pooling none); ``n`` floats."""
        ptr = (self._lib.llama_get_embeddings_seq(self.ptr, 0) if row is None
               else self._lib.llama_get_embeddings_ith(self.ptr, row))
        if not ptr:
            raise GenieXError(f"the context has no embedding for {'the sequence' if row is None else f'row {row}'}: "
                              f"{library.last_problem()}")
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    def trim(self, p0, seq=0):
        """Forget KV positions >= p0 (rejected drafts, an edited conversation)."""
        if not self.try_trim(p0, seq):
            raise GenieXError(f"could not remove KV positions from {p0}")

    def try_trim(self, p0, seq=0):
        """Like :meth:`trim`, returning False where the memory cannot (a recurrent state
        rolled back further than it keeps snapshots)."""
        return bool(self._lib.llama_memory_seq_rm(self.mem, seq, p0, -1))

    def clear(self, seq=None):
        """Empty the KV cache (``seq``: that sequence's cells only)."""
        if seq is None:
            self._lib.llama_memory_clear(self.mem, True)
        else:
            self._lib.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def save_state(self, seq=0):
        """A sequence's state (its KV cells, a recurrent state) as bytes, to be put back
        by :meth:`load_state` (llama_state_seq_get_data)."""
        size = self._lib.llama_state_seq_get_size(self.ptr, seq)
        buf = (ctypes.c_uint8 * size)()
        written = self._lib.llama_state_seq_get_data(self.ptr, buf, size, seq)
        return bytes(memoryview(buf)[:written])

    def load_state(self, data, seq=0):
        """Put back a state :meth:`save_state` gave (the sequence is emptied first); False
        when the library refused it (the sequence is then empty)."""
        only = seq if self.params.n_seq_max > 1 else None      # alone: the whole cache
        self.clear(only)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if self._lib.llama_state_seq_set_data(self.ptr, buf, len(data), seq) == len(data):
            return True
        self.clear(only)
        return False

    # -- hidden states for MTP/NextN drafting (llama.cpp's private staging API) -------
    def require_nextn(self):
        """LibraryError unless the library exports the hidden-state staging API."""
        self._lib.require("llama_set_embeddings_nextn", "llama_get_embeddings_nextn_ith",
                          capability="MTP drafting (the hidden-state staging API)")

    def stage_nextn(self, on, masked):
        """Make decodes keep the rows an MTP draft reads: ``masked=False`` a row per batch
        token (the target), ``masked=True`` rows for output tokens only (the draft)."""
        if self.ptr:
            self._lib.llama_set_embeddings_nextn(self.ptr, on, masked)

    def copy_nextn_row(self, i, out):
        """Copy hidden-state row ``i`` of the last decode into the float32 numpy row
        ``out`` (no allocation); False where the library has no such row."""
        src = self._lib.llama_get_embeddings_nextn_ith(self.ptr, i)
        if not src:
            return False
        ctypes.memmove(out.ctypes.data, src, out.nbytes)
        return True

    def close(self):
        """Free the context (idempotent)."""
        if getattr(self, "ptr", None):
            self._lib.llama_free(self.ptr)
            self.ptr = None

    __del__ = close
