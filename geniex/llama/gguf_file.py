"""Read a GGUF file's header (metadata and tensor table) and check it before llama.cpp does.

llama.cpp aborts the whole process on some malformed files (a norm weight of the wrong
type, ``block_count = 0``, tensors off ggml's 32-byte alignment, two tokens with one
text, ...), so every file is read and checked here before the library sees it. What is
checked mirrors what b11549 itself assumes, in ``ggml/src/gguf.cpp`` (the container),
``src/llama-model-loader.cpp`` and ``llama_model_base::load_hparams`` (the model), and
``src/llama-vocab.cpp`` (the vocabulary); the first problem found is refused with one
line naming the file (:class:`~geniex.errors.ModelLoadError`).

Every count and length in the file is bounded by the bytes left to hold it before
anything is allocated or looped over, so a hostile file costs at most a pass over its
header. This is a small reader of our own, not ``gguf.GGUFReader``, because that one
decodes every vocabulary string into numpy objects (seconds for a 49k vocab, and
unbounded for a forged length) where we need milliseconds: long arrays are skipped and
kept as their length only.
"""
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from geniex import files
from geniex.errors import ModelLoadError, shown

MAGIC = b"GGUF"
_U64 = struct.Struct("<Q")       # a string's length
T_STRING, T_ARRAY = 8, 9
_SCALARS = {  # gguf value type -> struct format
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<b", 10: "<Q", 11: "<q", 12: "<d",
}
_INTEGERS = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
_TYPE_NAMES = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
               8: "string", 9: "array", 10: "u64", 11: "i64", 12: "f64"}
KEEP_STRINGS = 256     # string arrays longer than this are kept as their length only
KEEP_NUMBERS = 4096    # numeric arrays likewise (per-layer arrays have <= 512 entries)
MAX_STRING = 1 << 24   # one key, value or tensor name; llama.cpp's own limit is 1 GiB

# ggml types of b11549: id -> (name, elements per block, bytes per block). The ids the
# library removed (4, 5, 31-33, 36-38) are absent; tests/llama/test_gguf_validation.py
# checks the table against the library's ggml_blck_size/ggml_type_size.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
F32 = 0
# Types ggml has but no model weight is stored in: the dot-product partners of the
# quantized types (Q8_1, Q8_K) and plain integers. llama.cpp's converters and its
# quantizer never write them, and its CPU matrix kernels abort on some of them.
NOT_WEIGHTS = frozenset((9, 15, 24, 25, 26, 27, 28))
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64         # tensor names are shorter than this (ggml_tensor.name)
TENSOR_ALIGNMENT = 32      # ggml's CPU buffers: tensor data starts on this boundary
DEFAULT_ALIGNMENT = 32
MAX_LAYERS = 512           # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024         # LLAMA_MAX_EXPERTS
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
CLASSIFIER_ACTIVATIONS = ("gelu", "silu", "tanh")
# Architectures that carry no language-model hyperparameters (load_hparams returns early).
NO_HPARAMS = frozenset(("clip",))
# Rules on {arch}.KEY values beyond what load_hparams checks itself: each is a value the
# b11549 library takes as it is and later aborts (or hangs) on, in a ggml kernel or a
# graph builder, rather than refusing at load. KEY -> (test, what the value must be).
# Every float of the architecture must also be finite: NaN fails every comparison these
# asserts make (the norm kernels' ``eps >= 0`` among them), and no converter writes one.
FLOAT_RULES = {
    # ggml-cpu/ops.cpp: norm, rms_norm, group_norm and l2_norm assert eps >= 0.
    "attention.layer_norm_epsilon": (lambda v: v >= 0, "0 or more"),
    "attention.layer_norm_rms_epsilon": (lambda v: v >= 0, "0 or more"),
    "attention.group_norm_epsilon": (lambda v: v >= 0, "0 or more"),
    "hyper_connection.epsilon": (lambda v: v >= 0, "0 or more"),
    # a mixing ratio; the graph asserts ext_factor >= 0 (its -1 "unset" is a context
    # parameter, never a file's value)
    "rope.scaling.yarn_ext_factor": (lambda v: v >= 0, "0 or more"),
}
# Whole numbers the library divides by (a layer's index modulo them, SIGFPE on 0) or
# asserts positive at load: KEY -> the least value.
INT_MINIMUMS = {
    "full_attention_interval": 1,      # hybrids: layer il is recurrent unless (il + 1) % it == 0
    "interleave_moe_layer_step": 1,    # llama4: layer il has experts when (il + 1) % it == 0
    "hrm.h_cycles": 1,                 # load asserts n_hrm_h_cycles > 0
    "hrm.l_cycles": 1,                 # and n_hrm_l_cycles > 0
}
# Gated delta-net hybrids: their graph sizes the convolution state from ssm.inner_size,
# which the loader never compares with the tensors; a mismatch aborts in ggml_concat
# when the context is made (llm_build_delta_net_base::build_conv_state).
DELTA_NET_ARCHS = frozenset(("qwen3next", "qwen35", "qwen35moe"))
# Rotary dimensions, with the key that gives the head width they rotate within. ggml's
# rope kernel asserts an even count no wider than the head, and spins forever on 0.
ROPE_DIMS = (("rope.dimension_count", "attention.key_length"),
             ("rope.dimension_count_swa", "attention.key_length_swa"))
# tokenizer.ggml.model values that make no tokenizer: llama.cpp loads the file, then
# aborts the first time it is asked to turn text into tokens.
NO_TOKENIZER = ("none", "no_vocab")
# Tokenizers whose BOS is "none" unless tokenizer.ggml.bos_token_id names one (llama-vocab's
# defaults per type; SPM, BPE and WPM default to a token): llama.cpp asserts a BOS exists
# when add_bos_token asks for one.
NO_DEFAULT_BOS = ("t5",)
# Bytes a SentencePiece ("llama") tokenizer may have to spell one by one: every byte
# that occurs in UTF-8 text, except the space, which it writes as U+2581 first.
SPM_FALLBACK_BYTES = tuple(b for b in range(0xF5) if b not in (0x20, 0xC0, 0xC1))
_INT64_MAX = (1 << 63) - 1
# Smallest encodings, to bound counts by the bytes left: a key-value pair (key length,
# a 1-byte key, type, a 1-byte value) and a tensor entry (name length, a 1-byte name,
# n_dims, type, offset).
_MIN_KV, _MIN_TENSOR = 8 + 1 + 4 + 1, 8 + 1 + 4 + 4 + 8
_MIN_ELEMENT = {**{t: struct.calcsize(f) for t, f in _SCALARS.items()}, T_STRING: 8}


@dataclass
class TensorInfo:
    """One entry of the tensor table."""

    name: str
    shape: tuple      # ggml order: ne0 first
    type: int
    offset: int       # relative to the data section
    nbytes: int


@dataclass
class GGUFHeader:
    """What a GGUF file says about itself."""

    path: Path
    version: int
    metadata: dict
    tensors: dict = field(default_factory=dict)
    data_offset: int = 0
    types: dict = field(default_factory=dict)     # metadata key -> its GGUF value type
    # SPM_FALLBACK_BYTES with neither a ``<0xNN>`` token nor a one-byte token of their own
    unspelled_bytes: tuple = ()

    @property
    def architecture(self):
        return self.metadata.get("general.architecture", "")

    def arch_key(self, suffix, default=None):
        """``{architecture}.{suffix}``, e.g. ``arch_key('embedding_length')``."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)


class ArrayLength(int):
    """Stands for a long metadata array (e.g. the vocabulary) by its length."""


class _Bad(Exception):
    """A problem with the file; ``truncated`` when bytes ran out rather than made no sense."""

    def __init__(self, problem, truncated=False):
        super().__init__(problem)
        self.truncated = truncated


class _Cursor:
    """Reads the header through a window of the file, never past its end."""

    WINDOW = 1 << 20

    def __init__(self, f, size):
        self.f, self.size = f, size
        self.pos = 0                     # file offset of the next byte
        self._buf, self._base = b"", 0   # self._buf holds the file from self._base on

    @property
    def left(self):
        return self.size - self.pos

    def _have(self, n, what):
        if n > self.left:
            raise _Bad(f"the file ends inside {what}", truncated=True)
        end = self.pos + n
        if end > self._base + len(self._buf) or self.pos < self._base:
            self.f.seek(self.pos)
            self._buf, self._base = self.f.read(max(n, self.WINDOW)), self.pos
            if len(self._buf) < n:
                raise _Bad(f"the file ends inside {what}", truncated=True)

    def take(self, n, what):
        self._have(n, what)
        start = self.pos - self._base
        self.pos += n
        return self._buf[start:start + n]

    def skip(self, n, what):
        if n > self.left:
            raise _Bad(f"the file ends inside {what}", truncated=True)
        self.pos += n

    def unpack(self, fmt, what):
        n = struct.calcsize(fmt)
        self._have(n, what)
        value = struct.unpack_from(fmt, self._buf, self.pos - self._base)[0]
        self.pos += n
        return value

    def length(self, what):
        """A string's byte length, bounded by what is left of the file."""
        n = self.unpack("<Q", what)
        if n > self.left:
            raise _Bad(f"{what} claims {n:,} bytes, more than the {self.left:,} left in the file",
                       truncated=n < 1 << 40)
        return n

    def string(self, what):
        n = self.length(what)
        if n > MAX_STRING:
            raise _Bad(f"{what} is {n:,} bytes long (more than geniex reads: {MAX_STRING:,})")
        return self.take(n, what)

    def text(self, what):
        return self.string(what).decode("utf-8", "replace")

    def strings(self, n, what, keep=True):
        """The bytes of ``n`` consecutive strings, each checked as :meth:`string` checks
        it (``keep=False``: skipped as :meth:`skip` does, no length limit, yielding
        ``b""``). A vocabulary is ~100k of them: those wholly inside the window are
        sliced out here without a method call each (the demo model's header, which every
        load reads, in 55% of the time); a refill or an error goes the long way."""
        unpack_from = _U64.unpack_from
        limit = MAX_STRING if keep else self.size
        buf, base = self._buf, self._base
        for _ in range(n):
            off = self.pos - base
            if 0 <= off and off + 8 <= len(buf):
                length = unpack_from(buf, off)[0]
                end = off + 8 + length
                # The window holds file bytes only: a string inside it is inside the file.
                if length <= limit and end <= len(buf):
                    self.pos = base + end
                    yield buf[off + 8:end] if keep else b""
                    continue
            if keep:
                yield self.string(what)
            else:
                self.skip(self.length(what), what)
                yield b""
            buf, base = self._buf, self._base      # the long way may have moved the window


def _value(cur, vtype, key, tokens):
    """One metadata value. ``tokens``: a set collecting the vocabulary's strings."""
    what = f"the value of {shown(key)}"
    if vtype in _SCALARS:
        value = cur.unpack(_SCALARS[vtype], what)
        return bool(value) if vtype == 7 else value
    if vtype == T_STRING:
        return cur.text(what)
    if vtype != T_ARRAY:
        raise _Bad(f"{shown(key)} has value type {vtype}, which GGUF does not define")
    etype = cur.unpack("<I", what)
    n = cur.unpack("<Q", f"the length of {shown(key)}")
    if etype == T_ARRAY:
        raise _Bad(f"{shown(key)} is an array of arrays (GGUF allows none; nothing in a model is nested)")
    if etype not in _MIN_ELEMENT:
        raise _Bad(f"{shown(key)} is an array of value type {etype}, which GGUF does not define")
    if n * _MIN_ELEMENT[etype] > cur.left:
        raise _Bad(f"{shown(key)} claims {n:,} elements, more than the {cur.left:,} bytes left in the file "
                   "could hold", truncated=n < 1 << 40)
    if etype in _SCALARS:
        if n > KEEP_NUMBERS:
            cur.skip(n * _MIN_ELEMENT[etype], what)
            return ArrayLength(n)
        return [_value(cur, etype, key, None) for _ in range(n)]
    if tokens is not None:
        for i, text in enumerate(cur.strings(n, what)):
            # llama.cpp names an empty token after its index (llama-vocab.cpp), then
            # asserts that no two tokens share a text.
            text = text or f"[EMPTY_{i}]".encode()
            if text in tokens:
                raise _Bad(f"token {i} of {shown(key)} repeats an earlier token's text "
                           f"{shown(text.decode('utf-8', 'replace'))!r} (llama.cpp aborts on that)")
            tokens.add(text)
        return ArrayLength(n)
    if n > KEEP_STRINGS:
        for _ in cur.strings(n, what, keep=False):
            pass
        return ArrayLength(n)
    return [cur.text(what) for _ in range(n)]


def open_regular(path):
    """``path`` opened for binary reading, only if it is a regular file (see
    :func:`geniex.files.open_regular`: a FIFO or device is refused before it can block)."""
    try:
        return files.open_regular(path)
    except FileNotFoundError:
        raise ModelLoadError(f"no such model file: {path}") from None
    except files.NotRegular as e:
        if e.kind == "a folder":
            raise ModelLoadError(f"{path} is a folder, not a model file") from None
        raise ModelLoadError(f"{path} is not a regular file (a pipe, socket or device); refusing to read it") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None


def read_header(path, check_model=True):
    """Parse ``path``'s GGUF header and check it as llama.cpp b11549 would need it.

    The container is always checked (counts, lengths, types, tensor offsets, sizes and
    alignment, all inside the file). With ``check_model`` the file must also be a model
    the library can load without aborting: the architecture's hyperparameters, the
    vocabulary and the types of the tensors element-wise operations read; for a split
    model, every shard is read too, and must say it is that shard of that split. Raises
    ModelLoadError with one line naming the file and the first problem.
    """
    path = Path(path)
    header = _read_one(path)
    if check_model:
        try:
            _check_model(header)
        except _Bad as e:
            raise ModelLoadError(f"{path} is not a usable model: {e}") from None
        shards = _other_shards(header)
        for no, shard in enumerate(shards, 1):
            if not shard.exists():
                raise ModelLoadError(f"{path} is the first of a split model, but its shard {shard.name} is "
                                     "missing next to it")
            try:
                part = _read_one(shard)
                _check_shard(part, no, len(shards) + 1)
                _check_tensor_types(part.tensors.values())
            except _Bad as e:
                raise ModelLoadError(f"{shard} is not a usable model shard: {e}") from None
    return header


def _read_one(path):
    f = open_regular(path)
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            return _parse(f, size, path)
    except _Bad as e:
        if e.truncated:
            raise ModelLoadError(f"{path} is truncated or corrupt: {e}; re-download it") from None
        raise ModelLoadError(f"{path} is not a valid GGUF file: {e}") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None


def _parse(f, size, path):
    """The container checks of ggml/src/gguf.cpp (gguf_init_from_file_impl), plus the
    ones llama.cpp's loader and ggml's CPU buffers rely on afterwards."""
    cur = _Cursor(f, size)
    if size < 4 or cur.take(4, "the magic bytes") != MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF model file (bad magic bytes)")
    version = cur.unpack("<I", "the version")
    if version not in (2, 3):
        raise _Bad(f"GGUF version {version} (llama.cpp reads versions 2 and 3)")
    n_tensors, n_kv = cur.unpack("<q", "the tensor count"), cur.unpack("<q", "the key count")
    if n_tensors < 0 or n_tensors * _MIN_TENSOR > cur.left:
        raise _Bad(f"the header claims {n_tensors:,} tensors, more than the file could describe",
                   truncated=0 <= n_tensors < 1 << 40)
    if n_kv < 0 or n_kv * _MIN_KV > cur.left:
        raise _Bad(f"the header claims {n_kv:,} metadata entries, more than the file could hold",
                   truncated=0 <= n_kv < 1 << 40)
    meta, types, vocabulary = {}, {}, None
    for i in range(n_kv):
        key = cur.text(f"metadata key {i}")
        if not key:
            raise _Bad(f"metadata key {i} is empty")
        if key in meta:
            raise _Bad(f"metadata key {shown(key)} appears twice")
        vtype = cur.unpack("<I", f"the type of {shown(key)}")
        tokens = set() if key == "tokenizer.ggml.tokens" else None
        meta[key] = _value(cur, vtype, key, tokens)
        types[key] = vtype
        if tokens:
            vocabulary = tokens
    align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in meta and types["general.alignment"] != 4:
        raise _Bad(f"general.alignment is a {_TYPE_NAMES.get(types['general.alignment'])}, not a u32")
    if align <= 0 or align & (align - 1):
        raise _Bad(f"general.alignment {align} is not a power of two")
    tensors = {}
    for i in range(n_tensors):
        info = _tensor_info(cur, i)
        if info.name in tensors:
            raise _Bad(f"tensor {shown(info.name)!r} appears twice in the tensor table")
        tensors[info.name] = info
    data_offset = (cur.pos + align - 1) // align * align
    if n_tensors and data_offset > size:
        raise _Bad("the data section would start past the end of the file", truncated=True)
    expected = 0
    for t in tensors.values():
        # gguf.cpp: tensors are stored in table order, each padded to the alignment.
        if t.offset != expected:
            raise _Bad(f"tensor {shown(t.name)!r} has data offset {t.offset:,}; the tensors before it "
                       f"end at {expected:,}")
        expected += (t.nbytes + align - 1) // align * align
        start = data_offset + t.offset
        if start % TENSOR_ALIGNMENT:
            raise _Bad(f"tensor {shown(t.name)!r} starts at file offset {start:,}, not on a "
                       f"{TENSOR_ALIGNMENT}-byte boundary (general.alignment {align})")
        if start + t.nbytes > size:
            raise _Bad(f"its tensors need {start + t.nbytes:,} bytes but the file has {size:,}",
                       truncated=True)
    unspelled = () if vocabulary is None else tuple(
        b for b in SPM_FALLBACK_BYTES if f"<0x{b:02X}>".encode() not in vocabulary and bytes([b]) not in vocabulary)
    return GGUFHeader(path, version, meta, tensors, data_offset, types, unspelled)


def _tensor_info(cur, i):
    name = cur.text(f"the name of tensor {i}")
    if not name:
        raise _Bad(f"tensor {i} has an empty name")
    if len(name.encode()) >= GGML_MAX_NAME:
        raise _Bad(f"tensor {i}'s name {shown(name)!r} is {len(name.encode())} bytes (ggml allows "
                   f"{GGML_MAX_NAME - 1})")
    label = repr(shown(name))
    n_dims = cur.unpack("<I", f"the shape of {label}")
    if n_dims > GGML_MAX_DIMS:
        raise _Bad(f"tensor {label} has {n_dims} dimensions (ggml allows {GGML_MAX_DIMS})")
    shape = tuple(cur.unpack("<q", f"the shape of {label}") for _ in range(n_dims))
    if any(d < 0 for d in shape):
        raise _Bad(f"tensor {label} has a negative dimension {shape}")
    count = 1
    for d in shape:
        count *= d
    if count > _INT64_MAX:
        raise _Bad(f"tensor {label} has {count:,} elements, more than ggml can count")
    ttype = cur.unpack("<i", f"the type of {label}")
    offset = cur.unpack("<Q", f"the offset of {label}")
    known = GGML_TYPES.get(ttype)
    if known is None:
        raise _Bad(f"tensor {label} has type {ttype}, which this llama.cpp (b11549) does not know "
                   "(a newer GGUF, or a corrupt one)")
    tname, block, type_size = known
    if shape and shape[0] % block:
        raise _Bad(f"tensor {label} is {tname} with rows of {shape[0]} elements, not a multiple of "
                   f"its block of {block}")
    return TensorInfo(name, shape, ttype, offset, count // block * type_size)


def _int(meta, key, what=None, required=False):
    """An integer metadata value (None when absent and not ``required``)."""
    value = meta.get(key)
    if value is None:
        if required:
            raise _Bad(f"{what or key} ({key}) is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or isinstance(value, ArrayLength):
        raise _Bad(f"{key} is {_kind(value)}, not a whole number")
    return value


def _per_layer(meta, key, n_layer):
    """A value llama.cpp reads with get_key_or_arr: one number for every layer, or an
    array with one per layer. None when absent."""
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) != n_layer:
            raise _Bad(f"{key} has {len(value)} entries for {n_layer} layers")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise _Bad(f"{key} holds something other than whole numbers >= 0")
        return list(value)
    if isinstance(value, ArrayLength):
        raise _Bad(f"{key} has {int(value):,} entries for {n_layer} layers")
    number = _int(meta, key)
    if number < 0:
        raise _Bad(f"{key} is {number}")
    return [number] * n_layer


def _kind(value):
    if isinstance(value, (list, ArrayLength)):
        return "an array"
    return {str: "text", float: "a fraction", bool: "a true/false value"}.get(type(value), "not a number")


def _check_model(header):
    """What llama.cpp's model loader asserts (aborts on) rather than reports, and the
    values geniex itself computes with, for the header's architecture."""
    meta, arch = header.metadata, header.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _Bad("general.architecture is missing" if arch is None else "general.architecture is not text")
    split_no = _int(meta, "split.no")
    if split_no:
        raise _Bad(f"it is shard {split_no + 1} of a split model; load the first shard (-00001-of-)")
    _check_tensor_types(header.tensors.values())
    _check_vocabulary(meta, header.unspelled_bytes)
    if arch in NO_HPARAMS:
        return
    k = f"{arch}."
    _check_floats(meta, k)
    n_layer = _int(meta, k + "block_count", "the number of layers", required=True)
    if not 1 <= n_layer <= MAX_LAYERS:
        raise _Bad(f"{k}block_count is {n_layer} (llama.cpp needs 1 to {MAX_LAYERS} layers)")
    n_ctx = _int(meta, k + "context_length", "the trained context length", required=True)
    if not 1 <= n_ctx < 1 << 31:
        raise _Bad(f"{k}context_length is {n_ctx} (a positive number of tokens is needed)")
    n_embd = _int(meta, k + "embedding_length", "the embedding width", required=True)
    if not 1 <= n_embd < 1 << 31:
        raise _Bad(f"{k}embedding_length is {n_embd}")
    nextn = _int(meta, k + "nextn_predict_layers") or 0
    if not 0 <= nextn <= n_layer:
        raise _Bad(f"{k}nextn_predict_layers is {nextn}, more than the {n_layer} layers")
    _check_experts(meta, k, n_layer)
    _per_layer(meta, k + "feed_forward_length", n_layer)
    heads = _per_layer(meta, k + "attention.head_count", n_layer) or [0] * n_layer
    kv_heads = _per_layer(meta, k + "attention.head_count_kv", n_layer) or heads
    for il, (h, hkv) in enumerate(zip(heads, kv_heads)):
        if h and (hkv < 1 or h % hkv):
            raise _Bad(f"layer {il} has {h} attention heads and {hkv} KV heads; the KV heads must "
                       "divide the heads")
    key_length = _int(meta, k + "attention.key_length")
    value_length = _int(meta, k + "attention.value_length")
    head_k = None
    if heads[0]:
        for name, given in (("key_length", key_length), ("value_length", value_length)):
            if given is None and n_embd % heads[0]:
                raise _Bad(f"{k}embedding_length {n_embd} is not a multiple of the {heads[0]} attention "
                           f"heads (and no {k}attention.{name} says the head width)")
            if given is not None and given < 1:
                raise _Bad(f"{k}attention.{name} is {given}")
        head_k = key_length if key_length is not None else n_embd // heads[0]
    _check_rope_dims(meta, k, head_k)
    _check_rope_sections(meta, k, head_k)
    for suffix, least in INT_MINIMUMS.items():
        value = _int(meta, k + suffix)
        if value is not None and value < least:
            raise _Bad(f"{shown(k + suffix)} is {value}; it must be at least {least} (llama.cpp aborts on it)")
    if arch in DELTA_NET_ARCHS:
        _check_delta_net(meta, k, header.tensors)
    scaling = meta.get(k + "rope.scaling.type")
    if scaling is not None and scaling not in ROPE_SCALING_TYPES:
        raise _Bad(f"{k}rope.scaling.type {shown(scaling)!r} is none of {', '.join(ROPE_SCALING_TYPES)}")
    activation = meta.get(k + "classifier.activation")
    if activation is not None and activation not in CLASSIFIER_ACTIVATIONS:
        raise _Bad(f"{k}classifier.activation {shown(activation)!r} is none of "
                   f"{', '.join(CLASSIFIER_ACTIVATIONS)}")


def _check_floats(meta, k):
    """Every float of the architecture finite, and those of FLOAT_RULES in range."""
    for key, value in meta.items():
        if not key.startswith(k):
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise _Bad(f"{shown(key)} is {v}, not a finite number")
        rule = FLOAT_RULES.get(key[len(k):])
        if rule is None:
            continue
        test, wanted = rule
        for v in values:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not test(v):
                raise _Bad(f"{shown(key)} is {v}; it must be {wanted} (llama.cpp asserts it is)")


def _check_rope_dims(meta, k, head_k):
    """ggml's rope rotates pairs of dimensions within one head: it asserts an even count
    no wider than the head, and never finishes with 0. ``head_k``: the head width when
    the model has attention heads."""
    for name, width_key in ROPE_DIMS:
        dims = _int(meta, k + name)
        if dims is None:
            continue
        width = _int(meta, k + width_key) or head_k    # the sliding-window head defaults to the other
        if width and dims > width:
            raise _Bad(f"{shown(k + name)} {dims} is wider than an attention head ({width})")
        if dims < 2 or dims % 2:
            raise _Bad(f"{shown(k + name)} is {dims}; llama.cpp rotates an even number of dimensions, "
                       "at least 2 (it aborts or hangs on this one)")


def _check_rope_sections(meta, k, head_k):
    """M-RoPE's sections (text, height, width, extra): ggml's multi-section rope asserts
    that one of the first three is positive and that together they fit in a head."""
    key = k + "rope.dimension_sections"
    value = meta.get(key)
    if value is None:
        return
    if isinstance(value, ArrayLength) or not isinstance(value, (list, int)) or isinstance(value, bool):
        raise _Bad(f"{shown(key)} is {_kind(value)}, not 4 whole numbers")
    sections = value if isinstance(value, list) else [value] * 4
    if len(sections) > 4 or not all(isinstance(v, int) and not isinstance(v, bool) for v in sections):
        raise _Bad(f"{shown(key)} is not up to 4 whole numbers")
    if not any(v > 0 for v in sections[:3]):
        raise _Bad(f"{shown(key)} is {sections}; llama.cpp needs one of the first three above 0 (it aborts on this)")
    if head_k and sum(sections) > head_k:
        raise _Bad(f"{shown(key)} {sections} adds up to {sum(sections)}, more than an attention head ({head_k})")


def _check_delta_net(meta, k, tensors):
    """ssm.inner_size is the width of the linear-attention layers' output projection."""
    inner = _int(meta, k + "ssm.inner_size")
    for name, t in tensors.items():
        if name.startswith("blk.") and name.endswith(".ssm_out.weight") and t.shape and t.shape[0] != inner:
            raise _Bad(f"{shown(k)}ssm.inner_size is {inner}, but tensor {shown(name)!r} is {t.shape[0]} wide")


def _check_experts(meta, k, n_layer):
    """load_hparams' GGML_ASSERTs on the mixture-of-experts counts."""
    n_expert = _int(meta, k + "expert_count") or 0
    used = max(_per_layer(meta, k + "expert_used_count", n_layer) or [0])
    groups = _int(meta, k + "expert_group_count") or 0
    group_used = _int(meta, k + "expert_group_used_count") or 0
    if not 0 <= n_expert <= MAX_EXPERTS:
        raise _Bad(f"{k}expert_count is {n_expert} (llama.cpp allows up to {MAX_EXPERTS})")
    if n_expert == 0:
        if used or groups:
            raise _Bad(f"{k}expert_used_count or expert_group_count is set on a model without experts")
        return
    if not 0 < used <= n_expert:
        raise _Bad(f"{k}expert_used_count {used} must be 1 to the {n_expert} experts")
    if not 0 <= groups < n_expert:
        raise _Bad(f"{k}expert_group_count {groups} must be fewer than the {n_expert} experts")
    if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        raise _Bad(f"{k}expert_group_count {groups} does not divide the {n_expert} experts, or "
                   f"expert_group_used_count {group_used} is not between 1 and it")


def _check_tensor_types(tensors):
    """Types the library's kernels take for what each tensor is used as: element-wise
    operands (1-D tensors: norm weights, biases, scales; and every ``*_norm.weight``)
    must be F32, as llama.cpp's converter always writes them, since ggml's CPU binary
    kernels abort on an F32 activation with another type; weight matrices must be a type
    llama.cpp stores weights in."""
    for t in tensors:
        name, tname = repr(shown(t.name)), GGML_TYPES[t.type][0]
        if (len(t.shape) <= 1 or t.name.endswith("_norm.weight")) and t.type != F32:
            raise _Bad(f"tensor {name} (a norm, bias or scale) is {tname}; llama.cpp needs F32 there")
        if t.type in NOT_WEIGHTS:
            raise _Bad(f"tensor {name} is {tname}, a type no model weight is stored in")


# Special tokens llama.cpp asserts on or emits when out of range (BOS/EOS/SEP added to
# prompts, UNK for what the vocabulary cannot spell). Others out of range (padding, mask,
# end-of-turn, FIM) it just disables, so a file with one still loads.
CHECKED_TOKEN_IDS = ("bos", "eos", "unknown", "seperator")   # (sic: llama.cpp's key)


def _check_vocabulary(meta, unspelled_bytes=()):
    """The vocabulary must exist as text and its special token ids that llama.cpp relies
    on must name tokens: an id out of range becomes 'no token', and tokenizing then
    aborts where the model wants BOS/EOS added. A SentencePiece vocabulary must be able
    to spell every byte of UTF-8 text: llama.cpp falls back to byte tokens for what it
    cannot spell otherwise, and an uncaught exception ends the process where one is
    missing (byte_to_token)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    model = meta.get("tokenizer.ggml.model")
    if (model in NO_DEFAULT_BOS and meta.get("tokenizer.ggml.add_bos_token") is True
            and "tokenizer.ggml.bos_token_id" not in meta):
        raise _Bad(f"tokenizer.ggml.add_bos_token is true, but a {model!r} vocabulary has no BOS token unless "
                   "tokenizer.ggml.bos_token_id names one (llama.cpp aborts on the first prompt)")
    if model == "llama" and unspelled_bytes:
        b = unspelled_bytes[0]
        raise _Bad(f"tokenizer.ggml.model is 'llama' (SentencePiece), but the vocabulary has no token for byte "
                   f"0x{b:02X} (neither <0x{b:02X}> nor the byte itself), and {len(unspelled_bytes) - 1} more; "
                   "llama.cpp aborts on any text it has to spell with them")
    if not isinstance(tokens, (list, ArrayLength)) or (
            isinstance(tokens, list) and not all(isinstance(t, str) for t in tokens)):
        raise _Bad("tokenizer.ggml.tokens is not an array of text")
    n_vocab = len(tokens) if isinstance(tokens, list) else int(tokens)
    if n_vocab < 1:
        raise _Bad("tokenizer.ggml.tokens is empty")
    for name in CHECKED_TOKEN_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        value = _int(meta, key)
        if value is not None and not 0 <= value < n_vocab:
            raise _Bad(f"{key} is {value}, but the vocabulary has {n_vocab:,} tokens")


def _check_shard(part, no, count):
    """Shard ``no`` (counted from 0) of a split into ``count`` files says so, as
    llama-gguf-split and gguf-py write it: ``split.no`` and ``split.count``, both u16.
    llama.cpp refuses a shard whose ``split.no`` is missing or another number, and aborts
    on one that is not a u16 (gguf_get_val_u16 asserts the type). ``split.count`` it does
    not read from these shards; checked all the same, so that a shard of another split
    that has the same name (another conversion, another shard count) is refused."""
    meta = part.metadata
    for key in ("split.no", "split.count"):
        if key not in meta:
            raise _Bad(f"{key} is missing (every shard of a split model has it)")
        if part.types[key] != 2:
            raise _Bad(f"its {key} is a {_TYPE_NAMES.get(part.types[key])}, not the u16 llama-gguf-split writes")
    if meta["split.no"] != no:
        raise _Bad(f"its split.no makes it shard {meta['split.no'] + 1} of the split, not shard {no + 1} as "
                   "its name says")
    if meta["split.count"] != count:
        raise _Bad(f"its split.count is {meta['split.count']}, but the first shard's is {count}: it belongs "
                   "to another split")


def shard_files(header):
    """Every file of the model ``header`` was read from: that file and, for the first
    shard of a split model, the other shards :func:`read_header` checked with it."""
    return [header.path, *_other_shards(header)]


def check_tokenizer(header):
    """Raise ModelLoadError unless ``header``'s model can turn text into tokens, as the
    model geniex answers with must: llama.cpp loads a file whose tokenizer.ggml.model is
    'none' (an MTP draft's), then aborts the first time it tokenizes."""
    model = header.metadata.get("tokenizer.ggml.model")
    if model in NO_TOKENIZER:
        raise ModelLoadError(f"{header.path} is not a usable model: tokenizer.ggml.model is {model!r}, no "
                             "tokenizer, so it cannot read a prompt (llama.cpp aborts on the first one); "
                             "such a file is only a draft model")


def _other_shards(header):
    """The other files of a split model (``NAME-00001-of-00003.gguf``: llama.cpp opens
    ``NAME-0000i-of-00003.gguf`` for each i), so they are checked before it does."""
    count = _int(header.metadata, "split.count") or 0
    if count <= 1:
        return []
    name = header.path.name
    suffix = f"-00001-of-{count:05d}.gguf"
    if not name.endswith(suffix):
        raise ModelLoadError(f"{header.path} is the first of {count} shards but is not named *{suffix}")
    stem = name[:-len(suffix)]
    return [header.path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(2, count + 1)]
