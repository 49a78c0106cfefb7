"""Copy a GGUF file with metadata keys set and tensors left out, without decoding it.

gguf-py's reader turns every vocabulary string into a numpy object and its writer packs
them back one by one: seconds per copy of the demo model's 49k-entry vocabulary, for
copies that change one key. Here the header is walked once (lengths only), the key/value
records are copied as raw bytes except the keys being set, and the tensor data is copied
as it lies: a copy costs what writing its bytes costs.

    edit(src, dst, keys={"tokenizer.chat_template": "..."})            # metadata only
    edit(src, dst, keys={"llama.block_count": 4}, keep=lambda name: ...)  # fewer tensors
"""
import os
import struct
from pathlib import Path

from geniex.llama.gguf_file import GGML_TYPES

T_STRING, T_ARRAY, T_UINT32 = 8, 9, 4
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_SIZE = {t: struct.calcsize(f) for t, f in _SCALAR.items()}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
ALIGNMENT = 32          # general.alignment's default


def _string_end(buf, off):
    return off + 8 + _U64.unpack_from(buf, off)[0]


def _value_end(buf, off, vtype):
    """Where the value of type ``vtype`` starting at ``off`` ends."""
    if vtype == T_STRING:
        return _string_end(buf, off)
    if vtype != T_ARRAY:
        return off + _SIZE[vtype]
    etype, count = _U32.unpack_from(buf, off)[0], _U64.unpack_from(buf, off + 4)[0]
    off += 12
    if etype in _SIZE:
        return off + count * _SIZE[etype]
    for _ in range(count):
        off = _value_end(buf, off, etype)
    return off


def _string(text):
    raw = text.encode()
    return _U64.pack(len(raw)) + raw


def _record(key, value, vtype):
    """One key/value record: ``value`` written as ``vtype`` (a string or a scalar type)."""
    if vtype == T_STRING:
        return _string(key) + _U32.pack(T_STRING) + _string(value)
    return _string(key) + _U32.pack(vtype) + struct.pack(_SCALAR[vtype], value)


def _nbytes(dims, ggml_type):
    _, block, size = GGML_TYPES[ggml_type]
    n = 1
    for d in dims:
        n *= d
    return n // block * size


def edit(src, dst, keys=None, keep=None, convert=None):
    """Write ``dst``: ``src`` with the metadata ``keys`` set (``{name: value}``; a key the
    file has keeps its type, a new one is a string or a uint32) and only the tensors
    whose names ``keep(name)`` accepts (all without ``keep``). ``convert(name, dims,
    ggml_type)`` may return a function that takes the tensor's bytes and returns ``(new
    type, new bytes)`` (same dims); other tensors are copied as they are. Written under a
    temporary name and renamed; returns ``dst``."""
    src, dst = Path(src), Path(dst)
    keys = dict(keys or {})
    with open(src, "rb") as f:
        head = f.read(min(os.path.getsize(src), 64 << 20))
    if head[:4] != b"GGUF":
        raise ValueError(f"{src} is not a GGUF file")
    version = _U32.unpack_from(head, 4)[0]
    n_tensors, n_kv = _U64.unpack_from(head, 8)[0], _U64.unpack_from(head, 16)[0]
    off, records, alignment = 24, [], ALIGNMENT
    for _ in range(n_kv):
        start = off
        key_end = _string_end(head, off)
        key = head[off + 8:key_end].decode()
        vtype = _U32.unpack_from(head, key_end)[0]
        off = _value_end(head, key_end + 4, vtype)
        if key == "general.alignment":
            alignment = _U32.unpack_from(head, key_end + 4)[0]
        records.append(_record(key, keys.pop(key), vtype) if key in keys else head[start:off])
    records += [_record(k, v, T_STRING if isinstance(v, str) else T_UINT32) for k, v in keys.items()]
    tensors = []                                 # (name, dims, type, old offset)
    for _ in range(n_tensors):
        name_end = _string_end(head, off)
        name = head[off + 8:name_end].decode()
        n_dims = _U32.unpack_from(head, name_end)[0]
        dims = struct.unpack_from(f"<{n_dims}Q", head, name_end + 4)
        at = name_end + 4 + 8 * n_dims
        ggml_type, offset = _U32.unpack_from(head, at)[0], _U64.unpack_from(head, at + 4)[0]
        off = at + 12
        if keep is None or keep(name):
            tensors.append((name, dims, ggml_type, offset))
    data_start = -(-off // alignment) * alignment
    pad = lambda n: b"\0" * (-n % alignment)      # noqa: E731 (bytes up to the next boundary)
    infos, placed, at = [], [], 0
    with open(src, "rb") as fin:
        for name, dims, ggml_type, offset in tensors:
            size = _nbytes(dims, ggml_type)
            change = convert(name, dims, ggml_type) if convert is not None else None
            if change is not None:          # converted now: its size is the new type's
                fin.seek(data_start + offset)
                ggml_type, raw = change(fin.read(size))
                size = len(raw)
            infos.append(_string(name) + _U32.pack(len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
                         + _U32.pack(ggml_type) + _U64.pack(at))
            placed.append(raw if change is not None else (data_start + offset, size))
            at += size + (-size % alignment)
    header = b"".join([b"GGUF", _U32.pack(version), _U64.pack(len(tensors)), _U64.pack(len(records)),
                       *records, *infos])
    tmp = dst.with_name(dst.name + ".part")
    with open(src, "rb") as fin, open(tmp, "wb") as out:
        out.write(header + pad(len(header)))
        for where in placed:
            if isinstance(where, bytes):
                out.write(where + pad(len(where)))
                continue
            source, size = where
            fin.seek(source)
            out.write(fin.read(size))
            out.write(pad(size))
    os.replace(tmp, dst)
    return dst
