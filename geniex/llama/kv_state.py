"""A sequence's KV state as the library saves it, and turning F16 cells into quantized ones.

geniex reads prompts in a context of its own with an F16 KV cache, where ggml-cpu's
tiled flash-attention kernel reads them 1.7x faster than with the quantized cache the
answer decodes on (geniex.engine.prompt_reader says why both). What that context wrote
is moved into the target's cache through the library's own sequence state
(``llama_state_seq_get_data``/``set_data``): this module reads such a state and writes
one with the K and V rows stored as the target stores them.

The state of one sequence of a plain KV cache (llama.cpp b11549, ``llama_kv_cache::
state_write``), little-endian, as measured on this build::

    u64 magic | u32 n_stream | per stream: u32 n_cells,
      per cell: i32 pos, u32 n_seq_id, n_seq_id x i32 seq_id
      u32 v_trans | u32 n_layer | u32 k_rotation | u32 v_rotation
      per layer: i32 k_type, u64 k_row_bytes, n_cells rows
      per layer: i32 v_type, u64 v_row_bytes, n_cells rows      (v_trans == 0)

A quantized cache of this build stores K and V rotated by a normalized Walsh-Hadamard
transform of ``k_rotation``/``v_rotation`` elements (the attention rotates the query and
the output to match); an F16 cache stores them as computed (rotation 0). So a cell moves
over as ``quantize(H @ f16)``, in float32 by butterflies whose result does not depend on
how many rows are turned at once. The quantizer is the library's (``ggml_quantize_chunk``).
Anything else in the state (a sliding-window cache's second part, recurrent state, cell
extensions of multi-axis RoPE) does not parse as above, and :func:`parse` says so.
"""
import ctypes
import struct
from dataclasses import dataclass, field

import numpy as np

from geniex.llama.cache_types import F16

_HEAD = struct.Struct("<QI")          # magic, n_stream
_U32 = struct.Struct("<I")
_CELL = struct.Struct("<iI")          # pos, n_seq_id
_DATA = struct.Struct("<IIII")        # v_trans, n_layer, k_rotation, v_rotation
_LAYER = struct.Struct("<iQ")         # type, row bytes


class StateFormatError(ValueError):
    """A state that is not one stream of a plain KV cache in the layout above."""


@dataclass
class Rows:
    """One layer's K or V rows: ggml type, bytes per row, the rows (n_cells x row bytes)."""
    type: int
    row_bytes: int
    data: np.ndarray                  # uint8, shape (n_cells, row_bytes)


@dataclass
class SeqState:
    """A parsed sequence state: the bytes up to the data section (magic, cells), the
    positions held, the rotations, and every layer's K and V rows."""
    head: bytes
    tail: bytes                       # the other streams' empty cell counts after this one
    positions: np.ndarray
    rot_k: int
    rot_v: int
    k: list = field(default_factory=list)
    v: list = field(default_factory=list)

    @property
    def n_cells(self):
        return len(self.positions)


def parse(blob):
    """The :class:`SeqState` of ``blob`` (bytes from ``llama_state_seq_get_data`` of one
    sequence); StateFormatError when it is not laid out as a plain KV cache's."""
    if len(blob) < _HEAD.size:
        raise StateFormatError("the state is shorter than its header")
    _, n_stream = _HEAD.unpack_from(blob, 0)
    o = _HEAD.size
    found, data_end = None, 0
    for _ in range(n_stream):
        (n_cells,) = _U32.unpack_from(blob, o)
        o += 4
        if not n_cells:
            continue
        if found is not None:
            raise StateFormatError("the state holds more than one stream")
        positions = np.empty(n_cells, np.int32)
        for i in range(n_cells):
            pos, n_seq = _CELL.unpack_from(blob, o)
            positions[i] = pos
            o += _CELL.size + 4 * n_seq
        head_end = o
        v_trans, n_layer, rot_k, rot_v = _DATA.unpack_from(blob, o)
        o += _DATA.size
        if v_trans:
            raise StateFormatError("the V cache is transposed (flash attention off)")
        state = SeqState(blob[:head_end], b"", positions, rot_k, rot_v)
        for part in (state.k, state.v):
            for _ in range(n_layer):
                typ, row_bytes = _LAYER.unpack_from(blob, o)
                o += _LAYER.size
                size = n_cells * row_bytes
                if o + size > len(blob):
                    raise StateFormatError("the state ends inside a layer's rows")
                part.append(Rows(typ, row_bytes, np.frombuffer(blob, np.uint8, size, o).reshape(n_cells, row_bytes)))
                o += size
        found, data_end = state, o
    if o != len(blob):
        raise StateFormatError(f"{len(blob) - o} bytes after the KV cells (not a plain KV cache)")
    if found is None:
        raise StateFormatError("the state holds no cells")
    found.tail = blob[data_end:]
    return found


def hadamard(x, n):
    """``x`` (float32, rows of a multiple of ``n`` elements) with each ``n``-element group
    multiplied by the normalized Walsh-Hadamard matrix of order ``n`` (a power of two),
    in place; returns ``x``."""
    groups = x.reshape(-1, n)
    h = 1
    while h < n:
        pairs = groups.reshape(groups.shape[0], -1, 2, h)
        a = pairs[:, :, 0, :].copy()
        b = pairs[:, :, 1, :]
        pairs[:, :, 0, :] += b
        np.subtract(a, b, out=pairs[:, :, 1, :])
        h *= 2
    groups *= np.float32(1.0 / np.sqrt(n))    # n is 4**k or 2*4**k: 1/sqrt(n) is exact for 4**k
    return x


def can_rotate(rows, n):
    """Whether rows of ``rows`` elements can take a rotation of order ``n``."""
    return n == 0 or (n > 0 and n & (n - 1) == 0 and rows % n == 0)


class Converter:
    """Turns the F16 rows of a :class:`SeqState` into another cache's types and rotations
    (``type_k``/``type_v`` ggml type ids, ``rot_k``/``rot_v`` as its states say), with the
    library ``lib``'s quantizer."""

    def __init__(self, lib, type_k, type_v, rot_k, rot_v):
        self._lib = lib
        self.type_k, self.type_v, self.rot_k, self.rot_v = type_k, type_v, rot_k, rot_v

    def rows(self, src, typ, rot):
        """``src`` (F16 :class:`Rows`) as rows of ``typ`` rotated by ``rot``."""
        if src.type != F16:
            raise StateFormatError(f"a layer's rows are of ggml type {src.type}, not F16")
        n = src.row_bytes // 2
        if not can_rotate(n, rot):
            raise StateFormatError(f"rows of {n} elements cannot take a rotation of {rot}")
        values = src.data.view(np.float16).astype(np.float32)
        if rot:
            hadamard(values, rot)
        row_bytes = self._lib.ggml_row_size(typ, n)
        out = np.empty((len(values), row_bytes), np.uint8)
        written = self._lib.ggml_quantize_chunk(typ, values.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                                out.ctypes.data, 0, len(values), n, None)
        if written != out.nbytes:
            raise StateFormatError(f"the quantizer wrote {written} bytes, not {out.nbytes}")
        return Rows(typ, row_bytes, out)

    def convert(self, f16, kept=None, keep=0):
        """The state bytes holding ``f16``'s cells (an F16 :class:`SeqState`) in this
        converter's types: rows below ``keep`` are copied from ``kept`` (a state of the
        target holding them already), the rest are turned."""
        keep = min(keep, f16.n_cells) if kept is not None else 0
        if keep and (kept.n_cells < keep or not np.array_equal(kept.positions[:keep], f16.positions[:keep])):
            raise StateFormatError("the kept state does not hold the same positions")
        out = [f16.head, _DATA.pack(0, len(f16.k), self.rot_k, self.rot_v)]
        for layers, kept_layers, typ, rot in ((f16.k, kept and kept.k, self.type_k, self.rot_k),
                                              (f16.v, kept and kept.v, self.type_v, self.rot_v)):
            for i, src in enumerate(layers):
                new = self.rows(Rows(src.type, src.row_bytes, src.data[keep:]), typ, rot)
                out.append(_LAYER.pack(typ, new.row_bytes))
                if keep:
                    old = kept_layers[i]
                    if old.type != typ or old.row_bytes != new.row_bytes:
                        raise StateFormatError("the kept state's rows are of other types")
                    out.append(old.data[:keep].tobytes())
                out.append(new.data.tobytes())
        out.append(f16.tail)
        return b"".join(out)
